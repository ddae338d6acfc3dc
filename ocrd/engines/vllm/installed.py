"""Whether the vLLM engine could start here, found without a GPU and without importing
vLLM (seconds, and gigabytes in the daemon's process where the servers run apart):
vLLM installed in ocrd's environment and new enough for DeepSeek-OCR-2, and a model
named as a local folder there. Both vLLM engines' `preflight`."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from ocrd.config.engine import EngineConfig

# vLLM >= 0.16 has DeepseekOCR2ForCausalLM
OLDEST = (0, 16)
INSTALL = "pip install 'ocr-inbox-daemon[vllm]'"


def problems(cfg: EngineConfig) -> list[str]:
    """One line per problem, naming the key."""
    out = []
    if importlib.util.find_spec("vllm") is None:
        out.append(f"engine.kind = 'vllm': vLLM is not installed in ocrd's environment "
                   f"({INSTALL}; or engine.kind: tesseract)")
    else:
        version = _version()
        if version is not None and version < OLDEST:
            out.append(f"engine.kind = 'vllm': vLLM {'.'.join(map(str, version))} is too old "
                       f"for DeepSeek-OCR-2 (needs {'.'.join(map(str, OLDEST))} or newer: "
                       f"{INSTALL} --upgrade)")
    model = cfg.model
    if model.startswith(("/", "./", "../", "~")):
        folder = Path(model).expanduser()
        if not (folder / "config.json").is_file():
            out.append(f"engine.model = {model!r}: not a model folder (no config.json there); "
                       "a Hugging Face id such as 'deepseek-ai/DeepSeek-OCR-2' is fetched "
                       "at the first start")
    return out


def _version() -> tuple[int, ...] | None:
    """vLLM's version as numbers (its CPU build's distribution has another name: then
    None, and no judgement)."""
    try:
        text = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts)
