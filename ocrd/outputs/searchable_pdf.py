"""The searchable PDF: the original with an invisible text layer from the engine's
geometry (an output writer, outputs: pdf; writers.py says how writers work).

Every finished page's text layer is built at once (textlayer.py) and only the compressed
layer is kept; after the last page the original is copied with the layers laid over its
pages (textpdf.py). A PDF whose pages already have text keeps them as they are, or gets
the layer too, as `pdf_text_layer` says.

A PDF whose pages render but that qpdf cannot rewrite (a page tree with a loop, no
/Root, an encrypted attachment) still gets its searchable PDF: made from its pages,
rendered again one at a time in a render worker while the file is written, each with its
text layer (the sidecar's `outputs.pdf_rebuilt` says so and why). Per page only its size
is kept for that, never its pixels.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any, BinaryIO

import structlog

from ocrd import errors, safefs
from ocrd.outputs import textpdf
from ocrd.outputs.page import PageOutput
from ocrd.outputs.textlayer import FontMap, PageLayer, page_layer
from ocrd.outputs.writers import Document, OutputSettings, Writer
from ocrd.render import pages
from ocrd.render.pixels import RenderedPage

log = structlog.get_logger("ocrd.outputs.searchable_pdf")

DEFAULT_SUFFIX = ".pdf"
# A page of no known size (it never rendered): A4, in points.
A4_POINTS = (595.0, 842.0)
# Seconds one page may take to render again for a PDF made from the rendered pages.
PAGE_IMAGE_SECONDS = 300.0
# `ocrd convert --pdf` of a PDF into the folder it is in
BESIDE_ORIGINAL_SUFFIX = ".ocr.pdf"


class SearchablePdf(Writer):
    name = "pdf"
    title = "the searchable PDF"

    def __init__(self, settings: OutputSettings, pages: int, engine_format: str) -> None:
        super().__init__(settings, pages, engine_format)
        self.grounding = engine_format == "grounding"
        self.fonts = FontMap()
        self.layers: list[PageLayer | None] = [None] * pages
        self.existing: list[int] | None = None  # characters each page has (skip_if_text)
        self.done: list[str] = []  # per page: what the layer did (textpdf.decide)
        # per page: its size in points as rendered (for a PDF made from the pages)
        self.sizes: list[tuple[float, float] | None] = [None] * pages
        self.rebuilt: str | None = None  # why the PDF was made from the rendered pages
        # renders page i again for that, from the writing thread (set by prepare)
        self._page_image: Callable[[int], textpdf.PageImage | None] | None = None

    @property
    def suffix(self) -> str:
        return self.settings.pdf_suffix

    def page(self, index: int, out: PageOutput, rendered: RenderedPage) -> None:
        self.layers[index] = page_layer(self.fonts, out, rendered.width, rendered.height,
                                        self.grounding)
        if rendered.dpi:
            self.sizes[index] = (rendered.width * 72 / rendered.dpi,
                                 rendered.height * 72 / rendered.dpi)

    async def prepare(self, doc: Document, workers: Any) -> None:
        """Count the text a PDF's pages already have (skip_if_text), in a render worker;
        and ready the pages to be rendered again, should the original not be rewritable."""
        self.existing = None
        self.rebuilt = None
        self._page_image = None
        if doc.kind != "pdf":
            return
        if self.settings.pdf_text_layer == "skip_if_text":
            try:
                self.existing = await workers.call(textpdf.text_chars, doc.source)
            except Exception as e:  # noqa: BLE001 - unknown: the layer is added
                log.info("pdf_text_count_failed", error=str(e))
        if workers is not None and doc.info is not None:
            self._page_image = _renderer(workers, doc, asyncio.get_running_loop())

    def fill(self, out: BinaryIO, doc: Document) -> None:
        layers = [layer or PageLayer("none", b"", 0) for layer in self.layers]
        self.done = []
        with open(doc.source, "rb") as src:
            if doc.kind != "pdf":
                self.done = textpdf.write_image_layers(src, out, layers, self.fonts)
                return
            try:
                self.done = textpdf.write_pdf_layers(
                    src, out, layers, self.fonts, self.settings.pdf_text_layer, self.existing)
                return
            except Exception as e:  # noqa: BLE001 - the original refused: its pages may not
                if errors.not_now(e) or self._page_image is None:
                    raise
                why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        self.rebuilt = _without_stream_name(why)[:300]
        log.info("pdf_from_rendered_pages", file=doc.name, why=self.rebuilt)
        out.seek(0)
        out.truncate()
        self.done = textpdf.write_rendered_pages(out, doc.pages, self._size, self._page_image,
                                                 layers, self.fonts)

    def _size(self, index: int) -> tuple[float, float]:
        """Page `index`'s size in points: as rendered, else the last known one, else A4."""
        known = [s for s in self.sizes[:index + 1] if s is not None] or \
            [s for s in self.sizes if s is not None]
        return known[-1] if known else A4_POINTS

    def outputs(self) -> dict[str, str | None]:
        """With the file's name and why it is missing: why it was made from the
        rendered pages (`pdf_rebuilt`), when it was."""
        if self.written and self.rebuilt:
            return {**super().outputs(), f"{self.name}_rebuilt": self.rebuilt}
        return super().outputs()

    def page_meta(self, index: int) -> dict[str, Any]:
        """The page's `text_layer` for the sidecar: how its text was placed (words,
        blocks, page: one box over the page for lack of geometry) and what happened
        to it (none, kept_existing, replaced)."""
        layer = self.layers[index]
        done = self.done[index] if self.written and index < len(self.done) else "none"
        return {"text_layer": {"placement": layer.placement if layer is not None else "none",
                               "layer": done}}


def _renderer(workers: Any, doc: Document, loop: asyncio.AbstractEventLoop
              ) -> Callable[[int], textpdf.PageImage | None]:
    """Page i rendered again as a JPEG in a render worker, asked for from the thread that
    writes the PDF (the event loop runs the call); None for a page that does not render."""

    def page_image(index: int) -> textpdf.PageImage | None:
        call = workers.call(pages.page_image, doc.source, doc.info, index)
        try:
            return asyncio.run_coroutine_threadsafe(call, loop).result(PAGE_IMAGE_SECONDS)
        except errors.OcrdError as e:
            log.info("pdf_page_not_rendered", file=doc.name, page=index + 1, error=str(e))
            return None

    return page_image


def _without_stream_name(text: str) -> str:
    """qpdf's message without the name of the stream it read (a descriptor's path)."""
    import re

    return re.sub(r"^(stream )?<[^>]*>\s*(\([^)]*\))?:?\s*|^/proc/self/fd/\d+\s*(\([^)]*\))?:?\s*",
                  "", text)


def same_folder(folder: safefs.Dir, path: str) -> bool:
    """Whether `path` (a file given to `ocrd convert`) lies in `folder`."""
    try:
        st = os.stat(os.path.dirname(os.path.abspath(path)) or ".")
    except OSError:
        return False
    here = os.fstat(folder.fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)
