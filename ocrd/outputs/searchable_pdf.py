"""The searchable PDF: the original with an invisible text layer from the engine's
geometry (an output writer, outputs: pdf; writers.py says how writers work).

Every finished page's text layer is built at once (textlayer.py) and only the compressed
layer is kept; after the last page the original is copied with the layers laid over its
pages (textpdf.py). A PDF whose pages already have text keeps them as they are, or gets
the layer too, as `pdf_text_layer` says.
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO

import structlog

from ocrd import safefs
from ocrd.outputs import textpdf
from ocrd.outputs.page import PageOutput
from ocrd.outputs.textlayer import FontMap, PageLayer, page_layer
from ocrd.outputs.writers import Document, OutputSettings, Writer
from ocrd.render.pixels import RenderedPage

log = structlog.get_logger("ocrd.outputs.searchable_pdf")

DEFAULT_SUFFIX = ".pdf"
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

    @property
    def suffix(self) -> str:
        return self.settings.pdf_suffix

    def page(self, index: int, out: PageOutput, rendered: RenderedPage) -> None:
        self.layers[index] = page_layer(self.fonts, out, rendered.width, rendered.height,
                                        self.grounding)

    async def prepare(self, doc: Document, workers: Any) -> None:
        """Count the text a PDF's pages already have (skip_if_text), in a render worker."""
        self.existing = None
        if doc.kind == "pdf" and self.settings.pdf_text_layer == "skip_if_text":
            try:
                self.existing = await workers.call(textpdf.text_chars, doc.source)
            except Exception as e:  # noqa: BLE001 - unknown: the layer is added
                log.info("pdf_text_count_failed", error=str(e))

    def fill(self, out: BinaryIO, doc: Document) -> None:
        layers = [layer or PageLayer("none", b"", 0) for layer in self.layers]
        self.done = []
        with open(doc.source, "rb") as src:
            if doc.kind == "pdf":
                self.done = textpdf.write_pdf_layers(
                    src, out, layers, self.fonts, self.settings.pdf_text_layer, self.existing)
            else:
                self.done = textpdf.write_image_layers(src, out, layers, self.fonts)

    def page_meta(self, index: int) -> dict[str, Any]:
        """The page's `text_layer` for the sidecar: how its text was placed (words,
        blocks, page: one box over the page for lack of geometry) and what happened
        to it (none, kept_existing, replaced)."""
        layer = self.layers[index]
        done = self.done[index] if self.written and index < len(self.done) else "none"
        return {"text_layer": {"placement": layer.placement if layer is not None else "none",
                               "layer": done}}


def same_folder(folder: safefs.Dir, path: str) -> bool:
    """Whether `path` (a file given to `ocrd convert`) lies in `folder`."""
    try:
        st = os.stat(os.path.dirname(os.path.abspath(path)) or ".")
    except OSError:
        return False
    here = os.fstat(folder.fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)
