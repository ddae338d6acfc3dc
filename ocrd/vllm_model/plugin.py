"""ocrd's vLLM plugin: the fast DeepSeek-OCR-2 encoder (ocrd/vllm_model/dsocr2_fast.py).

vLLM calls `register()` in every process it starts (entry point group
`vllm.general_plugins`, declared in pyproject.toml), including the engine core that
builds the model and every `vllm serve` process. It does something only where ocrd asked
for it through the environment (`OCRD_VLLM_FAST_ENCODER=1|batched|auto` after
`engine.vllm.batch_encoder`, set by the in-process engine and the managed server when
`engine.vllm.fast_encoder` is on; `OCRD_VLLM_START_LOCK`, set by the managed engine for
servers that share GPUs and start at once: start_gate.py), so other vLLM users on the same
machine are left alone.
This module imports nothing heavy: vLLM imports the model class lazily, when it builds
that architecture.

Modes (the variable's value): "1" page by page, "batched" the step's pages together,
"auto" batched where the model runs on a GPU and page by page elsewhere (padded calls
only pay where there is parallel hardware to fill).
"""

from __future__ import annotations

import importlib.util
import os
from importlib import metadata

ENV = "OCRD_VLLM_FAST_ENCODER"
# "uint8": ocrd's model class hands the page views over as uint8 (dsocr2_pixels.py)
PIXELS_ENV = "OCRD_VLLM_PIXELS"
# a lock file: the engine core sizes its memory inside it (start_gate.py; its ENV)
START_LOCK_ENV = "OCRD_VLLM_START_LOCK"
BATCHED = "batched"
AUTO = "auto"
ARCHITECTURE = "DeepseekOCR2ForCausalLM"
MODEL_CLASS = "ocrd.vllm_model.dsocr2_fast:FastDeepseekOCR2ForCausalLM"
VLLM_CLASS = "vllm.model_executor.models.deepseek_ocr2:DeepseekOCR2ForCausalLM"
ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT = "ocrd_fast_encoder"
# logged by the model class when vLLM builds it (the managed server's output shows it)
LOADED_MARK = "ocrd fast DeepSeek-OCR-2 encoder"


def register() -> None:
    """vllm.general_plugins entry point."""
    if os.environ.get(ENV) in ("1", BATCHED, AUTO) and has_model_code():
        use(True)
    gate = os.environ.get(START_LOCK_ENV)
    if gate:
        from ocrd.vllm_model import start_gate

        try:
            start_gate.install(gate)
        except Exception as e:  # noqa: BLE001 - another vLLM's layout: start ungated
            start_gate.logger.warning("ocrd start gate not installed: %r", e)


def has_model_code() -> bool:
    """Whether this vLLM has DeepSeek-OCR-2's model code to build on (without importing
    it: this runs in every vLLM process)."""
    try:
        return importlib.util.find_spec(VLLM_CLASS.partition(":")[0]) is not None
    except (ImportError, ValueError):
        return False


def use(fast: bool) -> None:
    """Make vLLM build DeepSeek-OCR-2 with ocrd's fast encoder, or with its own code, in
    this process (an engine core that runs in-process follows it)."""
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS if fast else VLLM_CLASS)


def installed() -> bool:
    """Whether vLLM can find this plugin (ocrd installed with its entry points, e.g.
    `pip install .`; a bare PYTHONPATH checkout has none)."""
    try:
        points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # noqa: BLE001 - broken metadata elsewhere: treat as absent
        return False
    return any(p.name == ENTRY_POINT and p.value.startswith(__name__) for p in points)


def environment(enabled: bool, batched: bool | None = None,
                uint8_pixels: bool = True) -> dict[str, str]:
    """The variables for vLLM processes ocrd starts: "1" encodes page by page, "batched"
    the step's pages together, "auto" (batched None) batched on a GPU, "0" leaves vLLM's
    model alone; page views as uint8 or float (ocrd's model class only)."""
    pixels = {PIXELS_ENV: "uint8" if enabled and uint8_pixels else "float"}
    if not enabled:
        return {ENV: "0", **pixels}
    return {ENV: AUTO if batched is None else BATCHED if batched else "1", **pixels}
