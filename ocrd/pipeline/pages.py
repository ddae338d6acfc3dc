"""A page's way to the engine, and back: each page of a document is rendered ahead within
`render.lookahead` and the memory budget, waits for a fair slot in the engine and for
the engine's gate (closed while the engine is unavailable), is sent (retried on the
engine's failures, up to `schedule.page_retries`), and its output becomes the page's
result (Markdown, figures, sidecar facts, searchable-PDF text). One `DocumentPages` per
document being converted; what all documents share (`Shared`) is the converter's.

A page that cannot be rendered costs that page, not the document: it is kept as a
degraded page ("unreadable", with the renderer's reason) and the others go on. Only a
document none of whose pages renders fails, with its first page's reason.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from ocrd import errors
from ocrd.engines import orientation
from ocrd.engines.base import Engine, PageRequest
from ocrd.outputs import modeltext
from ocrd.outputs.page import PageOutput, unturn
from ocrd.pipeline import budget
from ocrd.render import deskew, pages, pixels

if TYPE_CHECKING:
    from ocrd.config.settings import Config
    from ocrd.outputs.assets import Staging
    from ocrd.outputs.markdown import PageMarkdown
    from ocrd.outputs.writers import Writer
    from ocrd.pipeline.schedule import FairSlots
    from ocrd.pipeline.source import DocProgress, Source
    from ocrd.render.pool import DocumentWorkers
    from ocrd.render.resolution import Resolution

log = structlog.get_logger("ocrd.pipeline.pages")

# Failures of the whole file, whichever page meets them first.
FILE_FAILURES = (errors.Encrypted, errors.TooLarge, errors.TooManyPages)


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


class EngineTraffic(Protocol):
    """Who is told when a page goes into the engine and when its call ends (the service's
    watchdog: a page in the engine for too long means the daemon is stuck)."""

    def page_sent(self) -> None: ...

    def page_back(self) -> None: ...


class Shared(Protocol):
    """What the pages of all documents share, held by the converter (document.py): the
    engine, its gate and slots, the memory budget, and the count of pages on their way."""

    cfg: Config
    engine: Engine
    gate: EngineGate
    liveness: EngineTraffic | None
    metrics: Any
    resolution: Resolution
    memory: budget.MemoryBudget
    slots: FairSlots
    documents: dict[int, DocProgress]
    pending: int

    def progressed(self) -> None: ...


class DocumentPages:
    def __init__(self, conv: Shared, workers: DocumentWorkers, src: Source,
                 info: pages.DocInfo, staging: Staging, assets_link: str, blog: Any,
                 outputs: list[Writer]) -> None:
        self.conv, self.workers = conv, workers
        self.src, self.info, self.staging = src, info, staging
        self.assets_link, self.blog, self.outputs = assets_link, blog, outputs
        self.results: list[dict] = [{} for _ in range(info.pages)]
        self.lost: dict[int, errors.OcrdError] = {}  # pages that could not be rendered
        # how each page was straightened (render.deskew; None: read as it lies)
        self.skews: dict[int, deskew.Skew | None] = {}
        self.unfinished = info.pages  # pages without their engine output yet
        self.ahead = asyncio.Semaphore(conv.cfg.render.lookahead)
        self.doc_key = object()  # identity of this document for the fair slots
        # An engine whose output has figures has them cropped from the page afterwards,
        # so its pages keep their image; others are held only until the engine takes them.
        self.keep_image = conv.engine.keeps_page_image
        # what the next page is likely to cost (the memory budget): an A4 page at first,
        # then what this document's last page cost
        self.guess = conv.resolution.cost(conv.engine.page_mode, conv.resolution.a4_pixels())

    async def run(self) -> list[dict]:
        try:
            async with asyncio.TaskGroup() as tg:
                for i in range(self.info.pages):
                    await self.ahead.acquire()
                    tg.create_task(self._page(i), name=f"page-{i + 1}")
        except BaseExceptionGroup as eg:
            raise _first(eg) from None
        if len(self.lost) == self.info.pages:  # not one page: the file has failed
            raise self.lost[min(self.lost)]
        return self.results

    def _moved_on(self) -> None:
        """The page left the look-ahead (it is in the engine, or it ended)."""
        self.ahead.release()
        self.conv.pending -= 1
        self.conv.progressed()

    async def _render(self, i: int) -> pages.RenderedPage:
        """Page i as the engine gets it: rendered and, with render.deskew, straightened
        (the same way each time it is rendered again for a retry)."""
        conv = self.conv
        page, self.skews[i] = await self.workers.call(
            deskew.render_straight_page, self.src.path, self.info, i, conv.resolution,
            conv.cfg.limits.max_pixels, conv.cfg.render.deskew)
        return page

    async def _page(self, i: int) -> None:
        conv = self.conv
        # Counted here, not where run() takes the look-ahead token: a task cancelled
        # before it starts never runs its finally.
        conv.pending += 1
        held = True
        memory = budget.Reservation(conv.memory)
        try:
            await memory.reserve(self.guess)
            t = time.monotonic()
            try:
                rendered = await self._render(i)
            except FILE_FAILURES:
                raise
            except errors.OcrdError as e:
                self._no_page(i, e, time.monotonic() - t)
                return
            render_s = time.monotonic() - t
            self.guess = conv.resolution.cost(rendered.mode, rendered.width * rendered.height)
            await memory.settle(self.guess)
            # what the sidecar and the text layer need: the page as scanned, whatever
            # size its straightened image has
            skew = self.skews.get(i)
            size = replace(rendered, data=b"") if skew is None else replace(
                rendered, width=skew.size[0], height=skew.size[1], data=b"")
            # A page waits for its slot packed (RGB; grey or 1-bit for an engine that reads
            # those: a Pillow RGB image takes a third more) and becomes an image when
            # handed to an engine that wants one. The pipeline then keeps no reference
            # while the engine works (a GPU engine keeps tensors, not pixels; a retry
            # renders the page again), except, for an engine whose output has figures to
            # crop, the packed page (made an image only for a page with figures; the
            # remote engine drops its image once it is encoded: hundreds of pages in
            # flight would otherwise hold gigabytes of images).
            waiting = [rendered]
            del rendered
            kept: list[Any] = []

            async def request() -> PageRequest:
                return self._request(i, waiting.pop() if waiting else await self._render(i),
                                     kept, priority)

            await conv.slots.acquire(self.doc_key, self.src.order)
            priority = self.unfinished
            held = False
            self._moved_on()
            out = await self._in_engine(request, i)
            out.skew = skew
            turn = self._turn(i)
            if turn is not None:  # read turned by hand: say so, boxes on the page as given
                out.rotation = turn
                if out.words:  # (as straightened, where it was: out.skew goes on from there)
                    read = skew.turned if skew is not None else (size.width, size.height)
                    out.words = [replace(w, box=unturn(w.box, turn, read)) for w in out.words]
            self.unfinished -= 1
            if (doc := conv.documents.get(id(self.src))) is not None:
                doc.done += 1
            self.results[i] = await self._result(i, out, kept[0].to_image if kept else None,
                                                 size, render_s)
            if turn is not None:
                self.results[i]["turned_by"] = "hand"
            for writer in self.outputs:  # e.g. the PDF's text layer, from the geometry
                writer.page(i, out, size)
            self.blog.debug("page_done", page=i + 1, seconds=round(out.seconds, 3),
                            tokens=out.tokens, finish=out.finish_reason)
        finally:
            memory.release()
            if held:
                self._moved_on()

    def _no_page(self, i: int, e: errors.OcrdError, render_s: float) -> None:
        """Page i has no image: too small to hold text (blank), or not renderable (lost,
        degraded). Either way it has its place in the results."""
        self.unfinished -= 1
        if not isinstance(e, errors.PageTooSmall):
            self.lost[i] = e
            self.blog.warning("page_unreadable", page=i + 1, reason=e.reason, error=str(e))
        self.results[i] = self._without_image(i, e, render_s)

    def _turn(self, i: int) -> int | None:
        """Degrees clockwise a person turned page i by hand (None: nobody did)."""
        return (self.src.turns or {}).get(i + 1)

    def _request(self, i: int, page: pages.RenderedPage, kept: list[Any],
                 priority: int = 0) -> PageRequest:
        src = self.src
        own_mode = self.conv.engine.page_mode != "RGB"
        turn = self._turn(i)
        if turn is not None:  # the page as the person turned it, an image to the engine
            turned = orientation.turn(page.to_image(), turn)
            req = PageRequest(image=turned, page_no=i + 1, doc_id=src.sha256 or src.name,
                              prompt_mode=src.prompt_mode,  # type: ignore[arg-type]
                              custom_prompt=src.custom_prompt, dpi=page.dpi,
                              priority=priority, turned=turn)
            if self.keep_image:  # figures are cropped from the page as read
                kept[:] = [_Shown(turned)]
            return req
        req = PageRequest(image=None if own_mode else page.to_image(),
                          rendered=page if own_mode else None, page_no=i + 1,
                          doc_id=src.sha256 or src.name,
                          prompt_mode=src.prompt_mode,  # type: ignore[arg-type]
                          custom_prompt=src.custom_prompt, dpi=page.dpi, priority=priority)
        if self.keep_image:  # for figure crops: packed (3 bytes a pixel, not Pillow's 4),
            kept[:] = [page]  # and the engine may drop its image once it has encoded it
            # ... or, once the engine has it as a PNG data URL, that (a sixth of the size)
            if pixels.EncodedPage.decodable(page.width, page.height):
                req = replace(req, on_encoded=lambda url: kept.__setitem__(
                    slice(None), [pixels.EncodedPage(url)]))
        return req

    async def _in_engine(self, request: Any, i: int) -> PageOutput:
        """The page's engine call, holding its slot (taken by the caller)."""
        conv = self.conv
        if conv.metrics:
            conv.metrics.pages_in_flight.inc()
        try:
            return await self._ocr(request, i + 1)
        finally:
            conv.slots.release(self.doc_key)
            conv.progressed()
            if conv.metrics:
                conv.metrics.pages_in_flight.dec()

    async def _ocr(self, request: Callable[[], Awaitable[PageRequest]], page_no: int
                   ) -> PageOutput:
        """The engine's output for one page; `request()` gives the page's request (the
        rendered one first, a fresh one for each retry)."""
        conv = self.conv
        sched = conv.cfg.schedule
        failures = 0
        while True:
            await conv.gate.open.wait()
            # Held in a list and popped into the call, so that no local variable of
            # this frame keeps the page image alive while the engine works on it.
            page = [await request()]
            try:
                if conv.liveness is not None:
                    conv.liveness.page_sent()
                try:
                    async with asyncio.timeout(sched.page_timeout_seconds):
                        return await conv.engine.ocr(page.pop())
                finally:
                    if conv.liveness is not None:
                        conv.liveness.page_back()
            except errors.EngineUnavailable as e:
                await conv.gate.wait(e)
            except (errors.EngineDead, asyncio.CancelledError):
                raise
            except Exception as e:  # noqa: BLE001 - the engine's failure, counted per page
                failures += 1
                detail = "timed out" if isinstance(e, TimeoutError) else f"{e}"
                self.blog.warning("page_engine_error", page=page_no, attempt=failures,
                                  error=detail or type(e).__name__)
                if failures > sched.page_retries:
                    raise errors.EngineFailed(
                        f"page {page_no}: the engine failed {failures} times "
                        f"(last: {detail or type(e).__name__})") from None
                await asyncio.sleep(min(30.0, 0.5 * 2 ** failures))

    async def _result(self, i: int, out: PageOutput, image: Any,
                      rendered: pages.RenderedPage, render_s: float) -> dict:
        figures: list[str] = []
        pm = await asyncio.to_thread(self._markdown, out, image, i + 1)
        md, malformed = pm.markdown, pm.malformed
        for fig in pm.figures:
            await asyncio.to_thread(self.staging.add, fig.name, _png(fig.image))
            figures.append(fig.name)
        status = "ok"
        if out.degraded:
            status = "degraded"
        elif not md.strip():
            status = "blank"
        if self.conv.metrics:
            self.conv.metrics.pages.labels(status).inc()
            self.conv.metrics.page_seconds.observe(out.seconds)
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
            "skew": out.skew.angle if out.skew is not None else None,
            "render_seconds": round(render_s, 4),
            "engine_seconds": round(out.seconds, 4),
            "started_at": out.started_at,
            "finished_at": out.finished_at,
            "figures": figures,
            "markdown": md,
        }

    def _without_image(self, i: int, e: errors.OcrdError, render_s: float) -> dict:
        """The result of a page that has no image to read: blank for a page too small
        to hold text, else degraded ("unreadable") with the renderer's reason."""
        status = "blank" if isinstance(e, errors.PageTooSmall) else "degraded"
        if self.conv.metrics:
            self.conv.metrics.pages.labels(status).inc()
        return {
            "page": i + 1, "status": status,
            "degraded": None if status == "blank" else "unreadable",
            "finish_reason": None, "tokens": None, "prompt_tokens": None, "attempts": 0,
            "malformed_output": False, "width": None, "height": None, "dpi": None,
            "rotation": None, "skew": None, "render_seconds": round(render_s, 4),
            "engine_seconds": 0.0,
            "started_at": None, "finished_at": None, "figures": [], "markdown": "",
            "message": str(e),
        }

    def _markdown(self, out: PageOutput, image: Any, page_no: int) -> PageMarkdown:
        """The engine's text, cleaned once, here where it enters the document (the
        sidecar, the Markdown and the PDF's text layer all take it from `out`), and made
        the page's Markdown. Work for a thread: a page's text may be long."""
        out.text = modeltext.clean(out.text)
        if out.words:
            out.words = [replace(w, text=modeltext.clean(w.text)) for w in out.words]
        return self.conv.engine.page_markdown(out.text, image, page_no, self.assets_link)


class _Shown:
    """A page image as it was sent (turned by hand), for figure crops."""

    def __init__(self, image: Any) -> None:
        self.image = image

    def to_image(self) -> Any:
        return self.image


def _first(eg: BaseExceptionGroup) -> BaseException:
    """The exception that matters in a TaskGroup's group: engine death first, then the
    file's own error, then anything else."""
    flat: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            flat.append(e)

    walk(eg)
    for kind in (errors.EngineDead, errors.OcrdError, Exception):
        for e in flat:
            if isinstance(e, kind):
                return e
    return flat[0]


def _png(image: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()
