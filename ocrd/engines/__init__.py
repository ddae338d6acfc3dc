"""Engines behind one small async interface; `create_engine` picks one from the config."""

from __future__ import annotations

import importlib.util
import os

import structlog

from ocrd.config.secrets import with_api_key
from ocrd.config.settings import EngineConfig
from ocrd.engines.base import Engine, PageRequest
from ocrd.outputs.page import PageOutput

__all__ = ["Engine", "PageOutput", "PageRequest", "choose_kind", "create_engine", "preflight",
           "with_profile"]

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


def with_profile(cfg: EngineConfig) -> EngineConfig:
    """The engine config with engine.vllm's profile applied (ocrd/engines/vllm/profile.py);
    ConfigError names a configured key that the chosen layout cannot take."""
    from pydantic import ValidationError

    from ocrd.config.check import describe_error
    from ocrd.config.engine import VllmConfig
    from ocrd.config.settings import ConfigError
    from ocrd.engines.vllm import profile as gpu_profile

    try:
        vllm, profile = gpu_profile.resolve(cfg.vllm)
    except ValidationError as e:
        raise ConfigError(*(describe_error(VllmConfig, err, ("engine", "vllm"))
                            for err in e.errors())) from None
    overridden = sorted(k for k in profile.settings if k in cfg.vllm.model_fields_set)
    log.info("vllm_profile", profile=profile.name, reason=profile.reason,
             mode=vllm.mode, settings=profile.settings, overridden=overridden)
    return cfg.model_copy(update={"vllm": vllm})


def preflight(cfg: EngineConfig) -> list[str]:
    """What would stop the engine `cfg` asks for from starting, found by its class's
    `preflight` (no GPU, nothing started): one line per problem. `ocrd check-config`
    and the daemon's start both ask."""
    kind, _why = choose_kind(cfg)
    if kind == "tesseract":
        from ocrd.engines.tesseract import TesseractEngine as chosen
    elif kind == "vllm":
        from ocrd.engines.vllm.inprocess import VllmEngine as chosen  # managed: the same
    elif kind == "remote":
        from ocrd.engines.remote import RemoteEngine as chosen
    else:
        return []
    return chosen.preflight(cfg)


def create_engine(cfg: EngineConfig) -> Engine:
    cfg = with_api_key(cfg)  # the engines read only `api_key`
    engine = _create(cfg)
    if cfg.testing_faults is not None:
        from ocrd.engines.faults import FaultyEngine

        log.warning("engine_faults_injected", faults=cfg.testing_faults.model_dump())
        engine = FaultyEngine(engine, cfg.testing_faults)
    return engine


def _create(cfg: EngineConfig) -> Engine:
    kind, why = choose_kind(cfg)
    log.info("engine_chosen", engine=kind, reason=why, configured=cfg.kind)
    if kind == "tesseract":
        from ocrd.engines.tesseract import TesseractEngine

        return TesseractEngine(cfg)
    if kind == "vllm":
        cfg = with_profile(cfg)
        if cfg.vllm.managed:
            # several front ends, servers or GPUs: local `vllm serve` that ocrd supervises
            from ocrd.engines.vllm.managed import ManagedServerEngine

            return ManagedServerEngine(cfg)
        from ocrd.engines.vllm.inprocess import VllmEngine

        return VllmEngine(cfg)
    if kind == "remote":
        from ocrd.engines.remote import RemoteEngine

        return RemoteEngine(cfg)
    if kind == "simulated":
        from ocrd.engines.simulated import SimulatedEngine

        return SimulatedEngine(cfg)
    raise ValueError(f"unknown engine kind {kind!r}")
