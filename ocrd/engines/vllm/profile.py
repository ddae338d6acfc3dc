"""The vLLM layout for the GPUs this machine has.

With `engine.vllm.profile: auto` ocrd reads the GPUs (nvidia-smi: memory, compute
capability, count) and takes one of a few layouts measured on real hardware: several `vllm
serve` processes under CUDA MPS on a big Hopper-class GPU, one managed server with several
front ends on a 24-48 GB card, the engine inside ocrd on anything else. A key set in the
configuration always wins over the profile's value.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

import structlog

from ocrd.config.engine import EngineConfig, VllmConfig
from ocrd.config.settings import ConfigError

log = structlog.get_logger("ocrd.engine")

GIB = 1024
# A card sold as "80 GB" reports about 79-81 GiB; 24 GB cards about 23.5 GiB.
BIG_GPU_MIB = 75 * GIB
# A Hopper card this big (an H200) holds 384 whole pages per server in its share of the
# KV cache; one of 80 GB (an H100) about 200: more sequences than the cache holds are
# preempted and computed again, and pages per second fall as the backlog grows.
ROOMY_GPU_MIB = 120 * GIB
MID_GPU_MIB = 22 * GIB
HOPPER = (9, 0)
# Keys of a profile that only make sense when ocrd starts `vllm serve` itself.
MANAGED_ONLY = ("api_servers", "servers_per_gpu", "gpus")


@dataclass(frozen=True)
class Gpu:
    """One CUDA device as nvidia-smi numbers it."""

    index: int
    name: str
    memory_mib: int
    capability: tuple[int, int] | None = None  # None: the driver does not say
    uuid: str = ""


@dataclass(frozen=True)
class Profile:
    """A layout for the machine's GPUs: VllmConfig keys and the reason for them."""

    name: str
    reason: str
    settings: dict[str, Any] = field(default_factory=dict)


def front_ends_per_gpu(cpus: int, gpus: int, servers_per_gpu: int) -> int:
    """Front-end processes per GPU: up to 8 (the layout measured on an H200 host with 16
    cores), and never more than the cores leave beside each GPU's
    engine cores."""
    cores = max(1, cpus // max(1, gpus))
    return max(servers_per_gpu, min(8, cores // 2, cores - servers_per_gpu))


def choose(gpus: list[Gpu], cpus: int | None = None) -> Profile:
    """The profile for these GPUs (the machine's CPU count decides the front ends)."""
    cpus = cpus or os.cpu_count() or 1
    if not gpus:
        return Profile("inprocess", "no CUDA GPU found", {"mode": "inprocess"})
    first = gpus[0]
    same = [g for g in gpus if (g.name, g.memory_mib) == (first.name, first.memory_mib)]
    if len(same) < len(gpus):
        return Profile("inprocess", f"GPUs of different kinds: the engine inside ocrd on "
                       f"GPU {first.index} ({first.name})", {"mode": "inprocess"})
    count = len(gpus)
    indices = [g.index for g in gpus]
    gib = round(first.memory_mib / GIB)
    cap = first.capability
    what = f"{count} × {first.name}, {gib} GiB" + (f", compute {cap[0]}.{cap[1]}" if cap else "")
    if first.memory_mib >= BIG_GPU_MIB and cap is not None and cap >= HOPPER:
        front = front_ends_per_gpu(cpus, count, 2)
        seqs = 384 if first.memory_mib >= ROOMY_GPU_MIB else 192
        return Profile("hopper-80g", f"{what}: two servers per GPU under CUDA MPS, {seqs} "
                       "pages each", {
            "mode": "managed", "servers_per_gpu": 2, "api_servers": front,
            "max_num_seqs": seqs, "gpu_memory_utilization": 0.85,
            "gpus": indices if count > 1 else []})
    if first.memory_mib >= MID_GPU_MIB:
        front = front_ends_per_gpu(cpus, count, 1)
        return Profile("gpu-24g", f"{what}: one server per GPU with {front} front ends", {
            "mode": "managed", "servers_per_gpu": 1, "api_servers": front,
            "max_num_seqs": 128, "gpu_memory_utilization": 0.9,
            "gpus": indices if count > 1 else []})
    return Profile("inprocess", f"{what}: under {MID_GPU_MIB // GIB} GiB, the engine inside "
                   "ocrd", {"mode": "inprocess"})


def apply(cfg: VllmConfig, profile: Profile) -> VllmConfig:
    """The config with the profile's values for the keys the config does not set."""
    given = cfg.model_fields_set
    update = {k: v for k, v in profile.settings.items() if k not in given}
    mode = update.get("mode", cfg.mode) or "inprocess"
    if mode == "inprocess":  # the profile's front ends and servers need the managed mode
        update = {k: v for k, v in update.items() if k not in MANAGED_ONLY}
    update["mode"] = mode
    return VllmConfig.model_validate(cfg.model_copy(update=update).model_dump())


def resolve(cfg: VllmConfig, gpus: list[Gpu] | None = None) -> tuple[VllmConfig, Profile]:
    """The vLLM settings to run with, and the profile they came from (for the log)."""
    if cfg.profile == "none":
        profile = Profile("none", "engine.vllm.profile is none: the configured keys only")
    else:
        profile = choose(detect() if gpus is None else gpus)
    return apply(cfg, profile), profile


def detect() -> list[Gpu]:
    """The CUDA devices this process may use (CUDA_VISIBLE_DEVICES respected), from
    nvidia-smi; [] where there is none or nvidia-smi is missing."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    rows = _query(smi, "index,uuid,name,memory.total,compute_cap")
    if rows is None:  # drivers before compute_cap in --query-gpu
        rows = _query(smi, "index,uuid,name,memory.total")
    gpus = [g for g in (_parse(r) for r in rows or []) if g is not None]
    return visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible(gpus: list[Gpu], setting: str | None) -> list[Gpu]:
    """The devices CUDA_VISIBLE_DEVICES lets through (indices or UUIDs, in its order)."""
    if setting is None:
        return gpus
    chosen = []
    for item in (s.strip() for s in setting.split(",")):
        match = [g for g in gpus if item == str(g.index) or (item and g.uuid.startswith(item))]
        if not match:
            break  # CUDA stops at the first entry it cannot use
        chosen.append(match[0])
    return chosen


def _query(smi: str, fields: str) -> list[list[str]] | None:
    try:
        out = subprocess.run([smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("gpu_query_failed", error=str(e))
        return []
    if out.returncode != 0:
        return None if "compute_cap" in fields else []
    return [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines()
            if line.strip()]


def _parse(row: list[str]) -> Gpu | None:
    try:
        index, uuid, name, memory = int(row[0]), row[1], row[2], int(float(row[3]))
    except (IndexError, ValueError):
        return None
    capability = None
    if len(row) > 4:
        major, _, minor = row[4].partition(".")
        if major.isdigit() and minor.isdigit():
            capability = (int(major), int(minor))
    return Gpu(index, name, memory, capability, uuid)


def with_profile(cfg: EngineConfig) -> EngineConfig:
    """The engine config with engine.vllm's profile applied; ConfigError names a
    configured key that the chosen layout cannot take."""
    from pydantic import ValidationError

    from ocrd.config.check import describe_error

    try:
        vllm, profile = resolve(cfg.vllm)
    except ValidationError as e:
        raise ConfigError(*(describe_error(VllmConfig, err, ("engine", "vllm"))
                            for err in e.errors())) from None
    overridden = sorted(k for k in profile.settings if k in cfg.vllm.model_fields_set)
    log.info("vllm_profile", profile=profile.name, reason=profile.reason,
             mode=vllm.mode, settings=profile.settings, overridden=overridden)
    return cfg.model_copy(update={"vllm": vllm})
