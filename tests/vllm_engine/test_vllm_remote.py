"""RemoteEngine against a real `vllm serve` (CPU build) of the tiny DeepSeek-OCR-2, on 127.0.0.1.

The server gets the recipe's flags (n-gram logits processor, no prefix caching, no
processor cache) plus the tiny CPU settings, and the test plugin through PYTHONPATH. It is
stopped and restarted to show that a server outage makes pages wait (EngineUnavailable),
not fail. The server runs in its own process group and is always killed at the end.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from serve import SERVED_NAME, VllmServer  # noqa: E402

from ocrd.config.settings import EngineConfig
from ocrd.engines.base import PageRequest
from ocrd.engines.deepseek_ocr2 import PROMPTS
from ocrd.engines.remote import RemoteEngine
from ocrd.engines.vllm.inprocess import VllmEngine
from ocrd.errors import EngineUnavailable
from ocrd.outputs.page import PageOutput

pytestmark = pytest.mark.vllm



def remote_config(url: str, **fields: Any) -> EngineConfig:
    return EngineConfig.model_validate({
        "kind": "remote", "model": SERVED_NAME,
        "remote": {"urls": [url], "concurrency_per_url": 4},
        "max_tokens": 48, "loop_retries": 0, **fields})


def noise(seed: int, w: int = 640, h: int = 480) -> PageRequest:
    img = Image.frombytes("RGB", (w, h), random.Random(seed).randbytes(w * h * 3))
    return PageRequest(image=img, page_no=seed, doc_id=f"doc{seed}")


def prompt_text_tokens(model_dir: Path) -> int:
    """BOS + the recipe prompt's text, without its one <image> token."""
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(str(model_dir))(PROMPTS["markdown"]).input_ids) - 1


def test_pages_through_vllm_serve(server: VllmServer, model_dir: Path) -> None:
    async def run() -> tuple[list[PageOutput], PageOutput, PageOutput, float]:
        engine = RemoteEngine(remote_config(server.url))
        looping = RemoteEngine(remote_config(server.url, max_tokens=3, loop_retries=1))
        try:
            await engine.start()
            assert await engine.health()
            t0 = time.monotonic()
            outs = await asyncio.gather(*(engine.ocr(noise(i)) for i in range(4)))
            seconds = time.monotonic() - t0
            tiled = await engine.ocr(noise(5, 1191, 1684))
            return outs, tiled, await looping.ocr(noise(6)), seconds
        finally:
            await engine.close()
            await looping.close()

    outs, tiled, looped, seconds = asyncio.run(run())
    print(f"\n4 pages through vllm serve: {seconds:.2f} s")
    # The server saw exactly the recipe's prompt: BOS, then the image's 257 tokens where
    # <image> stands, then the text (the chat template adds nothing else).
    text_tokens = prompt_text_tokens(model_dir)
    assert all(o.prompt_tokens == text_tokens + 257 for o in outs)
    assert tiled.prompt_tokens == text_tokens + 1121
    assert all(o.tokens and o.extra["server"] == server.url for o in outs)
    assert len({o.text for o in outs}) >= 3  # the image reached the model
    # the server accepted the retry's vllm_xargs and repetition_detection
    assert looped.attempts == 2 and looped.degraded and looped.tokens == 3


def test_remote_and_local_engines_agree(server: VllmServer,
                                        tiny_config: Callable[..., EngineConfig]) -> None:
    """Same weights (the plugin's generated ones), same page: the chat request through
    `vllm serve` gives the same text as the plain prompt in a local engine."""
    pages = [noise(10), noise(11, 1000, 700)]

    async def run() -> tuple[list[str], list[str]]:
        remote = RemoteEngine(remote_config(server.url))
        try:
            remote_texts = [(await remote.ocr(p)).text for p in pages]
        finally:
            await remote.close()
        local = VllmEngine(tiny_config(max_tokens=48, loop_retries=0))
        await local.start()
        try:
            local_texts = [(await local.ocr(p)).text for p in pages]
        finally:
            await local.close()
        return remote_texts, local_texts

    remote_texts, local_texts = asyncio.run(run())
    assert remote_texts == local_texts


def test_server_outage_pauses_pages_then_recovers(server: VllmServer) -> None:
    async def run() -> dict[str, Any]:
        engine = RemoteEngine(remote_config(server.url))
        try:
            facts: dict[str, Any] = {"before": await engine.ocr(noise(20))}
            await asyncio.to_thread(server.stop)
            t0 = time.monotonic()
            try:
                await engine.ocr(noise(21))
            except Exception as e:
                facts["down_error"] = e
            facts["down_seconds"] = time.monotonic() - t0
            facts["down_health"] = await engine.health()
            server.start()
            facts["restart_seconds"] = await asyncio.to_thread(server.wait_ready)
            facts["after"] = await engine.ocr(noise(22))  # the same engine, recovered
            facts["up_health"] = await engine.health()
            return facts
        finally:
            await engine.close()

    facts = asyncio.run(run())
    print(f"\nserver down -> EngineUnavailable after {facts['down_seconds']:.1f} s; "
          f"restart {facts['restart_seconds']:.1f} s")
    assert isinstance(facts["down_error"], EngineUnavailable)  # re-queued, not failed
    assert "connection refused" in str(facts["down_error"])
    assert facts["down_seconds"] < 15
    assert facts["down_health"] is False and facts["up_health"] is True
    assert facts["before"].tokens and facts["after"].tokens
