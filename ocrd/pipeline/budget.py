"""The memory budget for page images (`limits.memory_bytes`): what pages cost from the
moment they are rendered until the engine is done with them, across all documents.

A per-page pixel limit alone does not bound memory: one 35,000 × 35,000 px scan, or
several at once, held as RGB and copied on the way, take gigabytes. Here every page
reserves its cost (its pixels × what its engine keeps per pixel, for its mode) before it
is rendered and holds it until the engine has finished it; and no page may cost more
than the whole budget (it is rendered at a lower dpi instead: `Resolution.page_budget`).
The processes' own memory (Python, PDFium, tesseract's language data) comes on top.
"""

from __future__ import annotations

import asyncio
import collections

# limits.memory_bytes: null: at least this, and the most one page may cost
AUTO_FLOOR = 1024**3
# ... and room for this many A4 pages per page slot: the pages in the engine, pages
# rendered ahead waiting for a slot, pages a little larger than A4 (Letter is narrower
# but a scan's margins are not)
AUTO_PAGES_PER_SLOT = 1.25


def sizes(setting: int | None, pages_in_flight: int, a4_cost: int) -> tuple[int, int]:
    """(the budget, the most one page may cost) for `limits.memory_bytes`: as set; or,
    when unset, 1 GiB raised to what the engine's pages in flight cost as A4 pages (with
    a quarter more for pages rendered ahead), one page at most 1 GiB. A GPU engine keeps
    hundreds of pages in flight; a fixed 1 GiB held far fewer in flight and left the GPU
    starved, while a page's own cap stays where large scans'
    memory stays bounded."""
    if setting is not None:
        return setting, setting
    return max(AUTO_FLOOR, int(AUTO_PAGES_PER_SLOT * pages_in_flight * a4_cost)), AUTO_FLOOR


class MemoryBudget:
    """An asynchronous byte semaphore, first come first served (a large page is not
    starved by a stream of small ones). A request larger than the whole budget waits
    until it has the budget to itself."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self.peak = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = \
            collections.deque()

    def resize(self, total: int) -> None:
        """A reloaded `limits.memory_bytes`: pages already holding more keep it until done."""
        self.total = total
        self._wake()

    def _fits(self, n: int) -> bool:
        return self.used + n <= self.total or self.used == 0

    async def acquire(self, n: int) -> int:
        """Reserve n bytes (at most the whole budget); returns what was reserved."""
        n = max(0, min(n, self.total))
        if not self._waiters and self._fits(n):
            self._take(n)
            return n
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiters.append(entry)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(n)  # granted as we were cancelled: give it back
            else:
                self._waiters.remove(entry)
                self._wake()
            raise
        return n

    def _take(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def release(self, n: int) -> None:
        self.used = max(0, self.used - n)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            n, fut = self._waiters.popleft()
            if fut.done():
                continue
            self._take(n)
            fut.set_result(None)


class Reservation:
    """One page's hold on the budget: a guess before it is rendered, its true cost once
    its size and mode are known."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.held = 0

    async def reserve(self, n: int) -> None:
        self.held = await self.budget.acquire(n)

    async def settle(self, n: int) -> None:
        """Hold exactly n bytes: give back the excess, or queue again for more (holding
        nothing meanwhile, so that pages waiting for more cannot block each other)."""
        n = min(n, self.budget.total)
        if n < self.held:
            self.budget.release(self.held - n)
            self.held = n
        elif n > self.held:
            self.release()
            self.held = await self.budget.acquire(n)

    def release(self) -> None:
        if self.held:
            self.budget.release(self.held)
            self.held = 0
