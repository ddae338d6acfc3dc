"""The simulated batching engine: pages that arrive together share steps, pages beyond
the batch wait, outputs describe their page. Assertions count the engine's steps and its
own modelled time, never the wall clock."""

from __future__ import annotations

import asyncio

import pytest
from PIL import Image, ImageDraw
from simulated_engines import SIMULATED, SimulatedEngine, decode_steps

from ocrd import errors
from ocrd.config.settings import EngineConfig
from ocrd.engines import create_engine
from ocrd.engines.base import PageRequest
from ocrd.outputs.page import PageOutput


def engine_cfg(**simulated: object) -> EngineConfig:
    base = {"step_seconds": 0.002, "step_per_page_seconds": 0.0,
            "prefill_seconds_per_megapixel": 0.0, "decode_steps": 10, "decode_jitter": 0.0}
    return EngineConfig.model_validate({"kind": SIMULATED,
                                        "options": {**base, **simulated}})


def page(n: int, doc: str = "doc-a") -> PageRequest:
    img = Image.new("RGB", (200 + n, 120), "white")
    ImageDraw.Draw(img).rectangle((n * 3, 10, n * 3 + 40, 60), fill="black")
    return PageRequest(image=img, page_no=n, doc_id=doc)


async def run_pages(engine: SimulatedEngine, pages: list[PageRequest]) -> list[PageOutput]:
    await engine.start()
    try:
        return await asyncio.gather(*(engine.ocr(p) for p in pages))
    finally:
        await engine.close()


def test_create_engine_builds_the_simulated_engine() -> None:
    engine = create_engine(engine_cfg(max_batch=5))
    assert isinstance(engine, SimulatedEngine)
    # a small queue beyond the batch, so a freed place is refilled at the next step
    assert engine.max_concurrency > 5
    assert create_engine(engine_cfg(max_batch=5, concurrency=7)).max_concurrency == 7


def test_concurrent_pages_share_steps_instead_of_queueing() -> None:
    together = SimulatedEngine(engine_cfg(max_batch=8))
    outs = asyncio.run(run_pages(together, [page(i) for i in range(1, 9)]))

    one_by_one = SimulatedEngine(engine_cfg(max_batch=8))

    async def sequential() -> None:
        await one_by_one.start()
        try:
            for i in range(1, 9):
                await one_by_one.ocr(page(i))
        finally:
            await one_by_one.close()

    asyncio.run(sequential())
    # 8 pages of 10 tokens: one after the other 80 steps; together ~10 (the first step
    # may start before every page has arrived, so allow a few more).
    assert one_by_one.stats.steps == 80
    assert together.stats.steps <= 13
    assert together.stats.max_batch_seen == 8
    # the engine's modelled time, not the wall clock
    assert together.stats.busy_seconds < one_by_one.stats.busy_seconds / 4
    assert [o.tokens for o in outs] == [10] * 8
    assert {o.finish_reason for o in outs} == {"stop"}


def test_pages_beyond_max_batch_wait_in_the_queue() -> None:
    engine = SimulatedEngine(engine_cfg(max_batch=4, step_seconds=0.01))
    outs = asyncio.run(run_pages(engine, [page(i) for i in range(1, 11)]))
    stats = engine.stats
    assert len(outs) == 10 and stats.pages_done == 10
    assert stats.max_batch_seen == 4  # never more than max_batch at once
    assert stats.max_queued >= 5  # the others waited inside the engine
    # 10 pages × 10 tokens at 4 per step: at least 25 steps
    assert stats.steps >= 25
    # a page that waited in the queue reports it
    assert max(o.extra["queued_seconds"] for o in outs) > 0


def test_output_describes_its_page() -> None:
    engine = SimulatedEngine(engine_cfg(max_batch=4))
    outs = asyncio.run(run_pages(engine, [page(1), page(2), page(1, doc="doc-b")]))
    assert "page 1" in outs[0].text and "201×120" in outs[0].text
    assert "page 2" in outs[1].text
    assert len({o.text for o in outs}) == 3  # different pages, different text


def test_decode_steps_vary_per_page_but_repeat_exactly() -> None:
    got = [decode_steps(100, 0.5, "doc", n) for n in range(1, 41)]
    assert got == [decode_steps(100, 0.5, "doc", n) for n in range(1, 41)]
    assert all(50 <= g <= 150 for g in got)
    assert len(set(got)) > 10
    assert decode_steps(100, 0.0, "doc", 3) == 100


def test_a_cancelled_page_leaves_the_batch() -> None:
    engine = SimulatedEngine(engine_cfg(max_batch=2, decode_steps=200, step_seconds=0.001))

    async def scenario() -> PageOutput:
        await engine.start()
        try:
            stuck = asyncio.create_task(engine.ocr(page(1)))
            await asyncio.sleep(0.02)
            stuck.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stuck
            return await engine.ocr(PageRequest(image=page(2).image, page_no=2, doc_id="b"))
        finally:
            await engine.close()

    out = asyncio.run(scenario())
    assert out.tokens == 200
    # the cancelled page stopped taking steps: it started earlier with as many tokens,
    # so it would have finished first had it stayed in the batch
    assert engine.stats.pages_done == 1


def test_instant_answers_without_steps() -> None:
    engine = SimulatedEngine(engine_cfg(instant=True))
    outs = asyncio.run(run_pages(engine, [page(i) for i in range(1, 6)]))
    assert engine.stats.steps == 0 and engine.stats.pages_done == 5
    assert all(o.finish_reason == "stop" and o.tokens == 10 for o in outs)


def test_close_fails_pages_still_in_the_engine() -> None:
    engine = SimulatedEngine(engine_cfg(decode_steps=10_000))

    async def scenario() -> None:
        await engine.start()
        task = asyncio.create_task(engine.ocr(page(1)))
        await asyncio.sleep(0.02)
        await engine.close()
        with pytest.raises(errors.EngineDead):
            await task
        with pytest.raises(errors.EngineDead):
            await engine.ocr(page(2))

    asyncio.run(scenario())
