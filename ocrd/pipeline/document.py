"""One document through the pipeline: probe → render pages (ahead, bounded) → engine →
Markdown → results written atomically. Used by the daemon and by `ocrd convert`.

Memory stays flat with page count: at most `render.lookahead` rendered pages wait per
document, pages in the engine are bounded by the shared slots, and figure crops go to a
staging folder as they appear instead of piling up in memory.

The converter also tells the scheduler whether the engine has room: pages in it plus
pages on their way (rendering, or rendered and waiting for a slot) below the slots.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from ocrd import __version__, errors, names, safefs
from ocrd.config.settings import Config
from ocrd.engines.base import Engine, PageOutput, PageRequest
from ocrd.outputs import destinations, modeltext, records, searchable_pdf
from ocrd.outputs.markdown import PageMarkdown
from ocrd.pipeline import budget
from ocrd.pipeline.pages import DocumentPages
from ocrd.render import pages
from ocrd.render import resolution as resolutions
from ocrd.render.pool import DocumentWorkers
from ocrd.service.systemd import Liveness
from ocrd.work.schedule import FairSlots

log = structlog.get_logger("ocrd.pipeline.document")


@dataclass
class Source:
    """A document to convert: an open file (the claimed copy in the work area, or the
    file given to `ocrd convert`), read by every stage through its descriptor."""

    fd: int  # open for reading; ocrd never reopens the document by its path
    name: str  # path shown in outputs: relative to the inbox, or as given
    inbox: str | None = None
    prompt_mode: str = "markdown"
    custom_prompt: str | None = None
    claimed_at: float = field(default_factory=time.time)
    info: pages.DocInfo | None = None
    sha256: str | None = None
    order: tuple = ()  # scheduler order key (batch, cost, seq)
    # a new version of this source path replaces the results of the old one (keep mode)
    same_path_replaces: bool = False
    stem: str | None = None  # the outputs' name, when not the source's own (plain names)
    pdf: searchable_pdf.PdfSettings | None = None  # write the searchable PDF too (outputs: pdf)
    job_id: int | None = None  # its journal row (the console links to it)

    @property
    def path(self) -> str:
        """What render workers and poppler open: exactly this open file."""
        return safefs.fd_path(self.fd)


@dataclass
class DocProgress:
    """A document being converted, as the console shows it: page k of n."""

    src: Source
    pages: int
    started: float  # wall time its first page was asked for
    done: int = 0  # pages with their engine output


@dataclass
class Written:
    """What a finished conversion wrote (names in the output folder)."""

    folder: Path
    markdown: str
    sidecar: str
    assets: str | None
    meta: dict[str, Any]


class Clock:
    """When something started: the wall clock's time for timestamps, the monotonic
    clock's for its duration (a wall clock stepped back by NTP must not give negative
    seconds)."""

    def __init__(self) -> None:
        self.wall = time.time()
        self.mono = time.monotonic()

    def seconds(self) -> float:
        return time.monotonic() - self.mono


def sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


class EngineGate:
    """Open while the engine takes work. A page that meets EngineUnavailable closes it
    and waits; one prober polls the engine's health with backoff and reopens it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.open = asyncio.Event()
        self.open.set()
        self.closed = asyncio.Event()  # the other way round, for whoever waits for that
        self._prober: asyncio.Task | None = None

    async def wait(self, why: Exception) -> None:
        if self.open.is_set():
            log.warning("engine_unavailable", error=str(why))
            self.open.clear()
            self.closed.set()
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe(), name="engine-prober")
        await self.open.wait()

    async def _probe(self) -> None:
        delay = 0.5
        while True:
            await asyncio.sleep(delay)
            try:
                if await self.engine.health():
                    log.info("engine_available")
                    self.closed.clear()
                    self.open.set()
                    return
            except Exception as e:  # noqa: BLE001 - any failure means "not yet"
                log.debug("engine_health_failed", error=str(e))
            delay = min(delay * 2, 5.0)  # a health check is cheap; a waiting page is not


class Converter:
    def __init__(self, cfg: Config, engine: Engine, pool: pages.RenderPool,
                 slots: FairSlots, reservations: destinations.Reservations | None = None,
                 metrics: Any = None, liveness: Liveness | None = None) -> None:
        self.cfg = cfg
        self.liveness = liveness
        self.engine = engine
        self.pool = pool
        self.slots = slots
        self.reservations = reservations or destinations.Reservations()
        self.metrics = metrics
        self.gate = EngineGate(engine)
        self.resolution = resolutions.choose(cfg.render, engine)
        # page images in flight, all documents together (ocrd/pipeline/budget.py)
        self.memory = budget.MemoryBudget(budget.AUTO_FLOOR)
        self.set_memory(cfg.limits.memory_bytes)
        # Pages on their way to the engine (rendering or waiting for a slot), plus one
        # for each document still preparing (hash, folders) that will render soon.
        self.pending = 0
        # Called when a page moves on or a document finishes (the scheduler's poke).
        self.on_progress: Callable[[], None] | None = None
        # documents converting now (the console's "page k of n")
        self.documents: dict[int, DocProgress] = {}

    def set_memory(self, memory_bytes: int | None) -> None:
        """The memory budget (`limits.memory_bytes`, None: sized to the page slots), also
        when reloaded: for pages rendered from now on."""
        a4 = self.resolution.cost("L" if self.resolution.grey else "RGB",
                                  self.resolution.a4_pixels())
        total, per_page = budget.sizes(memory_bytes, self.slots.n, a4)
        self.memory.resize(total)
        self.resolution = replace(self.resolution, page_budget=per_page)

    def has_room(self) -> bool:
        """The engine could take more pages than are in it and on their way."""
        return self.slots.used + self.pending < self.slots.n

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress()

    async def probe(self, path: str, workers: DocumentWorkers) -> pages.DocInfo:
        lim = self.cfg.limits
        return await workers.call(pages.probe, path, self.resolution.dpi,
                                  lim.max_pages, lim.max_file_bytes, lim.max_pixels)

    async def convert(self, src: Source, out_dir: safefs.Dir, perms: destinations.Perms) -> Written:
        """Convert one document and write NAME.md, NAME.json (and NAME.assets/) into
        out_dir. Raises OcrdError subclasses for the file's own problems, EngineDead when
        the engine is gone, OSError when the destination cannot be written."""
        # This file's own render workers: nothing of another file's reaches them. (Entering
        # does not suspend: _convert counts the file as pending before the first await.)
        async with self.pool.document() as workers:
            return await self._convert(src, out_dir, perms, workers)

    async def _convert(self, src: Source, out_dir: safefs.Dir, perms: destinations.Perms,
                       workers: DocumentWorkers) -> Written:
        t0 = Clock()
        blog = log.bind(file=src.name)
        self.pending += 1  # counted before the first await: see Scheduler.run
        try:
            info = src.info or await self.probe(src.path, workers)
            src.info = info
            if src.sha256 is None:
                src.sha256 = await asyncio.to_thread(sha256_fd, src.fd)
        finally:
            self.pending -= 1
            self._progress()
        stem = src.stem or destinations.split_ext(PurePosixPath(src.name).name)[0]
        base = self.reservations.choose(out_dir, stem, src.sha256, src.name,
                                        src.same_path_replaces,
                                        (src.pdf.suffix,) if src.pdf else ())
        staging = Staging(out_dir, base, perms)
        pdf = searchable_pdf.SearchablePdf(src.pdf, info.pages, self.engine.output_format ==
                                   "grounding") if src.pdf else None
        try:
            self.documents[id(src)] = DocProgress(src, info.pages, time.time())
            results = await DocumentPages(self, workers, src, info, staging, staging.final,
                                          blog, pdf).run()
            if pdf is not None:  # before the sidecar, which lists it, and the Markdown
                await searchable_pdf.finish(pdf, workers, src.path, info.kind, out_dir, base,
                                    perms, self.metrics, blog)
            meta = self._sidecar(src, info, results, base, staging, t0, pdf)
            text = assemble(results)
            await asyncio.to_thread(self._write, out_dir, base, text, meta, staging, perms)
        except BaseException:
            await asyncio.to_thread(staging.discard)
            if pdf is not None:
                await asyncio.to_thread(pdf.discard, out_dir)
            raise
        finally:
            self.reservations.release(out_dir, base)
            self.documents.pop(id(src), None)
        blog.info("file_converted", pages=info.pages, seconds=round(t0.seconds(), 3),
                  output=str(out_dir.path / (base + ".md")), degraded=meta["degraded_pages"])
        return Written(out_dir.path, base + ".md", base + ".json",
                       staging.final if staging.used else None, meta)

    # -- pages ------------------------------------------------------------------------

    async def _ocr(self, request: Callable[[], Awaitable[PageRequest]], page_no: int,
                   blog: Any) -> PageOutput:
        """The engine's output for one page; `request()` gives the page's request (the
        rendered one first, a fresh one for each retry)."""
        sched = self.cfg.schedule
        failures = 0
        while True:
            await self.gate.open.wait()
            # Held in a list and popped into the call, so that no local variable of
            # this frame keeps the page image alive while the engine works on it.
            page = [await request()]
            try:
                if self.liveness is not None:
                    self.liveness.page_sent()
                try:
                    async with asyncio.timeout(sched.page_timeout_seconds):
                        return await self.engine.ocr(page.pop())
                finally:
                    if self.liveness is not None:
                        self.liveness.page_back()
            except errors.EngineUnavailable as e:
                await self.gate.wait(e)
            except (errors.EngineDead, asyncio.CancelledError):
                raise
            except Exception as e:  # noqa: BLE001 - the engine's failure, counted per page
                failures += 1
                detail = "timed out" if isinstance(e, TimeoutError) else f"{e}"
                blog.warning("page_engine_error", page=page_no, attempt=failures,
                             error=detail or type(e).__name__)
                if failures > sched.page_retries:
                    raise errors.EngineFailed(
                        f"page {page_no}: the engine failed {failures} times "
                        f"(last: {detail or type(e).__name__})") from None
                await asyncio.sleep(min(30.0, 0.5 * 2 ** failures))

    async def _page_result(self, i: int, out: PageOutput, image: Any,
                           rendered: pages.RenderedPage, render_s: float, staging: Staging,
                           assets_link: str) -> dict:
        figures: list[str] = []
        pm = await asyncio.to_thread(self._page_markdown, out, image, i + 1, assets_link)
        md, malformed = pm.markdown, pm.malformed
        for fig in pm.figures:
            await asyncio.to_thread(staging.add, fig.name, _png(fig.image))
            figures.append(fig.name)
        status = "ok"
        if out.degraded:
            status = "degraded"
        elif not md.strip():
            status = "blank"
        if self.metrics:
            self.metrics.pages.labels(status).inc()
            self.metrics.page_seconds.observe(out.seconds)
        return {
            "page": i + 1,
            "status": status,
            "degraded": out.degraded,
            "finish_reason": out.finish_reason,
            "tokens": out.tokens,
            "prompt_tokens": out.prompt_tokens,
            "attempts": out.attempts,
            "malformed_output": malformed,
            "width": rendered.width,
            "height": rendered.height,
            "dpi": round(rendered.dpi, 2) if rendered.dpi else None,
            "rotation": out.rotation,
            "render_seconds": round(render_s, 4),
            "engine_seconds": round(out.seconds, 4),
            "started_at": out.started_at,
            "finished_at": out.finished_at,
            "figures": figures,
            "markdown": md,
        }

    def _page_without_image(self, i: int, e: errors.OcrdError, render_s: float) -> dict:
        """The result of a page that has no image to read: blank for a page too small
        to hold text, else degraded ("unreadable") with the renderer's reason."""
        status = "blank" if isinstance(e, errors.PageTooSmall) else "degraded"
        if self.metrics:
            self.metrics.pages.labels(status).inc()
        return {
            "page": i + 1, "status": status,
            "degraded": None if status == "blank" else "unreadable",
            "finish_reason": None, "tokens": None, "prompt_tokens": None, "attempts": 0,
            "malformed_output": False, "width": None, "height": None, "dpi": None,
            "rotation": None, "render_seconds": round(render_s, 4), "engine_seconds": 0.0,
            "started_at": None, "finished_at": None, "figures": [], "markdown": "",
            "message": str(e),
        }

    def _page_markdown(self, out: PageOutput, image: Any, page_no: int,
                       assets_link: str) -> PageMarkdown:
        """The engine's text, cleaned once, here where it enters the document (the
        sidecar, the Markdown and the PDF's text layer all take it from `out`), and made
        the page's Markdown. Work for a thread: a page's text may be long."""
        out.text = modeltext.clean(out.text)
        if out.words:
            out.words = [replace(w, text=modeltext.clean(w.text)) for w in out.words]
        return self.engine.page_markdown(out.text, image, page_no, assets_link)

    # -- results ----------------------------------------------------------------------

    def _sidecar(self, src: Source, info: pages.DocInfo, results: list[dict], base: str,
                 staging: Staging, t0: Clock,
                 pdf: searchable_pdf.SearchablePdf | None = None) -> dict:
        page_meta = [records.page(r) for r in results]
        if pdf is not None:
            for i, page in enumerate(page_meta):
                page["text_layer"] = pdf.page_meta(i)
        degraded = [r["page"] for r in results if r["status"] == "degraded"]
        return {
            "schema_version": records.SIDECAR_SCHEMA_VERSION,
            "ocrd_version": __version__,
            "source": records.source(src.name, src.inbox, os.fstat(src.fd).st_size,
                                     src.sha256, info),
            "engine": self.engine.describe(),
            "prompt": src.prompt_mode if self.engine.follows_prompt else None,
            "page_count": info.pages,
            "status": "degraded" if degraded else "ok",
            "degraded_pages": degraded,
            "warnings": list(info.warnings),
            "outputs": {
                "markdown": base + ".md",
                "assets": staging.final if staging.used else None,
                **(pdf.outputs() if pdf is not None else {}),
            },
            "timings": {
                "claimed_at": records.iso(src.claimed_at),
                "started_at": records.iso(t0.wall),
                "finished_at": records.iso(time.time()),
                "seconds": round(t0.seconds(), 4),
            },
            "pages": page_meta,
        }

    def _write(self, out_dir: safefs.Dir, base: str, text: str, meta: dict,
               staging: Staging, perms: destinations.Perms) -> None:
        # Order matters: assets, then the sidecar, then the Markdown last, so whoever
        # waits for NAME.md finds everything else in place. Both files are made before
        # either takes its name: an output that fails leaves neither. Replacing is right
        # here: Reservations.choose gave a name that is free or holds this document's
        # results.
        files = [(base + ".json", names.json_bytes(meta)),
                 (base + ".md", text.encode("utf-8"))]
        staging.commit()
        destinations.write_atomic_all(out_dir, files, perms)
        out_dir.fsync()


PAGE_MARK = "<!-- page {n}{note} -->"


def assemble(results: list[dict]) -> str:
    """The document's Markdown: every page, in order, each opened by an HTML comment
    (`<!-- page 3 -->`, or `<!-- page 3 (blank) -->` / `(degraded: length)`), invisible
    when rendered and easy to split on."""
    parts = []
    for r in results:
        note = ""
        if r["status"] == "blank":
            note = " (blank)"
        elif r["status"] == "degraded":
            note = f" (degraded: {r['degraded']})"
        parts.append(PAGE_MARK.format(n=r["page"], note=note))
        body = r["markdown"].strip()
        if body:
            parts.append(body)
    return "\n\n".join(parts) + "\n"


class Staging:
    """NAME.assets/ built under a temporary name next to its final place."""

    def __init__(self, folder: safefs.Dir, base: str, perms: destinations.Perms) -> None:
        self.folder = folder
        self.final = destinations.assets_name(base)
        self.perms = perms
        self.tmp: str | None = None
        self.dir: safefs.Dir | None = None
        self.files = 0

    @property
    def used(self) -> bool:
        return self.files > 0

    def add(self, name: str, data: bytes) -> None:
        if self.dir is None:
            self.tmp = self.perms.tmp_name(self.final)
            self.folder.mkdir(self.tmp, 0o700)  # fails if the name exists
            self.dir = self.folder.sub(self.tmp)
        destinations.write_atomic(self.dir, name, data, self.perms, replace=False)
        self.files += 1

    def commit(self) -> None:
        if self.dir is None or self.tmp is None:
            # No figures this time: remove assets an earlier run of this document left.
            self.folder.remove_tree(self.final)
            return
        self.dir.fsync()
        os.fchmod(self.dir.fd, self.perms.dir_mode)
        if self.perms.gid is not None:
            os.fchown(self.dir.fd, -1, self.perms.gid)
        self.dir.close()
        self.dir = None
        self.folder.remove_tree(self.final)  # this document's earlier figures
        self.folder.rename(self.tmp, self.folder, self.final)
        self.tmp = None

    def discard(self) -> None:
        if self.dir is not None:
            self.dir.close()
            self.dir = None
        if self.tmp is not None:
            self.folder.remove_tree(self.tmp)
            self.tmp = None


def _png(image: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()
