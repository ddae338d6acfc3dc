"""Engines for the tests and benchmarks, loaded by class path like any engine of one's
own (`engine.kind: simulated_engines:SimulatedEngine`, settings in `engine.options`):
tests/conftest.py and the benchmarks put this folder on the daemons' PYTHONPATH.

SimulatedEngine: a stand-in for a continuous-batching GPU engine.

It behaves like vLLM serving a vision model, with the model replaced by a clock: one
stepping loop (a thread, as a GPU runs beside the host's event loop) advances every
active page by one token per step; a step takes `step_seconds + step_per_page_seconds ×
batch`, plus the prefill of the pages that enter the batch in it (proportional to their
pixels). At most `max_batch` pages are decoded at once; the rest wait in a FIFO queue
and join at the next step with a free place. So pages that arrive together finish
together, a lone page costs almost as much engine time as a full batch, and a caller
that leaves the batch half empty gets half the throughput — exactly what the scheduler
must avoid. The text of a page describes the page (size, a fingerprint of its pixels,
its number), so outputs of different pages differ. `instant` answers at once, to measure
everything but the engine.

FaultyEngine: faults injected around another engine, for the reliability tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import structlog
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from ocrd.config.engine import EngineConfig
from ocrd.engines import create_engine
from ocrd.engines.base import Engine, PageRequest
from ocrd.errors import EngineDead, EngineUnavailable
from ocrd.outputs.page import PageOutput

log = structlog.get_logger("ocrd.engine.simulated")

SIMULATED = "simulated_engines:SimulatedEngine"
FAULTY = "simulated_engines:FaultyEngine"


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SimulatedOptions(_Options):
    """A stand-in for a continuous-batching GPU engine, for benchmarks and tests: one
    stepping loop decodes every active page at once; nothing is read or learned."""

    # pages decoded together in one step; more wait in the engine's queue
    max_batch: int = Field(default=16, ge=1)
    # one step takes step_seconds + step_per_page_seconds × pages in the batch
    step_seconds: float = Field(default=0.02, ge=0)
    step_per_page_seconds: float = Field(default=0.001, ge=0)
    # a page's prefill (its image) adds this much to the step it enters the batch in
    prefill_seconds_per_megapixel: float = Field(default=0.005, ge=0)
    # decode steps (output tokens) per page, varied by up to ± this fraction per page
    # (deterministically, from the document and page number)
    decode_steps: int = Field(default=24, ge=1)
    decode_jitter: float = Field(default=0.5, ge=0, lt=1)
    # pages the daemon keeps in flight with this engine; 0 = max_batch + 2, a small
    # queue so that a freed batch place is refilled at the very next step
    concurrency: int = Field(default=0, ge=0)
    # answer every page at once (zero step time): measures the daemon's own overhead
    instant: bool = False


class FaultOptions(_Options):
    """Fault injection around another engine (`inner`: an engine section, the simulated
    engine by default): every N-th page (counted per daemon run) meets the fault; 0
    turns it off."""

    inner: dict[str, Any] = Field(default_factory=lambda: {"kind": SIMULATED})

    error_every: int = Field(default=0, ge=0)  # raises an error
    hang_every: int = Field(default=0, ge=0)  # never answers (page timeout)
    garbage_every: int = Field(default=0, ge=0)  # returns random characters
    die_after: int = Field(default=0, ge=0)  # the engine dies after this many pages
    unavailable_seconds: float = Field(default=0.0, ge=0)  # unreachable after start
    # while this file exists, a page's call blocks the event loop itself (a synchronous
    # sleep inside the coroutine), as a real hang would: the watchdog's test
    block_loop_while: str | None = None


@dataclass(eq=False)
class _Request:
    image: Image.Image | None  # dropped after prefill, as a real engine keeps only KV
    page_no: int
    doc_id: str
    steps: int  # decode steps (tokens) this page needs
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    submitted: float  # time.monotonic()
    text: str = ""
    done_steps: int = 0
    started: float = 0.0  # time.monotonic()
    started_at: float = 0.0  # time.time(), for the sidecar
    cancelled: bool = False


@dataclass
class SimulatedStats:
    """What the stepping loop did: tests and benchmarks read these."""

    steps: int = 0
    pages_done: int = 0
    batch_pages: int = 0  # sum of batch sizes over all steps
    max_batch_seen: int = 0
    max_queued: int = 0
    busy_seconds: float = 0.0  # time spent in steps
    batch_sizes: list[int] = field(default_factory=list)  # per step, last 10,000 steps


def describe_page(image: Image.Image, page_no: int, doc_id: str) -> str:
    """The simulated OCR text: page number, size and a fingerprint of the pixels."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    thumb = rgb.resize((16, 16), Image.Resampling.BOX)
    digest = hashlib.blake2b(thumb.tobytes(), digest_size=6).hexdigest()
    return (f"Simulated page {page_no} of document {doc_id[:12]}: "
            f"{image.width}×{image.height} pixels, fingerprint {digest}.")


def decode_steps(base: int, jitter: float, doc_id: str, page_no: int) -> int:
    """Tokens for one page: `base` varied by up to ± `jitter`, the same every run."""
    if jitter <= 0:
        return base
    h = hashlib.blake2b(f"{doc_id}:{page_no}".encode(), digest_size=8).digest()
    u = int.from_bytes(h, "big") / 2**64  # uniform in [0, 1)
    return max(1, round(base * (1 + jitter * (2 * u - 1))))


class SimulatedEngine(Engine):
    kind = "simulated"
    model = "simulated"
    output_format = "text"

    Options = SimulatedOptions

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = self.options(cfg)
        # A small queue beyond the batch: when a page finishes, the next one is already
        # waiting inside the engine and joins at the very next step, instead of after a
        # round trip through the caller (which would leave a place empty for a step).
        # Two suffice (pages finish a few per step); more would only hold more images.
        self.max_concurrency = self.cfg.concurrency or self.cfg.max_batch + 2
        self.stats = SimulatedStats()
        self._cond = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._active: list[_Request] = []
        self._thread: threading.Thread | None = None
        self._closed = False

    async def start(self) -> None:
        if self.cfg.instant or self._thread is not None:
            return
        self._closed = False
        self._thread = threading.Thread(target=self._step_loop, name="simulated-engine",
                                        daemon=True)
        self._thread.start()

    async def health(self) -> bool:
        return self.cfg.instant or (self._thread is not None and self._thread.is_alive())

    async def ocr(self, page: PageRequest) -> PageOutput:
        steps = decode_steps(self.cfg.decode_steps, self.cfg.decode_jitter, page.doc_id,
                             page.page_no)
        if self.cfg.instant:
            now = time.time()
            self.stats.pages_done += 1
            text = describe_page(page.image, page.page_no, page.doc_id)
            return PageOutput(text=text, finish_reason="stop", tokens=steps,
                              started_at=now, finished_at=now)
        if self._closed or self._thread is None or not self._thread.is_alive():
            raise EngineDead("the simulated engine is not running")
        loop = asyncio.get_running_loop()
        req = _Request(page.image, page.page_no, page.doc_id, steps, loop.create_future(),
                       loop, time.monotonic())
        del page  # the image is the stepping loop's now, and dropped after prefill
        with self._cond:
            self._queue.append(req)
            self._cond.notify()
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled = True  # the stepping loop drops it at its next step
            raise

    async def close(self) -> None:
        with self._cond:
            self._closed = True
            pending = [*self._queue, *self._active]
            self._queue.clear()
            self._active.clear()
            self._cond.notify_all()
        for req in pending:
            req.loop.call_soon_threadsafe(_settle, req.future, None,
                                          EngineDead("the simulated engine was closed"))
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
            self._thread = None
        st = self.stats
        # For benchmarks: how full the batches were over the engine's life.
        log.info("simulated_engine_stats", steps=st.steps, pages=st.pages_done,
                 mean_batch=round(st.batch_pages / st.steps, 2) if st.steps else 0.0,
                 busy_seconds=round(st.busy_seconds, 3), max_queued=st.max_queued,
                 partial_steps=sum(1 for b in st.batch_sizes if b < self.cfg.max_batch))

    def describe(self) -> dict:
        return {"kind": self.kind, "model": self.model, "max_batch": self.cfg.max_batch,
                "instant": self.cfg.instant}

    # -- the stepping loop (its own thread) -------------------------------------------

    def _next_batch(self) -> tuple[list[_Request], list[_Request], bool] | None:
        """Wait for work; admit queued pages into free batch places. Returns (batch,
        pages admitted in this step, whether the engine sat idle), or None once closed."""
        idle = False
        with self._cond:
            while True:
                self._active = [r for r in self._active if not r.cancelled]
                if self._closed:
                    return None
                if self._queue or self._active:
                    break
                idle = True
                self._cond.wait()
            admitted = []
            while self._queue and len(self._active) < self.cfg.max_batch:
                req = self._queue.popleft()
                if not req.cancelled:
                    self._active.append(req)
                    admitted.append(req)
            stats = self.stats
            stats.max_queued = max(stats.max_queued, len(self._queue))
            return list(self._active), admitted, idle

    def _step_loop(self) -> None:
        cfg = self.cfg
        deadline = 0.0
        while True:
            work = self._next_batch()
            if work is None:
                return
            batch, admitted, idle = work
            begin = time.monotonic()
            # While busy, steps run back to back on the engine's own clock: a late
            # wake-up of this thread (the GIL held by the host) does not stretch them,
            # as a GPU engine core (its own process in vLLM) does not wait for the host.
            start = begin if idle or not 0 <= begin - deadline <= 0.05 else deadline
            prefill = 0.0
            for req in admitted:
                req.started, req.started_at = time.monotonic(), time.time()
                if req.image is not None:
                    prefill += req.image.width * req.image.height / 1e6
                    req.text = describe_page(req.image, req.page_no, req.doc_id)
                    req.image = None
            duration = (cfg.step_seconds + cfg.step_per_page_seconds * len(batch)
                        + cfg.prefill_seconds_per_megapixel * prefill)
            deadline = start + duration
            delay = deadline - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            finished = []
            for req in batch:
                req.done_steps += 1
                if req.done_steps >= req.steps:
                    finished.append(req)
            with self._cond:
                gone = set(finished)
                self._active = [r for r in self._active if r not in gone]
                stats = self.stats
                stats.steps += 1
                stats.batch_pages += len(batch)
                stats.max_batch_seen = max(stats.max_batch_seen, len(batch))
                stats.busy_seconds += duration
                stats.pages_done += len(finished)
                if len(stats.batch_sizes) < 10_000:
                    stats.batch_sizes.append(len(batch))
            now, wall = time.monotonic(), time.time()
            for req in finished:
                if req.cancelled:
                    continue
                out = PageOutput(text=req.text, finish_reason="stop", tokens=req.steps,
                                 prompt_tokens=None, seconds=now - req.started,
                                 started_at=req.started_at, finished_at=wall,
                                 extra={"queued_seconds": round(req.started - req.submitted, 4)})
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    req.loop.call_soon_threadsafe(_settle, req.future, out, None)


def _settle(future: asyncio.Future, out: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(out)


class FaultyEngine(Engine):
    """Faults, deterministic (every N-th page of this run), around another engine:
    errors the daemon must retry, hangs it must time out, garbage it must still turn
    into a document, death it must survive by exiting and resuming, and an unreachable
    engine it must wait for without failing pages."""

    Options = FaultOptions

    @classmethod
    def create(cls, cfg: EngineConfig) -> Engine:
        faults = cls.options(cfg)
        assert isinstance(faults, FaultOptions)
        inner = create_engine(EngineConfig.model_validate(faults.inner))
        log.warning("engine_faults_injected", faults=faults.model_dump())
        return cls(inner, faults)

    def __init__(self, inner: Engine, faults: FaultOptions) -> None:
        self.inner = inner
        self.faults = faults
        self.kind = inner.kind
        self.model = inner.model
        self.output_format = inner.output_format
        self.max_concurrency = inner.max_concurrency
        self.render_dpi = inner.render_dpi
        self.scan_dpi = inner.scan_dpi
        self.page_mode = inner.page_mode
        self.pixel_bytes = inner.pixel_bytes
        self.calls = 0
        self._started = 0.0
        self._rng = random.Random(0)

    async def start(self) -> None:
        await self.inner.start()
        self._started = time.monotonic()

    def _unavailable(self) -> bool:
        return time.monotonic() - self._started < self.faults.unavailable_seconds

    async def ocr(self, page: PageRequest) -> PageOutput:
        f = self.faults
        if self._unavailable():
            raise EngineUnavailable("injected: engine unreachable")
        self.calls += 1
        n = self.calls
        if f.block_loop_while and os.path.exists(f.block_loop_while):
            log.warning("engine_blocks_the_loop", file=f.block_loop_while)
            while os.path.exists(f.block_loop_while):
                time.sleep(0.2)  # on the event loop's thread: nothing else turns
        if f.die_after and n > f.die_after:
            raise EngineDead(f"injected: engine died after {f.die_after} pages")
        if f.error_every and n % f.error_every == 0:
            raise RuntimeError(f"injected: engine error on call {n}")
        if f.hang_every and n % f.hang_every == 0:
            await asyncio.Event().wait()  # never set: only a timeout or cancel ends it
        out = await self.inner.ocr(page)
        if f.garbage_every and n % f.garbage_every == 0:
            out.text = "".join(chr(self._rng.randrange(1, 0x2FFF)) for _ in range(300))
        return out

    async def health(self) -> bool:
        return not self._unavailable() and await self.inner.health()

    async def close(self) -> None:
        await self.inner.close()

    def describe(self) -> dict:
        return {**self.inner.describe(), "faults": self.faults.model_dump()}
