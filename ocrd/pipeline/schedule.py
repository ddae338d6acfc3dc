"""Which document and which page go next.

Documents that become ready within a short window form a batch; batches are started in
arrival order and, inside a batch, the smallest document (pages × pixels) first. Page
slots in the engine are shared by all active documents and a freed slot goes to the
document with the fewest pages in flight, so a one-page receipt never waits behind a
300-page manual, and the engine is fed continuously across batch boundaries.

Up to `max_active` documents run at once. Beyond that, and before a batch's window has
closed, a document starts only when the engine has room: the pages in it plus the pages
on their way (rendering, or waiting for a slot) would not fill it. Waiting for a window
or for a document to finish while the engine sits half empty is what a fixed-batch loop
does; a full engine, not a document count, is the goal.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    # runs alone: nothing else starts while it is active (isolating a suspect)
    exclusive: bool = field(compare=False, default=False)


class Scheduler:
    """Starts documents (`run_doc(item)`) in batch order: up to `max_active` at once, and
    up to `room_limit` while `room()` says the engine could take more pages. Call
    `poke()` when room may have appeared (a page got a slot or finished)."""

    def __init__(self, run_doc: Callable[[Any], Awaitable[None]], max_active: int,
                 window: float, clock: Callable[[], float] = time.monotonic,
                 room: Callable[[], bool] | None = None, room_limit: int = 0) -> None:
        self.run_doc = run_doc
        self.max_active = max_active
        self.window = window
        self.clock = clock
        self.room = room
        # Documents at most, counting those started for room: each holds up to its
        # render look-ahead in memory, so this must stay bounded whatever room says.
        self.room_limit = room_limit
        self._heap: list[_Queued] = []
        self._keys: dict[int, tuple] = {}  # id(item) → order key, for queued items
        self._seq = itertools.count()
        self._batch = 0
        self._batch_opened = -1e18
        self._batch_close: dict[int, float] = {}
        self.active: dict[asyncio.Task, Any] = {}
        self._exclusive: set[asyncio.Task] = set()
        self._changed = asyncio.Event()
        self.accepting = True

    def submit(self, item: Any, cost: int, exclusive: bool = False) -> int:
        """Queue a document; returns its batch number. An exclusive document goes first
        and is converted alone (used for files suspected of crashing the daemon)."""
        now = self.clock()
        if now - self._batch_opened > self.window:
            self._batch += 1
            self._batch_opened = now
            self._batch_close[self._batch] = now + self.window
        batch = 0 if exclusive else self._batch
        q = _Queued(batch, cost, next(self._seq), item, now, exclusive)
        heapq.heappush(self._heap, q)
        self._keys[id(item)] = (q.batch, q.cost, q.seq)
        self._changed.set()
        return self._batch

    def order_of(self, item: Any) -> tuple:
        """The order key (batch, cost, seq) of a queued item; () if not queued."""
        return self._keys.get(id(item), ())

    def poke(self) -> None:
        """Something changed that may let a document start (room in the engine)."""
        self._changed.set()

    @property
    def queued(self) -> int:
        return len(self._heap)

    def remove(self, pred: Callable[[Any], bool]) -> list[Any]:
        """Take queued (not yet started) documents out, e.g. of a removed inbox."""
        keep, gone = [], []
        for q in self._heap:
            (gone if pred(q.item) else keep).append(q)
        self._heap = keep
        heapq.heapify(self._heap)
        for q in gone:
            self._keys.pop(id(q.item), None)
        return [q.item for q in gone]

    def _has_room(self) -> bool:
        return self.room is not None and len(self.active) < self.room_limit and self.room()

    def _eligible(self) -> _Queued | None:
        if not self._heap or not self.accepting:
            return None
        roomy = self._has_room()
        if len(self.active) >= self.max_active and not roomy:
            return None
        head = self._heap[0]
        if self._exclusive or (head.exclusive and self.active):
            return None
        # A batch is started once its window has closed, so its smallest file goes first;
        # with nothing active there is nothing to reorder against, and with room in the
        # engine starting now delays no one: start at once.
        if not self.active or roomy or self.clock() >= self._batch_close.get(head.batch, 0):
            q = heapq.heappop(self._heap)
            self._keys.pop(id(q.item), None)
            return q
        return None

    async def run(self) -> None:
        while True:
            self._changed.clear()
            while (q := self._eligible()) is not None:
                task = asyncio.create_task(self.run_doc(q.item), name="document")
                self.active[task] = q.item
                if q.exclusive:
                    self._exclusive.add(task)
                task.add_done_callback(self._done)
                # Let the document begin, and count its first pages as on their way,
                # before room is judged again: otherwise one pass would start every
                # queued file while the engine still looks empty.
                await asyncio.sleep(0)
            timeout = None
            if self._heap and self.active:
                # Only an open window passes with time; once it has closed, what lets a
                # document start is an event (one finishes, room appears, a submit):
                # no need to poll every 10 ms behind a long queue.
                wait = self._batch_close.get(self._heap[0].batch, 0) - self.clock()
                if wait > 0:
                    timeout = max(0.01, wait)
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the
            # cancellation that stops this loop when it races with the event
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait()

    def _done(self, task: asyncio.Task) -> None:
        self.active.pop(task, None)
        self._exclusive.discard(task)
        self._changed.set()

    async def drain(self, timeout: float) -> bool:
        """Stop starting documents; wait for the active ones up to `timeout` seconds (0:
        not at all — stop now). True if all finished."""
        self.accepting = False
        if not self.active:
            return True
        if timeout <= 0:
            return False
        _, pending = await asyncio.wait(list(self.active), timeout=timeout)
        return not pending
