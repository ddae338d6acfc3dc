"""VllmEngine when vLLM's engine core dies (as after a GPU fault): EngineDead, not a page failure.

The daemon exits non-zero on EngineDead and leaves its pages claimed, so that systemd's
restart picks them up again. Here the real engine core is killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from PIL import Image

from ocrd.config.settings import EngineConfig
from ocrd.engines.base import PageRequest
from ocrd.engines.vllm.inprocess import VllmEngine
from ocrd.errors import EngineDead

pytestmark = pytest.mark.vllm


def page(seed: int) -> PageRequest:
    img = Image.frombytes("RGB", (640, 480), random.Random(seed).randbytes(640 * 480 * 3))
    return PageRequest(image=img, page_no=1, doc_id="doc")


def engine_core_processes() -> list[Any]:
    """This test's vLLM engine core (vLLM names its process VLLM::EngineCore)."""
    import psutil  # comes with vLLM

    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a child that is already gone
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                found.append(child)
    return found


def test_dead_engine_core_raises_engine_dead(tiny_config: Callable[..., EngineConfig]) -> None:
    async def run() -> dict[str, Any]:
        engine = VllmEngine(tiny_config(max_tokens=16, loop_retries=0))
        await engine.start()
        facts: dict[str, Any] = {}
        try:
            facts["before"] = await engine.ocr(page(1))
            cores = engine_core_processes()
            facts["cores"] = len(cores)
            for proc in cores:
                proc.kill()
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(engine.ocr(page(2)), 60)
            except Exception as e:
                facts["error"] = e
            facts["seconds"] = time.monotonic() - t0
            facts["health"] = await engine.health()
            try:
                await engine.ocr(page(3))
            except Exception as e:
                facts["again"] = e
        finally:
            t0 = time.monotonic()
            await engine.close()
            facts["close_seconds"] = time.monotonic() - t0
        return facts

    facts = asyncio.run(run())
    print(f"\nengine core killed -> EngineDead after {facts['seconds']:.1f} s; "
          f"close {facts['close_seconds']:.1f} s")
    assert facts["before"].tokens and facts["cores"] == 1
    assert isinstance(facts.get("error"), EngineDead), facts.get("error")
    assert isinstance(facts.get("again"), EngineDead)
    assert facts["health"] is False
    assert facts["seconds"] < 30 and facts["close_seconds"] < 30
