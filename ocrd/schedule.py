"""Which document and which page go next.

Documents that become ready within a short window form a batch; batches are started in
arrival order and, inside a batch, the smallest document (pages × pixels) first. Page
slots in the engine are shared by all active documents and a freed slot goes to the
document with the fewest pages in flight, so a one-page receipt never waits behind a
300-page manual, and the engine is fed continuously across batch boundaries.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


class FairSlots:
    """N page slots. A waiter is served by (pages in flight of its document, its
    document's order key, arrival)."""

    def __init__(self, n: int) -> None:
        self.n = max(1, n)
        self.used = 0
        self.inflight: Counter[Any] = Counter()
        self._waiters: list[tuple[int, tuple, int, asyncio.Future, Any]] = []
        self._seq = itertools.count()

    def resize(self, n: int) -> None:
        self.n = max(1, n)
        self._wake()

    async def acquire(self, doc: Any, order: tuple = ()) -> None:
        if self.used < self.n and not self._waiters:
            self._grant(doc)
            return
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiters.append((0, order, next(self._seq), fut, doc))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(doc)  # granted just as we were cancelled
            else:
                self._waiters = [w for w in self._waiters if w[3] is not fut]
            raise

    def _grant(self, doc: Any) -> None:
        self.used += 1
        self.inflight[doc] += 1

    def release(self, doc: Any) -> None:
        self.used -= 1
        self.inflight[doc] -= 1
        if self.inflight[doc] <= 0:
            del self.inflight[doc]
        self._wake()

    def _wake(self) -> None:
        while self.used < self.n and self._waiters:
            best = min(self._waiters, key=lambda w: (self.inflight[w[4]], w[1], w[2]))
            self._waiters.remove(best)
            fut = best[3]
            if fut.done():
                continue
            self._grant(best[4])
            fut.set_result(None)

    @property
    def waiting(self) -> int:
        return len(self._waiters)


@dataclass(order=True)
class _Queued:
    batch: int
    cost: int
    seq: int
    item: Any = field(compare=False)
    since: float = field(compare=False, default=0.0)


class Scheduler:
    """Starts documents (`run_doc(item)`) in batch order, at most `max_active` at once."""

    def __init__(self, run_doc: Callable[[Any], Awaitable[None]], max_active: int,
                 window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.run_doc = run_doc
        self.max_active = max_active
        self.window = window
        self.clock = clock
        self._heap: list[_Queued] = []
        self._seq = itertools.count()
        self._batch = 0
        self._batch_opened = -1e18
        self._batch_close: dict[int, float] = {}
        self.active: dict[asyncio.Task, Any] = {}
        self._changed = asyncio.Event()
        self.accepting = True

    def submit(self, item: Any, cost: int) -> int:
        """Queue a document; returns its batch number."""
        now = self.clock()
        if now - self._batch_opened > self.window:
            self._batch += 1
            self._batch_opened = now
            self._batch_close[self._batch] = now + self.window
        heapq.heappush(self._heap, _Queued(self._batch, cost, next(self._seq), item, now))
        self._changed.set()
        return self._batch

    def order_of(self, item: Any) -> tuple:
        for q in self._heap:
            if q.item is item:
                return (q.batch, q.cost, q.seq)
        return ()

    @property
    def queued(self) -> int:
        return len(self._heap)

    def queued_items(self) -> list[Any]:
        return [q.item for q in sorted(self._heap)]

    def remove(self, pred: Callable[[Any], bool]) -> list[Any]:
        """Take queued (not yet started) documents out, e.g. of a removed inbox."""
        keep, gone = [], []
        for q in self._heap:
            (gone if pred(q.item) else keep).append(q)
        self._heap = keep
        heapq.heapify(self._heap)
        return [q.item for q in gone]

    def _eligible(self) -> _Queued | None:
        if not self._heap:
            return None
        head = self._heap[0]
        # A batch is started once its window has closed, so its smallest file goes first;
        # with nothing active there is nothing to reorder against: start at once.
        if not self.active or self.clock() >= self._batch_close.get(head.batch, 0):
            return heapq.heappop(self._heap)
        return None

    async def run(self) -> None:
        while True:
            self._changed.clear()
            while self.accepting and len(self.active) < self.max_active:
                q = self._eligible()
                if q is None:
                    break
                task = asyncio.create_task(self.run_doc(q.item), name="document")
                self.active[task] = q.item
                task.add_done_callback(self._done)
            timeout = None
            if self._heap and self.active:
                timeout = max(0.01, self._batch_close.get(self._heap[0].batch, 0) - self.clock())
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                pass

    def _done(self, task: asyncio.Task) -> None:
        self.active.pop(task, None)
        self._changed.set()

    async def drain(self, timeout: float) -> bool:
        """Stop starting documents; wait for the active ones. True if all finished."""
        self.accepting = False
        if not self.active:
            return True
        _, pending = await asyncio.wait(list(self.active), timeout=timeout or None)
        return not pending
