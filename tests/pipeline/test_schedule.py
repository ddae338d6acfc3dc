"""Scheduling: fair page slots, batch order, starting documents while the engine has
room, and the bound on rendered pages held in memory.

Everything runs on the event loop with a fake clock, a fake render pool and a fake
engine (the real ones are covered end to end); nothing waits on the wall clock.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from ocrd import safefs
from ocrd.config.load import parse_config
from ocrd.engines.base import Engine, PageRequest
from ocrd.outputs import destinations
from ocrd.outputs.page import PageOutput
from ocrd.pipeline.document import Converter
from ocrd.pipeline.schedule import FairSlots, Scheduler
from ocrd.pipeline.source import Source
from ocrd.render import deskew, pages


async def settle(rounds: int = 50) -> None:
    """Let every ready task run until nothing moves (no timers involved)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def until(pred: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll with a deadline (for steps that run in threads, e.g. hashing the file)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


# -- FairSlots ---------------------------------------------------------------------------


def test_a_freed_slot_goes_to_the_document_with_fewest_pages_in_flight() -> None:
    async def scenario() -> list[str]:
        slots = FairSlots(2)
        await slots.acquire("manual")
        await slots.acquire("manual")
        got: list[str] = []

        async def page(doc: str) -> None:
            await slots.acquire(doc)
            got.append(doc)

        # the manual's third page asks first, the receipt's only page second
        waiters = [asyncio.create_task(page("manual")), asyncio.create_task(page("receipt"))]
        await settle()
        assert got == [] and slots.waiting == 2
        slots.release("manual")
        await settle()
        assert got == ["receipt"]  # 0 pages in flight beats 1
        slots.release("manual")
        await settle()
        await asyncio.gather(*waiters)
        assert slots.used == 2 and slots.inflight == {"manual": 1, "receipt": 1}
        return got

    assert asyncio.run(scenario()) == ["receipt", "manual"]


def test_equal_documents_are_served_in_their_order_key() -> None:
    async def scenario() -> list[str]:
        slots = FairSlots(1)
        await slots.acquire("holder")
        got: list[str] = []

        async def page(doc: str, order: tuple) -> None:
            await slots.acquire(doc, order)
            got.append(doc)
            slots.release(doc)

        tasks = [asyncio.create_task(page("later-batch", (2, 1, 5))),
                 asyncio.create_task(page("big", (1, 900, 3))),
                 asyncio.create_task(page("small", (1, 10, 4)))]
        await settle()
        slots.release("holder")
        await asyncio.gather(*tasks)
        return got

    assert asyncio.run(scenario()) == ["small", "big", "later-batch"]


def test_cancelling_a_waiting_page_leaks_no_slot() -> None:
    async def scenario() -> None:
        slots = FairSlots(1)
        await slots.acquire("a")
        waiting = asyncio.create_task(slots.acquire("b"))
        await settle()
        assert slots.waiting == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert slots.waiting == 0
        slots.release("a")
        assert slots.used == 0 and not slots.inflight
        await asyncio.wait_for(slots.acquire("c"), 1)  # free at once
        assert slots.used == 1

    asyncio.run(scenario())


def test_a_page_cancelled_just_as_it_was_granted_gives_the_slot_back() -> None:
    async def scenario() -> None:
        slots = FairSlots(1)
        await slots.acquire("a")
        waiting = asyncio.create_task(slots.acquire("b"))
        await settle()
        slots.release("a")  # grants b's future ...
        waiting.cancel()  # ... and b is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert slots.used == 0 and not slots.inflight and slots.waiting == 0

    asyncio.run(scenario())


# -- Scheduler ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Docs:
    """run_doc for the scheduler: records starts; each document runs until finished."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._done: dict[str, asyncio.Event] = {}
        self.on_start: Callable[[str], None] | None = None

    async def run(self, name: str) -> None:
        self.started.append(name)
        if self.on_start is not None:
            self.on_start(name)
        self._done[name] = asyncio.Event()
        await self._done[name].wait()

    def finish(self, name: str) -> None:
        self._done[name].set()


async def with_scheduler(sched: Scheduler, body: Callable[[], Awaitable[None]]) -> None:
    runner = asyncio.create_task(sched.run())
    try:
        await body()
    finally:
        runner.cancel()
        for task in list(sched.active):
            task.cancel()
        await asyncio.gather(runner, *sched.active, return_exceptions=True)


def test_smallest_first_within_a_batch_window() -> None:
    docs, clock = Docs(), Clock()
    sched = Scheduler(docs.run, max_active=1, window=0.5, clock=clock)

    async def body() -> None:
        sched.submit("manual-300p", 300)
        await settle()
        assert docs.started == ["manual-300p"]  # nothing to reorder against: at once
        clock.now += 0.1  # the same window
        for name, cost in (("report-40p", 40), ("receipt-1p", 1), ("letter-3p", 3)):
            sched.submit(name, cost)
        for name in ("manual-300p", "receipt-1p", "letter-3p"):
            await settle()
            docs.finish(name)
        await settle()
        assert docs.started == ["manual-300p", "receipt-1p", "letter-3p", "report-40p"]

    asyncio.run(with_scheduler(sched, body))


def test_batches_are_served_in_arrival_order() -> None:
    docs, clock = Docs(), Clock()
    sched = Scheduler(docs.run, max_active=1, window=0.5, clock=clock)

    async def body() -> None:
        assert sched.submit("first", 50) == sched.submit("first-big", 500)
        clock.now += 2  # a later batch: small, but it arrived later
        later = sched.submit("later-tiny", 1)
        assert later > 1
        await settle()
        for name in ("first", "first-big"):
            docs.finish(name)
            await settle()
        assert docs.started == ["first", "first-big", "later-tiny"]

    asyncio.run(with_scheduler(sched, body))


def test_a_batch_is_held_for_its_window_while_others_run() -> None:
    docs, clock = Docs(), Clock()
    sched = Scheduler(docs.run, max_active=2, window=0.5, clock=clock)

    async def body() -> None:
        sched.submit("running", 10)
        await settle()
        clock.now += 5
        sched.submit("big", 100)  # opens a new window
        await settle()
        assert docs.started == ["running"]  # a smaller file may still join the window
        clock.now += 0.2
        sched.submit("small", 1)
        clock.now += 0.4  # window closed
        sched.poke()
        await settle()
        assert docs.started == ["running", "small"]  # max_active 2 reached

    asyncio.run(with_scheduler(sched, body))


def test_the_next_batch_starts_as_soon_as_there_is_room() -> None:
    docs, clock = Docs(), Clock()
    sched = Scheduler(docs.run, max_active=2, window=0.5, clock=clock)

    async def body() -> None:
        sched.submit("a", 10)
        sched.submit("b", 20)
        clock.now += 1
        sched.submit("next-batch", 5)
        clock.now += 1  # its window closed too
        await settle()
        assert docs.started == ["a", "b"]
        docs.finish("a")  # b is still converting: no waiting for the batch to drain
        await settle()
        assert docs.started == ["a", "b", "next-batch"]
        assert set(sched.active.values()) == {"b", "next-batch"}

    asyncio.run(with_scheduler(sched, body))


def test_documents_start_beyond_max_active_while_the_engine_has_room() -> None:
    docs, clock = Docs(), Clock()
    room = {"free": True}
    sched = Scheduler(docs.run, max_active=1, window=0.5, clock=clock,
                      room=lambda: room["free"], room_limit=3)

    async def body() -> None:
        for i in range(5):
            sched.submit(f"d{i}", 1)
        await settle()
        # one by max_active, two more for room (window still open), then room_limit
        assert docs.started == ["d0", "d1", "d2"]
        room["free"] = False
        docs.finish("d0")
        await settle()
        assert docs.started == ["d0", "d1", "d2"]  # 2 active > max_active 1: no room
        docs.finish("d1")
        docs.finish("d2")
        clock.now += 1
        await settle()
        assert docs.started == ["d0", "d1", "d2", "d3"]  # back to max_active
        room["free"] = True
        sched.poke()
        await settle()
        assert docs.started == ["d0", "d1", "d2", "d3", "d4"]

    asyncio.run(with_scheduler(sched, body))


def test_room_is_judged_after_each_started_document_counts_itself() -> None:
    docs, clock = Docs(), Clock()
    pending = {"pages": 0}
    docs.on_start = lambda name: pending.__setitem__("pages", pending["pages"] + 2)
    sched = Scheduler(docs.run, max_active=1, window=0.5, clock=clock,
                      room=lambda: pending["pages"] < 4, room_limit=50)

    async def body() -> None:
        for i in range(20):
            sched.submit(f"d{i}", 1)
        await settle()
        # d0 (max_active), then d1 while 2 < 4; after d1 counts itself 4 pages are on
        # their way and the engine is full: the other 18 wait
        assert docs.started == ["d0", "d1"]
        assert sched.queued == 18

    asyncio.run(with_scheduler(sched, body))


def test_order_of_and_remove_keep_queued_keys_consistent() -> None:
    sched = Scheduler(Docs().run, max_active=1, window=0.5, clock=Clock())
    a, b = object(), object()
    sched.submit(a, 5)
    sched.submit(b, 1)
    assert sched.order_of(b) < sched.order_of(a)
    assert sched.remove(lambda item: item is a) == [a]
    assert sched.order_of(a) == () and sched.queued == 1


# -- the pipeline's bound on rendered pages ----------------------------------------------


class FakePool:
    """The render worker's call without processes (pages neither measured nor
    straightened): counts pages rendered and not yet handed on."""

    def __init__(self) -> None:
        self.renders = 0

    def document(self) -> FakePool:  # one file's use of the pool: the pool itself here
        return self

    async def __aenter__(self) -> FakePool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def call(self, fn: Callable[..., Any], *args: Any, **_: Any) -> Any:
        assert fn is deskew.render_straight_page
        await asyncio.sleep(0)
        self.renders += 1
        index = args[2]
        return pages.RenderedPage(index, 4, 4, bytes([index % 256]) * 48, 144.0), None


class BlockingEngine(Engine):
    """Holds every page until released; remembers weak references to the images."""

    kind = "fake"
    output_format = "text"

    def __init__(self) -> None:
        self.inside = 0
        self.most_inside = 0
        self.release = asyncio.Event()
        self.images: list[weakref.ref] = []

    async def ocr(self, page: PageRequest) -> PageOutput:
        self.images.append(weakref.ref(page.image))
        n = page.page_no
        del page  # as a GPU engine that keeps tensors, not the picture
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            await self.release.wait()
        finally:
            self.inside -= 1
        return PageOutput(text=f"text of page {n}", tokens=3)


def test_rendered_pages_held_stay_within_the_lookahead_and_the_slots(tmp_path: Path) -> None:
    cfg = parse_config({"state_dir": str(tmp_path), "metrics": {"listen": None},
                        "render": {"lookahead": 3}}, tmp_path)
    doc = tmp_path / "manual.pdf"
    doc.write_bytes(b"%PDF-1.4 fake\n%%EOF\n")
    n_pages = 60
    info = pages.DocInfo("pdf", "PDF", n_pages, "pypdfium2", n_pages * 16)

    async def scenario() -> tuple[Any, ...]:
        engine, pool, slots = BlockingEngine(), FakePool(), FairSlots(2)
        conv = Converter(cfg, engine, pool, slots)  # type: ignore[arg-type]
        src = Source(os.open(doc, os.O_RDONLY), "manual.pdf", info=info)
        out = safefs.Dir.open_root(tmp_path / "out", create=True)
        job = asyncio.create_task(conv.convert(src, out, destinations.Perms()))
        await until(lambda: engine.inside == 2, "the engine to fill")
        await settle(200)  # everything that can move now, without the engine, has
        # the engine is full and blocked: 2 pages in it, 3 rendered and waiting for a
        # slot, nothing else rendered however many pages the document has
        held_then = (pool.renders, engine.inside, conv.pending, conv.has_room())
        gc.collect()
        alive = sum(ref() is not None for ref in engine.images)
        engine.release.set()
        written = await job
        return held_then, alive, engine.most_inside, conv.pending, slots.used, written

    (renders, inside, pending, room), alive, most_inside, pending_after, used, written = \
        asyncio.run(scenario())
    assert (renders, inside, pending, room) == (5, 2, 3, False)
    # pages in the engine are not kept as images by the pipeline
    assert alive == 0
    assert most_inside == 2 and pending_after == 0 and used == 0
    text = (written.folder / written.markdown).read_text()
    assert text.count("<!-- page ") == n_pages
    assert "text of page 1\n" in text and f"text of page {n_pages}\n" in text


class RecordingEngine(Engine):
    """Answers at once; remembers each page's priority, in the order pages came."""

    kind = "fake"
    output_format = "text"

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int]] = []

    async def ocr(self, page: PageRequest) -> PageOutput:
        self.seen.append((page.doc_id, page.page_no, page.priority))
        await asyncio.sleep(0)
        return PageOutput(text=f"text of page {page.page_no}", tokens=3)


def test_a_pages_priority_is_its_documents_pages_not_yet_done(tmp_path: Path) -> None:
    """What the managed vLLM servers order their queues by (vLLM's priority, lower
    first): a one-page receipt's page has 1, a manual's pages count down as it gets
    done (tests/vllm_engine/test_managed_server.py: a real server serves the receipt
    first)."""
    cfg = parse_config({"state_dir": str(tmp_path), "metrics": {"listen": None},
                        "render": {"lookahead": 3}}, tmp_path)

    async def scenario() -> list[tuple[str, int, int]]:
        engine, pool = RecordingEngine(), FakePool()
        conv = Converter(cfg, engine, pool, FairSlots(1))  # type: ignore[arg-type]
        out = safefs.Dir.open_root(tmp_path / "out", create=True)
        jobs = []
        for name, n in (("manual.pdf", 6), ("receipt.pdf", 1)):
            doc = tmp_path / name
            doc.write_bytes(b"%PDF-1.4 fake " + name.encode() + b"\n%%EOF\n")
            info = pages.DocInfo("pdf", "PDF", n, "pypdfium2", n * 16)
            src = Source(os.open(doc, os.O_RDONLY), name, info=info)
            jobs.append(asyncio.create_task(conv.convert(src, out, destinations.Perms())))
        await asyncio.gather(*jobs)
        return engine.seen

    seen = asyncio.run(scenario())
    by_doc: dict[str, list[int]] = {}
    for doc, _, priority in seen:
        by_doc.setdefault(doc, []).append(priority)
    # one engine slot: the manual's pages one after another, the receipt's between them
    assert sorted(by_doc.values()) == [[1], [6, 5, 4, 3, 2, 1]]


class NoisePool(FakePool):
    """Renders 400×600 RGB pages of noise; remembers them by weak reference."""

    def __init__(self) -> None:
        super().__init__()
        self.rendered: list[weakref.ref] = []

    async def call(self, fn: Callable[..., Any], *args: Any, **_: Any) -> Any:
        assert fn is deskew.render_straight_page
        await asyncio.sleep(0)
        index = args[2]
        page = pages.RenderedPage(index, 400, 600, random.Random(index).randbytes(400 * 600 * 3),
                                  144.0)
        self.rendered.append(weakref.ref(page))
        return page, None


def test_a_remote_engines_page_waits_for_its_figures_as_the_url_sent(tmp_path: Path) -> None:
    """While the server has the page, the pipeline holds the PNG data URL the remote
    engine sent (~1 MB for an A4 page at 144 dpi), not the packed pixels (6 MB), and
    crops the page's figure from it, pixel for pixel."""
    from fake_vllm import FakeVllm

    from ocrd.engines.remote import RemoteEngine

    cfg = parse_config({"state_dir": str(tmp_path), "metrics": {"listen": None}}, tmp_path)
    doc = tmp_path / "report.pdf"
    doc.write_bytes(b"%PDF-1.4 fake\n%%EOF\n")
    info = pages.DocInfo("pdf", "PDF", 2, "pypdfium2", 2 * 400 * 600)
    pool = NoisePool()
    packed_alive: list[bool] = []

    class Server(FakeVllm):
        async def _answer(self, method: str, path: str, body: bytes, reader: Any) -> Any:
            if path == "/v1/chat/completions":
                gc.collect()  # one engine slot: the pages come in order
                packed_alive.append(pool.rendered[len(packed_alive)]() is not None)
            return await super()._answer(method, path, body, reader)

    async def scenario() -> Any:
        server = await Server(text="<|ref|>image<|/ref|><|det|>[[100, 200, 600, 700]]"
                                   "<|/det|>").start()
        engine = RemoteEngine(parse_config({"state_dir": str(tmp_path), "engine": {
            "kind": "remote", "remote": {"urls": [server.url]}}}, tmp_path).engine)
        await engine.start()
        try:
            conv = Converter(cfg, engine, pool, FairSlots(1))  # type: ignore[arg-type]
            src = Source(os.open(doc, os.O_RDONLY), "report.pdf", info=info)
            out = safefs.Dir.open_root(tmp_path / "out", create=True)
            return await conv.convert(src, out, destinations.Perms())
        finally:
            await engine.close()
            await server.stop()

    written = asyncio.run(scenario())
    assert packed_alive == [False, False]
    expected = pages.RenderedPage(0, 400, 600, random.Random(0).randbytes(400 * 600 * 3),
                                  144.0).to_image().crop((40, 120, 240, 420))
    figures = sorted((written.folder / "report.assets").iterdir())
    assert [f.name for f in figures] == ["p0001-1.png", "p0002-1.png"]
    with Image.open(figures[0]) as figure:
        assert figure.convert("RGB").tobytes() == expected.tobytes()
