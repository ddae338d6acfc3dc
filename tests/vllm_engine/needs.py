"""For test modules that import vLLM at their top: skip without vLLM, as the fixtures in
conftest.py do, but fail instead where OCRD_REQUIRE_VLLM=1 (CI)."""

from __future__ import annotations

import importlib
import os

import pytest


def require_vllm() -> None:
    try:
        importlib.import_module("torch")
        importlib.import_module("vllm")
    except ImportError as e:
        message = f"vLLM is not importable ({e}); run scripts/setup-vllm-cpu.sh VENV"
        if os.environ.get("OCRD_REQUIRE_VLLM") == "1":
            raise RuntimeError(f"OCRD_REQUIRE_VLLM=1 but {message}") from e
        pytest.skip(message, allow_module_level=True)
