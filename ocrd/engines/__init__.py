"""Engines behind one small async interface (base.py); `create_engine` makes the one
`engine.kind` names — from the table of engines (config/engine.py's ENGINES) or a class
path of one's own — and `preflight` asks it what is wrong before it starts."""

from __future__ import annotations

import importlib.util
import os

import structlog

from ocrd.config.secrets import with_api_key
from ocrd.config.settings import ConfigError, EngineConfig
from ocrd.engines.base import Engine
from ocrd.engines.table import engine_class

log = structlog.get_logger("ocrd.engine")


def cuda_available() -> bool:
    """A CUDA GPU is visible, checked without importing torch when possible."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    if not any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/nvidiactl")):
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken torch means no usable GPU
        return False


def choose_kind(cfg: EngineConfig) -> tuple[str, str]:
    """The engine kind to use and why (for the log)."""
    if cfg.kind != "auto":
        return cfg.kind, "configured"
    if importlib.util.find_spec("vllm") is None:
        return "tesseract", "vllm is not installed"
    if not cuda_available():
        return "tesseract", "no CUDA GPU found"
    return "vllm", "vllm is installed and a CUDA GPU is present"


def create_engine(cfg: EngineConfig) -> Engine:
    """The engine the configuration names, made (not started)."""
    cfg = cfg.model_copy(update={"remote": with_api_key(cfg.remote)})  # engines read api_key
    kind, why = choose_kind(cfg)
    log.info("engine_chosen", engine=kind, reason=why, configured=cfg.kind)
    return engine_class(kind).create(cfg)


def preflight(cfg: EngineConfig) -> list[str]:
    """What is wrong with the engine `run` would start, found without starting it (no
    GPU, no server asked): one line per problem; check-config and the daemon's start
    both ask."""
    kind, _ = choose_kind(cfg)
    try:
        return engine_class(kind).preflight(cfg)
    except ConfigError as e:
        return list(e.problems)
