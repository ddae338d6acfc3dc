"""The arguments vLLM's engine gets from ocrd's config and DeepSeek-OCR-2's recipe, shared
by the in-process engine (engines/vllm/inprocess.py: AsyncEngineArgs) and the managed server
(engines/vllm/managed.py: `vllm serve` flags). Nothing here imports vLLM.
"""

from __future__ import annotations

from typing import Any

import structlog

from ocrd.config.engine import EngineConfig
from ocrd.engines import deepseek_ocr2
from ocrd.vllm_model import plugin

log = structlog.get_logger("ocrd.engines.vllm.inprocess")


class HeadDimGuard:
    """`hf_overrides` callable: give the language model a real head_dim when it has none.

    transformers 5's DeepseekV2Config sets `head_dim = qk_rope_head_dim`, which is 0 for
    DeepSeek-OCR(-2)'s plain-attention language model. vLLM 0.24 then builds attention
    with head size 0 and the engine core dies while capturing CUDA graphs (FlashAttention
    divides by zero). Newer vLLM falls back to hidden_size // num_heads by itself; this
    does the same explicitly and touches nothing when head_dim is already set. It is a
    module-level class (not a closure) because vLLM pickles the config into its engine
    core process. `inner` keeps overrides the user passed in engine_args.hf_overrides.
    """

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner
        self.applied: int | None = None  # the head_dim set, for tests and logs

    def __call__(self, config: Any) -> Any:
        if callable(self.inner):
            config = self.inner(config)
        elif isinstance(self.inner, dict):
            for key, value in self.inner.items():
                sub = getattr(config, key, None)
                if isinstance(value, dict) and hasattr(sub, "update"):
                    sub.update(value)
                else:
                    config.update({key: value})
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        fixed = fixed_head_dim(text)
        if fixed is not None:
            text.head_dim = fixed
            self.applied = fixed
        return config

    def __repr__(self) -> str:
        return f"HeadDimGuard(inner={self.inner!r})"


def fixed_head_dim(text_config: Any) -> int | None:
    """hidden_size // num_attention_heads when a non-MLA text config has head_dim 0/None."""
    if getattr(text_config, "head_dim", 0) not in (0, None):
        return None
    # MLA models size attention from kv_lora_rank/qk_*_head_dim, not head_dim.
    if getattr(text_config, "kv_lora_rank", None) or getattr(text_config, "use_mla", False):
        return None
    hidden = getattr(text_config, "hidden_size", None)
    heads = getattr(text_config, "num_attention_heads", None)
    if not hidden or not heads:
        return None
    return hidden // heads


def recipe_kwargs(cfg: EngineConfig) -> dict[str, Any]:
    """The engine settings from the config and the model's recipe
    (deepseek_ocr2.engine_settings), before any pass-through engine_args (shared by the
    in-process engine and the managed server)."""
    v = cfg.vllm
    return {
        "model": cfg.model,
        "dtype": v.dtype,
        "gpu_memory_utilization": v.gpu_memory_utilization,
        "max_model_len": v.max_model_len,
        "max_num_seqs": v.max_num_seqs,
        **({"max_num_batched_tokens": v.max_num_batched_tokens}
           if v.max_num_batched_tokens else {}),
        "tensor_parallel_size": v.tensor_parallel_size,
        "data_parallel_size": v.data_parallel_size,
        **deepseek_ocr2.engine_settings(),
    }


def engine_kwargs(cfg: EngineConfig) -> dict[str, Any]:
    """AsyncEngineArgs keyword arguments: the recipe's, then cfg.vllm.engine_args on top."""
    kwargs = recipe_kwargs(cfg)
    kwargs.update(cfg.vllm.engine_args)
    kwargs["hf_overrides"] = HeadDimGuard(kwargs.get("hf_overrides"))
    return kwargs


def fast_encoder_usable(cfg: EngineConfig) -> bool:
    """Whether the fast encoder is asked for and vLLM can load it; warns when asked for
    but the plugin is not installed. Called once per engine start (reads package
    metadata)."""
    if not cfg.vllm.fast_encoder:
        return False
    if plugin.installed():
        return True
    log.warning("vllm_fast_encoder_unavailable",
                why="ocrd's vLLM plugin is not installed (install ocrd with pip); "
                    "vLLM's own, slower encoder path is used")
    return False
