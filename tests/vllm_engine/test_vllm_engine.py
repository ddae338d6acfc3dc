"""VllmEngine on the real vLLM engine (CPU build) with a tiny DeepSeek-OCR-2 and generated weights.

One engine serves the whole module (a start costs 10-17 s here); the last test closes it
while pages are in flight. Outputs are random-weight gibberish: the tests check what the
engine does with pages (batching, tiling, retries, aborts), not OCR quality.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from PIL import Image

from ocrd.config.settings import EngineConfig
from ocrd.engines.base import PageRequest
from ocrd.engines.deepseek_ocr2 import attempt_settings
from ocrd.engines.vllm.inprocess import VllmEngine
from ocrd.errors import EngineUnavailable
from ocrd.outputs.page import PageOutput

pytestmark = pytest.mark.vllm

# DeepSeek-OCR-2's image tokens: 256 + 1 for a page <= 768 px, plus 144 per 768 px tile
# (A4 at 144 dpi: 2x3 tiles) -- shared/notes/deepseek-ocr2.md.
SMALL_PAGE_IMAGE_TOKENS = 257
A4_PAGE_IMAGE_TOKENS = 1121
START_FACTS: dict[str, float] = {}  # filled by the engine fixture


def noise(seed: int, w: int = 640, h: int = 480) -> Image.Image:
    """Random pixels: every seed a different page (vLLM would share work on equal ones)."""
    return Image.frombytes("RGB", (w, h), random.Random(seed).randbytes(w * h * 3))


def as_page(image: Image.Image, n: int = 1, doc_id: str = "doc") -> PageRequest:
    return PageRequest(image=image, page_no=n, doc_id=doc_id)


@pytest.fixture(scope="module")
def engine(tiny_config: Callable[..., EngineConfig],
           loop_thread: Any) -> Iterator[VllmEngine]:
    eng = VllmEngine(tiny_config(max_tokens=48, loop_retries=0))

    async def start_watching_the_loop() -> float:
        """Start the engine; the longest the event loop was unresponsive meanwhile."""
        gaps = [0.0]

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        try:
            await eng.start()
        finally:
            ticker.cancel()
        return max(gaps)

    t0 = time.monotonic()
    START_FACTS["loop_gap"] = loop_thread.run(start_watching_the_loop())
    START_FACTS["seconds"] = time.monotonic() - t0
    print(f"\nvLLM engine start: {START_FACTS['seconds']:.1f} s "
          f"(event loop blocked at most {START_FACTS['loop_gap']:.2f} s)")
    yield eng
    loop_thread.run(eng.close())


@contextlib.contextmanager
def settings(engine: VllmEngine, **changes: Any) -> Iterator[None]:
    """Other EngineConfig values for a test (ocr() reads engine.cfg on every call)."""
    before = engine.cfg
    engine.cfg = before.model_copy(update=changes)
    try:
        yield
    finally:
        engine.cfg = before


def test_engine_has_the_recipe_settings_and_a_sound_head_dim(engine: VllmEngine,
                                                             loop_thread: Any) -> None:
    llm = engine._engine
    assert loop_thread.run(engine.health()) is True
    # vLLM's import and AsyncLLM's constructor ran in threads: the loop stayed responsive
    assert START_FACTS["loop_gap"] < min(2.0, START_FACTS["seconds"] / 3)
    info = engine.describe()
    assert info["kind"] == "vllm" and info["vllm"] and info["dtype"] == "bfloat16"
    assert engine.max_concurrency == 4 and engine.output_format == "grounding"
    assert llm.vllm_config.cache_config.enable_prefix_caching is False
    assert llm.model_config.multimodal_config.mm_processor_cache_gb == 0
    assert llm.model_config.multimodal_config.get_limit_per_prompt("image") == 1
    # transformers 5 reads head_dim 0 from DeepSeek-OCR-2's config; the guard made it
    # hidden_size // num_heads (128 // 4), which is what this vLLM computes itself too.
    assert llm.model_config.hf_text_config.head_dim == 32
    assert llm.model_config.get_head_size() == 32
    assert info["head_dim_override"] == 32


def test_several_pages_in_flight_at_once(engine: VllmEngine, loop_thread: Any) -> None:
    async def run() -> tuple[list[PageOutput], int, float]:
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, engine.unfinished_requests())
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        t0 = time.monotonic()
        outs = await asyncio.gather(*(engine.ocr(as_page(noise(i), i, f"file{i}"))
                                      for i in range(4)))
        seconds = time.monotonic() - t0
        watcher.cancel()
        return outs, peak, seconds

    outs, peak, seconds = loop_thread.run(run())
    print(f"\n4 pages at once: {seconds:.2f} s; per page: "
          + ", ".join(f"{o.seconds:.2f}" for o in outs))
    assert peak >= 2  # the engine itself held several files' pages at once
    # The engine core's own clock: pages scheduled before others finished decoding, i.e.
    # decoded in the same batches (continuous batching).
    spans = [(o.extra["engine_scheduled_ts"], o.extra["engine_last_token_ts"]) for o in outs]
    overlapping = sum(1 for a in spans for b in spans if a is not b
                      and a[0] < b[1] and b[0] < a[1])
    assert overlapping >= 2
    for o in outs:
        assert o.attempts == 1 and 1 <= o.tokens <= 48 and o.prompt_tokens
        assert o.finished_at >= o.started_at


def test_tiled_and_small_pages(engine: VllmEngine, loop_thread: Any) -> None:
    a4 = noise(7, 1191, 1684)  # A4 at 144 dpi: 2x3 tiles of 768 px + the global view
    small = noise(8, 640, 480)
    square = noise(9, 768, 768)  # the largest page without tiles
    t0 = time.monotonic()
    out_a4 = loop_thread.run(engine.ocr(as_page(a4)))
    print(f"\ntiled page: {time.monotonic() - t0:.2f} s, {out_a4.prompt_tokens} prompt tokens")
    out_small = loop_thread.run(engine.ocr(as_page(small)))
    out_square = loop_thread.run(engine.ocr(as_page(square)))
    assert out_small.prompt_tokens == out_square.prompt_tokens
    assert out_a4.prompt_tokens - out_small.prompt_tokens == (
        A4_PAGE_IMAGE_TOKENS - SMALL_PAGE_IMAGE_TOKENS)
    assert out_small.prompt_tokens > SMALL_PAGE_IMAGE_TOKENS  # plus the prompt's text


def test_different_images_give_different_outputs(engine: VllmEngine, loop_thread: Any) -> None:
    images = [Image.new("RGB", (640, 480), (v, v, v)) for v in (0, 127, 255)]
    images += [noise(100), noise(101)]

    async def run() -> list[PageOutput]:
        return list(await asyncio.gather(*(engine.ocr(as_page(im, i))
                                           for i, im in enumerate(images))))

    texts = [o.text for o in loop_thread.run(run())]
    assert len(set(texts)) >= 4, texts  # the pixels reached the model
    # and the same image gives the same text (temperature 0) when it is read the same
    # way: alone, twice. Alone against among five is not compared: vLLM does not promise
    # batch invariance (its CPU build's kernels differ by batch size), and a CI run saw
    # the two differ (issue 14.9); test_batched_encoder.py checks the padded encoder's
    # own guarantee.
    alone = [loop_thread.run(engine.ocr(as_page(images[3], 9))).text for _ in range(2)]
    assert alone[0] == alone[1], alone


def test_loop_is_retried_and_the_page_kept(engine: VllmEngine, loop_thread: Any) -> None:
    # 3 tokens cannot reach the end of any page: every try ends with "length"
    with settings(engine, max_tokens=3, loop_retries=2):
        out = loop_thread.run(engine.ocr(as_page(noise(1))))
        retry = engine._params(engine._api, attempt_settings(engine.cfg.deepseek_ocr2.ngram, 2))
    assert out.attempts == 3 and out.finish_reason == "length"
    assert out.extra["attempt_finish_reasons"] == ["length"] * 3
    assert out.degraded and "length" in out.degraded
    assert out.tokens == 3 and out.text  # the text is kept, not dropped
    # retries ask for tighter n-gram bans and, on vLLM >= 0.19, early loop detection
    assert retry.extra_args["ngram_size"] == 15 and retry.extra_args["window_size"] == 180
    assert retry.repetition_detection is not None
    assert retry.skip_special_tokens is False and retry.temperature == 0


def test_cancelling_pages_aborts_their_requests(engine: VllmEngine, loop_thread: Any) -> None:
    async def run() -> tuple[list[Any], float, PageOutput]:
        tasks = [asyncio.create_task(engine.ocr(as_page(noise(200 + i, 1191, 1684), i)))
                 for i in range(8)]
        deadline = time.monotonic() + 60
        while engine.unfinished_requests() < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert engine.unfinished_requests() >= 1
        t0 = time.monotonic()
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        while engine.unfinished_requests() and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.01)
        seconds = time.monotonic() - t0
        after = await engine.ocr(as_page(noise(300)))  # the engine carries on
        return results, seconds, after

    results, seconds, after = loop_thread.run(run())
    assert sum(isinstance(r, asyncio.CancelledError) for r in results) >= 6
    assert engine.unfinished_requests() == 0 and seconds < 5
    assert after.tokens


def test_close_with_pages_in_flight_returns_promptly(engine: VllmEngine,
                                                     loop_thread: Any) -> None:
    """Last in this module: it shuts the module's engine down."""

    async def run() -> tuple[list[Any], float, float, bool]:
        tasks = [asyncio.create_task(engine.ocr(as_page(noise(400 + i, 1191, 1684), i)))
                 for i in range(8)]
        deadline = time.monotonic() + 60
        while engine.unfinished_requests() < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        await engine.close()
        close_seconds = time.monotonic() - t0
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        return results, close_seconds, time.monotonic() - t0, await engine.health()

    results, close_seconds, all_seconds, healthy = loop_thread.run(run())
    print(f"\nclose with pages in flight: {close_seconds:.1f} s")
    assert close_seconds < 20 and all_seconds < 30  # no hang
    assert all(isinstance(r, PageOutput | EngineUnavailable) for r in results), results
    assert any(isinstance(r, EngineUnavailable) for r in results)  # aborted, not failed
    assert healthy is False
    with pytest.raises(EngineUnavailable):
        loop_thread.run(engine.ocr(as_page(noise(1))))
