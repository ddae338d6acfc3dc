"""The pages of one document through the engine (the converter's inner loop): each page
is rendered ahead within `render.lookahead` and the memory budget, waits for a fair slot
in the engine, and its output becomes the page's result (Markdown, figures, sidecar
facts, searchable-PDF text). One `DocumentPages` per document being converted.

A page that cannot be rendered costs that page, not the document: it is kept as a
degraded page ("unreadable", with the renderer's reason) and the others go on. Only a
document none of whose pages renders fails, with its first page's reason.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ocrd import errors
from ocrd.engines.base import PageOutput, PageRequest
from ocrd.pipeline import budget
from ocrd.render import pages
from ocrd.render import pixels as pagepixels

if TYPE_CHECKING:
    from ocrd.outputs import searchable_pdf
    from ocrd.pipeline.document import Converter, Source, Staging
    from ocrd.render.pool import DocumentWorkers

# Failures of the whole file, whichever page meets them first.
FILE_FAILURES = (errors.Encrypted, errors.TooLarge, errors.TooManyPages)


class DocumentPages:
    def __init__(self, conv: Converter, workers: DocumentWorkers, src: Source,
                 info: pages.DocInfo, staging: Staging, assets_link: str, blog: Any,
                 pdf: searchable_pdf.SearchablePdf | None) -> None:
        self.conv, self.workers = conv, workers
        self.src, self.info, self.staging = src, info, staging
        self.assets_link, self.blog, self.pdf = assets_link, blog, pdf
        self.results: list[dict] = [{} for _ in range(info.pages)]
        self.lost: dict[int, errors.OcrdError] = {}  # pages that could not be rendered
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
        self.conv._progress()

    async def _render(self, i: int) -> pages.RenderedPage:
        conv = self.conv
        return await self.workers.call(pages.render_page, self.src.path, self.info, i,
                                       conv.resolution, conv.cfg.limits.max_pixels)

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
            size = replace(rendered, data=b"")  # what the sidecar needs
            # A page waits for its slot packed (RGB; grey or 1-bit for an engine that reads
            # those: a Pillow RGB image takes a third more) and becomes an image when
            # handed to an engine that wants one. The pipeline then keeps no reference
            # while the engine works (a GPU engine keeps tensors, not pixels; a retry
            # renders the page again), except, for an engine whose output has figures to
            # crop, the packed page (made an image only for a page with figures; the
            # remote engine drops its image once it is encoded: 544 A4 pages in flight
            # took 5.8 GB of RSS with the images kept).
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
            self.unfinished -= 1
            if (doc := conv.documents.get(id(self.src))) is not None:
                doc.done += 1
            self.results[i] = await conv._page_result(i, out,
                                                      kept[0].to_image if kept else None, size,
                                                      render_s, self.staging, self.assets_link)
            if self.pdf is not None:  # its text layer, from the engine's geometry
                self.pdf.page(i, out, size.width, size.height)
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
        self.results[i] = self.conv._page_without_image(i, e, render_s)

    def _request(self, i: int, page: pages.RenderedPage, kept: list[Any],
                 priority: int = 0) -> PageRequest:
        src = self.src
        own_mode = self.conv.engine.page_mode != "RGB"
        req = PageRequest(image=None if own_mode else page.to_image(),
                          rendered=page if own_mode else None, page_no=i + 1,
                          doc_id=src.sha256 or src.name,
                          prompt_mode=src.prompt_mode,  # type: ignore[arg-type]
                          custom_prompt=src.custom_prompt, dpi=page.dpi, priority=priority)
        if self.keep_image:  # for figure crops: packed (3 bytes a pixel, not Pillow's 4),
            kept[:] = [page]  # and the engine may drop its image once it has encoded it
            # ... or, once the engine has it as a PNG data URL, that (a sixth of the size)
            if pagepixels.EncodedPage.decodable(page.width, page.height):
                req = replace(req, on_encoded=lambda url: kept.__setitem__(
                    slice(None), [pagepixels.EncodedPage(url)]))
        return req

    async def _in_engine(self, request: Any, i: int) -> PageOutput:
        """The page's engine call, holding its slot (taken by the caller)."""
        conv = self.conv
        if conv.metrics:
            conv.metrics.pages_in_flight.inc()
        try:
            return await conv._ocr(request, i + 1, self.blog)
        finally:
            conv.slots.release(self.doc_key)
            conv._progress()
            if conv.metrics:
                conv.metrics.pages_in_flight.dec()


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
