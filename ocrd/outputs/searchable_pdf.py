"""One document's searchable PDF, from its first page to the file in the outbox.

The converter hands every finished page to `SearchablePdf.page` (its text layer is built
at once, ocrd/outputs/textlayer.py, and only the compressed layer is kept), and calls `write`
after the last page, before the sidecar and the Markdown are written. Writing the PDF
may fail because of the PDF (one that qpdf cannot rewrite …): that costs the PDF, never
the Markdown — `write` reports it as `pdf_failed` for the sidecar and the metrics. A
failure that is not the file's (the outbox full or read-only for a while, no descriptor
to spare: errors.NOT_NOW) is raised instead, as it is for the Markdown: the whole file
waits and is written, PDF and all, when the outbox takes files again.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import structlog

from ocrd import errors, safefs
from ocrd.outputs import destinations, textpdf
from ocrd.outputs.page import PageOutput
from ocrd.outputs.textlayer import FontMap, PageLayer, page_layer

log = structlog.get_logger("ocrd.outputs.searchable_pdf")

DEFAULT_SUFFIX = ".pdf"
# `ocrd convert --pdf` of a PDF into the folder it is in
BESIDE_ORIGINAL_SUFFIX = ".ocr.pdf"


@dataclass(frozen=True)
class PdfSettings:
    """What an inbox (or `ocrd convert --pdf`) asks for."""

    text_layer: str = "skip_if_text"  # replace | add | skip_if_text
    suffix: str = DEFAULT_SUFFIX


def pdf_name(base: str, suffix: str) -> str:
    return destinations.fit_name(base, suffix)


class SearchablePdf:
    def __init__(self, settings: PdfSettings, pages: int, grounding: bool) -> None:
        self.settings = settings
        self.grounding = grounding
        self.fonts = FontMap()
        self.layers: list[PageLayer | None] = [None] * pages
        self.written: str | None = None  # the name, once in the outbox
        self.failed: str | None = None
        self.pages: list[str] = []  # per page: what the layer did (textpdf.decide)

    def page(self, index: int, out: PageOutput, width: int, height: int) -> None:
        self.layers[index] = page_layer(self.fonts, out, width, height, self.grounding)

    def write(self, folder: safefs.Dir, base: str, source: str, kind: str,
              perms: destinations.Perms, existing: list[int] | None, log_: Any = log) -> None:
        """Write BASE+suffix into folder from the document open at `source` (a
        /proc/self/fd path); a failure of the PDF is recorded, not raised; one of the
        outbox or the daemon (errors.NOT_NOW) is raised."""
        name = pdf_name(base, self.settings.suffix)
        layers = [layer or PageLayer("none", b"", 0) for layer in self.layers]

        def fill(out: Any) -> None:
            with open(source, "rb") as src:
                if kind == "pdf":
                    self.pages = textpdf.write_pdf_layers(
                        src, out, layers, self.fonts, self.settings.text_layer, existing)
                else:
                    self.pages = textpdf.write_image_layers(src, out, layers, self.fonts)

        try:
            destinations.write_atomic_with(folder, name, fill, perms)
        except Exception as e:  # noqa: BLE001 - any failure costs the PDF, not the Markdown
            if _not_now(e):
                raise
            self.failed = _message(e)
            self.pages = []
            log_.warning("pdf_failed", output=name, error=self.failed)
            return
        self.written = name

    def discard(self, folder: safefs.Dir) -> None:
        """Remove the PDF this run wrote (the Markdown could not be written after all)."""
        if self.written is not None:
            try:
                folder.unlink(self.written)
            except OSError:
                pass
            self.written = None

    def outputs(self) -> dict[str, Any]:
        return {"pdf": self.written, "pdf_failed": self.failed}

    def page_meta(self, index: int) -> dict[str, Any]:
        """The page's `text_layer` for the sidecar: how its text was placed (words,
        blocks, page: one box over the page for lack of geometry) and what happened
        to it (none, kept_existing, replaced)."""
        layer = self.layers[index]
        done = self.pages[index] if self.written and index < len(self.pages) else "none"
        return {"placement": layer.placement if layer is not None else "none",
                "layer": done}


def _not_now(e: BaseException) -> bool:
    """A failure of the destination or the daemon, also where qpdf reports one that it
    met while writing (its exception's cause or context)."""
    seen = 0
    while e is not None and seen < 5:
        if errors.not_now(e):
            return True
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
        seen += 1
    return False


def _message(e: BaseException) -> str:
    if isinstance(e, OSError):
        return f"the PDF could not be written: {e.strerror or e}"
    text = str(e).strip().splitlines()
    # qpdf names the input it read: here a descriptor's stream, of no use to a reader
    detail = re.sub(r"^stream <[^>]*>\s*", "", text[0]) if text else type(e).__name__
    return f"the PDF could not be made ({type(e).__name__}: {detail[:300]})"


def same_folder(folder: safefs.Dir, path: str) -> bool:
    """Whether `path` (a file given to `ocrd convert`) lies in `folder`."""
    try:
        st = os.stat(os.path.dirname(os.path.abspath(path)) or ".")
    except OSError:
        return False
    here = os.fstat(folder.fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


async def finish(pdf: SearchablePdf, pool: Any, source: str, kind: str,
                 folder: safefs.Dir, base: str, perms: destinations.Perms, metrics: Any,
                 log_: Any = log) -> None:
    """After the last page: count the text a PDF's pages already have (skip_if_text;
    in a render worker, PDFium is not thread-safe), then write the PDF off the loop."""
    import asyncio

    existing = None
    if kind == "pdf" and pdf.settings.text_layer == "skip_if_text":
        try:
            existing = await pool.call(textpdf.text_chars, source)
        except Exception as e:  # noqa: BLE001 - unknown: the layer is added
            log_.info("pdf_text_count_failed", error=str(e))
    # Cancelled (the daemon stops) while the thread writes: let it finish, so that the
    # caller's discard removes the PDF instead of a late rename leaving it behind.
    writing = asyncio.ensure_future(asyncio.to_thread(pdf.write, folder, base, source,
                                                      kind, perms, existing, log_))
    try:
        await asyncio.shield(writing)
    except asyncio.CancelledError:
        await asyncio.wait({writing})
        raise
    if pdf.failed is not None and metrics is not None:
        metrics.pdf_failures.inc()
