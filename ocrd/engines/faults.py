"""TESTING ONLY: fault injection around a real engine, for the reliability tests
(`engine.testing_faults`; never set in production).

Faults are deterministic (every N-th page of this run), so a test knows what to expect:
errors the daemon must retry, hangs it must time out, garbage it must still turn into a
document, death it must survive by exiting and resuming, and an unreachable engine it
must wait for without failing pages.
"""

from __future__ import annotations

import asyncio
import random
import time

from ocrd.config.engine import TestingFaultsConfig
from ocrd.engines.base import Engine, PageRequest
from ocrd.errors import EngineDead, EngineUnavailable
from ocrd.outputs.page import PageOutput


class FaultyEngine(Engine):
    def __init__(self, inner: Engine, faults: TestingFaultsConfig) -> None:
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
