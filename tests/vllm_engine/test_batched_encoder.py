"""`engine.vllm.batch_encoder: true` through ocrd's in-process engine on the real vLLM
engine (CPU build, tiny DeepSeek-OCR-2 in bf16, as served): the step's pages are
encoded together in padded calls of a fixed size (`OCRD_VLLM_ENCODER_BUCKETS=0`), and a
page's text still does not depend on the pages that share its engine steps. (The
default call sizes, tested in test_fast_encoder.py, give up that guarantee.)

Without the padding (calls of whatever size the step gives) the same image alone and
among four others gives a different text here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fdlog import output_into  # tests/vllm_engine, on sys.path (conftest.py)
from needs import require_vllm
from PIL import Image

require_vllm()

from test_vllm_engine import noise  # noqa: E402

from ocrd.config.settings import EngineConfig  # noqa: E402
from ocrd.engines.base import PageRequest  # noqa: E402
from ocrd.engines.vllm.inprocess import VllmEngine  # noqa: E402
from ocrd.vllm_model import plugin, switches  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def batched(tiny_config: Callable[..., EngineConfig], loop_thread: Any,
            vllm_env: dict[str, str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmEngine, Path]]:
    """The engine, and the file its engine core (a process vLLM spawns while starting)
    writes its log to: this process's stdout and stderr point there during the start."""
    mp = pytest.MonkeyPatch()
    # 2 global views and 4 tiles per call: with 5 pages the calls are chunked and the
    # last ones padded (A4 pages: 6 tiles each)
    mp.setenv(switches.CHUNKS_ENV, "2x4")
    mp.setenv(switches.BUCKETS_ENV, "0")  # every call of the full size
    # the engine core's INFO lines (ocrd's logging setup, run by earlier tests, turns
    # vLLM's own logging off in this process's environment)
    mp.setenv("VLLM_CONFIGURE_LOGGING", "1")
    cfg = tiny_config(max_tokens=48, loop_retries=0)
    cfg = cfg.model_copy(update={"vllm": cfg.vllm.model_copy(update={"batch_encoder": True})})
    eng = VllmEngine(cfg)
    log = tmp_path_factory.mktemp("batched") / "engine_core.log"
    try:
        with output_into(log):
            loop_thread.run(eng.start())
        yield eng, log
        loop_thread.run(eng.close())
    finally:
        mp.undo()


def test_batched_mode_is_what_the_engine_built(batched: tuple[VllmEngine, Path]) -> None:
    eng, log = batched
    built = [line for line in log.read_text().splitlines() if plugin.LOADED_MARK in line]
    assert built, log.read_text()[-3000:]
    assert "pages batched, 2 global views and 4 tiles per call" in built[-1]
    assert eng.describe()["fast_encoder"] is True


def test_a_page_reads_the_same_alone_and_among_others(
        batched: tuple[VllmEngine, Path], loop_thread: Any) -> None:
    eng, _ = batched
    # small pages (257 image tokens): several share an engine step here (an A4 page's
    # 1,121 would fill the CPU engine's step alone). Without the padding page 1 read
    # differently alone (checked).
    images = [Image.new("RGB", (640, 480), (v, v, v)) for v in (0, 127, 255)]
    images += [noise(100), noise(101)]

    async def together() -> list[str]:
        outs = await asyncio.gather(*(eng.ocr(PageRequest(image=im, page_no=i, doc_id="d"))
                                      for i, im in enumerate(images)))
        return [o.text for o in outs]

    texts = loop_thread.run(together())
    assert len(set(texts)) >= 4, texts  # the pixels reached the model
    for i in (1, 3, 4):
        alone = loop_thread.run(eng.ocr(PageRequest(image=images[i], page_no=9, doc_id="e")))
        assert alone.text == texts[i], i
