"""The wall clock steps (NTP, an admin's `date -s`): durations come from the monotonic
clock, timestamps from the wall clock, so a step back of an hour in the middle of a
conversion gives no negative seconds, and the sidecar still matches its schema.

The step is made in this process only (time.time patched: a fake clock), never to the
machine's clock; everything else is real: PDFium in the render workers, the simulated
engine's stepping thread, the outbox."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from helpers import make_pdf, sentence_lines
from record_schemas import SIDECAR, valid
from simulated_engines import SIMULATED

from ocrd import safefs
from ocrd.config.load import parse_config
from ocrd.engines import create_engine
from ocrd.outputs import destinations
from ocrd.pipeline.document import Converter
from ocrd.pipeline.schedule import FairSlots
from ocrd.pipeline.source import Source
from ocrd.render.pool import RenderPool

pytestmark = [pytest.mark.reliability]

STEP_BACK = 3600.0


class SteppedWallClock:
    """time.time() as the system gives it, until `step()`: then an hour earlier."""

    def __init__(self) -> None:
        self.real = time.time
        self.offset = 0.0

    def __call__(self) -> float:
        return self.real() + self.offset

    def step(self) -> None:
        self.offset = -STEP_BACK


def test_a_wall_clock_step_back_fake_clock_gives_no_negative_durations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = make_pdf(tmp_path / "a.pdf", [sentence_lines(1, 3), sentence_lines(2, 3)])
    cfg = parse_config({"state_dir": str(tmp_path), "metrics": {"listen": None},
                        "engine": {"kind": SIMULATED,
                                   "options": {"decode_steps": 40,
                                                 "step_seconds": 0.01}}}, tmp_path)
    clock = SteppedWallClock()
    monkeypatch.setattr(time, "time", clock)

    async def scenario() -> dict:
        engine = create_engine(cfg.engine)
        await engine.start()
        pool = RenderPool(1)
        await pool.start()
        ocr = engine.ocr

        async def ocr_with_a_step(page):  # noqa: ANN001, ANN202
            # the clock steps back while the engine works on the page
            asyncio.get_running_loop().call_later(0.05, clock.step)
            return await ocr(page)

        engine.ocr = ocr_with_a_step  # type: ignore[method-assign]
        conv = Converter(cfg, engine, pool, FairSlots(2))
        fd = os.open(doc, os.O_RDONLY)
        try:
            with safefs.Dir.open_root(tmp_path / "out", create=True) as out:
                written = await conv.convert(Source(fd, "a.pdf"), out, destinations.Perms())
        finally:
            os.close(fd)
            await engine.close()
            await pool.close()
        return written.meta

    meta = asyncio.run(scenario())
    assert clock.offset == -STEP_BACK  # the step did happen during the conversion
    side = json.loads((tmp_path / "out" / "a.json").read_text())
    assert side == json.loads(json.dumps(meta))
    valid(SIDECAR, side)
    assert side["timings"]["seconds"] >= 0
    for page in side["pages"]:
        assert page["engine_seconds"] >= 0 and page["render_seconds"] >= 0, page
