"""The outputs a document gets besides its Markdown and sidecar — the searchable PDF
(searchable_pdf.py), hOCR (hocr.py), or a writer of one's own — behind one interface
(`Writer`), named in an inbox's `outputs` (config/settings.py's WRITERS, or a class path
`package.module:Class`).

A writer sees every page as it finishes (`page`: keep little, as the searchable PDF's
compressed text layer), then writes its one file into the outbox after the last page
and before the sidecar and the Markdown (`write`, in a thread, atomically). Its failure
costs its own file only: the sidecar says why (`outputs.NAME_failed`), the log says
`output_failed` and `ocrd_output_failures_total{output=NAME}` counts it — except a
failure of the outbox or the daemon (errors.NOT_NOW: a full disk, no descriptor to
spare), which is raised: then the whole document waits and is written again later.
"""

from __future__ import annotations

import abc
import asyncio
import re
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar, Protocol

import structlog

from ocrd import errors, safefs
from ocrd.config.settings import WRITERS, ConfigError
from ocrd.outputs import destinations
from ocrd.outputs.page import PageOutput
from ocrd.render.pixels import RenderedPage

log = structlog.get_logger("ocrd.outputs.writers")


class OutputSettings(Protocol):
    """What a writer may read of what it is asked for: an inbox's settings
    (config/settings.py's InboxConfig), or those of `ocrd convert`."""

    pdf_text_layer: str
    pdf_suffix: str


@dataclass(frozen=True)
class Settings:
    """OutputSettings of their own (`ocrd convert`'s), defaults as an inbox's."""

    pdf_text_layer: str = "skip_if_text"
    pdf_suffix: str = ".pdf"


@dataclass(frozen=True)
class Document:
    """What a writer needs of the document, when it writes: the original (a
    /proc/self/fd path of the open file, read-only), what it is, its name as shown."""

    source: str
    kind: str  # pages.DocInfo.kind: pdf, image, tiff ...
    name: str
    pages: int
    # what probing found (pages.DocInfo): for a writer that renders pages again
    info: Any = None


class Writer(abc.ABC):
    """One output of a document: its name (as `outputs` and the sidecar call it), the
    end of its file's name, what it keeps of each page and how it writes its file."""

    name: ClassVar[str] = "?"
    # how messages name its file ("the searchable PDF")
    title: ClassVar[str] = "the output"

    def __init__(self, settings: OutputSettings, pages: int, engine_format: str) -> None:
        """`engine_format`: what the engine's text is (Engine.output_format)."""
        self.settings = settings
        self.pages = pages
        self.engine_format = engine_format
        self.written: str | None = None  # the file's name, once in the outbox
        self.failed: str | None = None  # why it was not written

    @property
    @abc.abstractmethod
    def suffix(self) -> str:
        """How the file's name ends, after the document's base name (`.pdf`)."""

    def file_name(self, base: str) -> str:
        return destinations.fit_name(base, self.suffix)

    def page(self, index: int, out: PageOutput, rendered: RenderedPage) -> None:  # noqa: B027
        """Page `index` (0-based) is done: `out` is the engine's, `rendered` the page's
        size and resolution (no pixels). Called on the event loop: keep it short."""

    async def prepare(self, doc: Document, workers: Any) -> None:  # noqa: B027
        """Before `fill`, on the event loop: work that needs a render worker (`workers`:
        the document's; PDFium is not thread-safe)."""

    @abc.abstractmethod
    def fill(self, out: BinaryIO, doc: Document) -> None:
        """Write the file's bytes into `out` (in a thread)."""

    def page_meta(self, index: int) -> dict[str, Any]:
        """Facts about page `index` for the sidecar's pages[] (none by default)."""
        return {}

    def outputs(self) -> dict[str, str | None]:
        """The sidecar's `outputs` entries: the file written, and why it was not."""
        return {self.name: self.written, f"{self.name}_failed": self.failed}

    async def write(self, doc: Document, folder: safefs.Dir, base: str,
                    perms: destinations.Perms, workers: Any, metrics: Any = None,
                    log_: Any = log) -> None:
        """Write the file into `folder` as BASE+suffix, atomically; a failure of the
        output is recorded, one of the outbox or the daemon (errors.NOT_NOW) raised."""
        name = self.file_name(base)
        try:
            await self.prepare(doc, workers)
            # Cancelled (the daemon stops) while the thread writes: let it finish, so
            # that `discard` removes the file instead of a late rename leaving it behind.
            writing = asyncio.ensure_future(asyncio.to_thread(
                destinations.write_atomic_with, folder, name,
                lambda out: self.fill(out, doc), perms))
            try:
                await asyncio.shield(writing)
            except asyncio.CancelledError:
                await asyncio.wait({writing})
                raise
        except Exception as e:  # noqa: BLE001 - any failure costs this output only
            if _not_now(e):
                raise
            self.failed = failure_message(self.title, e)
            log_.warning("output_failed", output=self.name, file_name=name,
                         error=self.failed)
            if metrics is not None:
                metrics.output_failures.labels(self.name).inc()
            return
        self.written = name

    def discard(self, folder: safefs.Dir) -> None:
        """Remove the file this run wrote (the Markdown could not be written after all)."""
        if self.written is not None:
            try:
                folder.unlink(self.written)
            except OSError:
                pass
            self.written = None


def writer_class(name: str) -> type[Writer]:
    """The Writer for an `outputs` entry (a name of WRITERS or a class path)."""
    import importlib

    path = WRITERS.get(name, name)
    module_name, _, attr = path.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"outputs: {name!r}: cannot load {path!r} ({e})") from None
    if not (isinstance(found, type) and issubclass(found, Writer)):
        raise ConfigError(f"outputs: {name!r}: {path!r} is not an output writer (a "
                          "subclass of ocrd.outputs.writers.Writer)")
    return found


def writers_for(outputs: list[str] | tuple[str, ...], settings: OutputSettings, pages: int,
                engine_format: str) -> list[Writer]:
    """A writer for each output asked for besides the Markdown."""
    return [writer_class(name)(settings, pages, engine_format)
            for name in outputs if name != "markdown"]


def _not_now(e: BaseException | None) -> bool:
    """A failure of the destination or the daemon, also where a library reports one
    that it met while writing (its exception's cause or context)."""
    seen = 0
    while e is not None and seen < 5:
        if errors.not_now(e):
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def failure_message(title: str, e: BaseException) -> str:
    """Why an output (`title`: "the searchable PDF") was not written, for a person."""
    if isinstance(e, OSError):
        return f"{title} could not be written: {e.strerror or e}"
    text = str(e).strip().splitlines()
    # qpdf names the input it read: here a descriptor's stream, of no use to a reader
    detail = re.sub(r"^stream <[^>]*>\s*", "", text[0]) if text else type(e).__name__
    return f"{title} could not be made ({type(e).__name__}: {detail[:300]})"
