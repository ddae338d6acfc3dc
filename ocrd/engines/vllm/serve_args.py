"""The command lines of ocrd's managed `vllm serve` processes: which servers run where
(ports, GPUs, shares of memory and front ends), and each one's flags."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ocrd.config.settings import EngineConfig
from ocrd.engines.vllm.args import fixed_head_dim, recipe_kwargs


@dataclass(frozen=True)
class ServerSpec:
    """One managed `vllm serve`: where it listens, which GPUs it sees, what it gets."""

    index: int
    port: int
    devices: str | None  # CUDA_VISIBLE_DEVICES; None: ocrd's own environment
    api_servers: int
    gpu_memory_utilization: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def name(self) -> str:
        where = f"gpu{self.devices.replace(',', '+')}" if self.devices is not None else "gpu"
        return f"{where}.{self.index}"


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct ports free right now (each asked of the kernel while the others are
    still held, so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def plan_servers(cfg: EngineConfig) -> list[ServerSpec]:
    """engine.vllm's servers: servers_per_gpu on each group of tensor_parallel_size ×
    data_parallel_size GPUs of `gpus` (one group, the environment's devices, when `gpus`
    is empty), memory and front ends split among the servers of a group."""
    v = cfg.vllm
    per = v.tensor_parallel_size * v.data_parallel_size
    groups: list[str | None] = [",".join(map(str, v.gpus[i:i + per]))
                                for i in range(0, len(v.gpus), per)] or [None]
    n = len(groups) * v.servers_per_gpu
    ports = (list(range(v.server_port, v.server_port + n)) if v.server_port
             else free_ports(n))
    share = round(v.gpu_memory_utilization / v.servers_per_gpu, 4)
    api = max(1, v.api_servers // v.servers_per_gpu)
    return [ServerSpec(index=i, port=ports[i], devices=groups[i // v.servers_per_gpu],
                       api_servers=api, gpu_memory_utilization=share) for i in range(n)]


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def cli_args(args: dict[str, Any]) -> list[str]:
    """Engine arguments (AsyncEngineArgs names) as `vllm serve` flags.

    True → `--flag`, False → `--no-flag`, None → left out, dicts → JSON, lists of plain
    values → one flag with several values, anything else → its string.
    """
    out: list[str] = []
    for key, value in args.items():
        if value is None:
            continue
        if value is True:
            out.append(_flag(key))
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            out += [_flag(key), json.dumps(value)]
        elif isinstance(value, list | tuple):
            if all(isinstance(v, str | int | float) for v in value):
                out += [_flag(key), *map(str, value)] if value else []
            else:
                out += [_flag(key), json.dumps(list(value))]
        else:
            out += [_flag(key), str(value)]
    return out


def read_model_config(model: str) -> dict | None:
    """The model's config.json: from a local folder, else from the Hugging Face cache or
    hub (vLLM fetches it anyway). None when it cannot be had."""
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    else:
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(model, "config.json"))
        except Exception:  # noqa: BLE001 - no hub, no network, no such model
            return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def head_dim_overrides(model_config: dict | None) -> dict[str, Any]:
    """`--hf-overrides` that give the language model a real head_dim when its config has
    none (the same guard as the in-process engine's HeadDimGuard, see
    engines/vllm/inprocess.py), or {}."""
    if not model_config:
        return {}
    for key in ("language_config", "text_config"):
        text = model_config.get(key)
        if isinstance(text, dict):
            # vLLM's DeepSeek-VL2/OCR config keeps the language model as `text_config`
            fixed = fixed_head_dim(_Attrs(text))
            return {"text_config": {"head_dim": fixed}} if fixed else {}
    fixed = fixed_head_dim(_Attrs(model_config))
    return {"head_dim": fixed} if fixed else {}


class _Attrs:
    """A JSON object read through attributes, as fixed_head_dim expects a config."""

    def __init__(self, data: dict) -> None:
        self.__dict__.update(data)


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def server_args(cfg: EngineConfig, port: int, api_servers: int,
                hf_overrides: dict[str, Any] | None = None,
                gpu_memory_utilization: float | None = None) -> list[str]:
    """The arguments of `vllm serve ...` for cfg: the recipe's flags, the config's
    settings (this server's port, front ends and share of the GPU's memory), then
    cfg.vllm.engine_args on top (as flags)."""
    v = cfg.vllm
    args = recipe_kwargs(cfg)
    del args["model"]  # positional: `vllm serve MODEL`
    args.update({
        "served_model_name": cfg.model,
        "host": "127.0.0.1",
        "port": port,
        "api_server_count": api_servers,
        # one log line per request would drown the daemon's log
        "disable_uvicorn_access_log": True,
        # pages queued at the server go by their PageRequest.priority (a receipt's page
        # before a manual's queued ones), as the daemon's own slots do
        "scheduling_policy": "priority",
    })
    if gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = gpu_memory_utilization
    engine_args = dict(v.engine_args)
    user_overrides = engine_args.pop("hf_overrides", None) or {}
    if not isinstance(user_overrides, dict):
        raise ValueError("engine.vllm.engine_args.hf_overrides must be a mapping "
                         "in the managed mode (api_servers > 1, servers_per_gpu > 1, gpus)")
    args.update(engine_args)
    overrides = _merge(hf_overrides or {}, user_overrides)
    if overrides:
        args["hf_overrides"] = overrides
    return ["serve", cfg.model, *cli_args(args)]
