"""What VllmEngine asks of vLLM: engine arguments and the head_dim guard (no vLLM needed)."""

from __future__ import annotations

import pickle
from typing import Any

from ocrd.config.settings import EngineConfig
from ocrd.engines.deepseek_ocr2 import NGRAM_PROCESSOR
from ocrd.engines.vllm.args import HeadDimGuard, engine_kwargs
from ocrd.engines.vllm.inprocess import VllmEngine


class FakeConfig:
    """Just enough of a transformers PretrainedConfig for HeadDimGuard."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def update(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def get_text_config(self) -> Any:
        return self.__dict__.get("text_config", self)


def ocr2_config(head_dim: int | None, **text: Any) -> FakeConfig:
    """DeepSeek-OCR-2's shape: plain attention, 1280 wide, 10 heads."""
    fields = {"hidden_size": 1280, "num_attention_heads": 10, "head_dim": head_dim,
              "kv_lora_rank": None, "qk_rope_head_dim": 0, **text}
    lm = FakeConfig(**fields)
    return FakeConfig(model_type="deepseek_vl_v2", text_config=lm)


def test_head_dim_zero_or_missing_becomes_hidden_over_heads() -> None:
    for missing in (0, None):
        guard = HeadDimGuard()
        config = guard(ocr2_config(missing))
        assert config.text_config.head_dim == 128 and guard.applied == 128


def test_head_dim_guard_leaves_sound_and_mla_configs_alone() -> None:
    guard = HeadDimGuard()
    assert guard(ocr2_config(64)).text_config.head_dim == 64
    mla = guard(ocr2_config(0, kv_lora_rank=512))  # MLA sizes attention differently
    assert mla.text_config.head_dim == 0 and guard.applied is None


def test_head_dim_guard_keeps_the_users_overrides() -> None:
    config = HeadDimGuard({"max_position_embeddings": 4096, "text_config": {"rope_theta": 1.0}})(
        ocr2_config(0))
    assert config.max_position_embeddings == 4096
    assert config.text_config.rope_theta == 1.0 and config.text_config.head_dim == 128

    def set_flag(c: Any) -> Any:
        c.flag = True
        return c

    config = HeadDimGuard(set_flag)(ocr2_config(0))
    assert config.flag is True and config.text_config.head_dim == 128


def test_guard_survives_pickling() -> None:
    # vLLM pickles the model config (overrides included) into its engine core process
    guard = pickle.loads(pickle.dumps(HeadDimGuard({"a": 1})))
    assert isinstance(guard, HeadDimGuard) and guard.inner == {"a": 1}


def test_engine_kwargs_follow_the_recipe_then_engine_args() -> None:
    cfg = EngineConfig.model_validate({
        "model": "/models/ocr2",
        "vllm": {"dtype": "float16", "max_num_seqs": 8, "max_model_len": 4096,
                 "engine_args": {"enforce_eager": True, "max_num_seqs": 2}},
    })
    kw = engine_kwargs(cfg)
    assert kw["model"] == "/models/ocr2" and kw["dtype"] == "float16"
    assert kw["enable_prefix_caching"] is False and kw["mm_processor_cache_gb"] == 0
    assert kw["limit_mm_per_prompt"] == {"image": 1}
    assert kw["logits_processors"] == [NGRAM_PROCESSOR]
    assert kw["max_model_len"] == 4096 and kw["gpu_memory_utilization"] == 0.9
    assert kw["enforce_eager"] is True and kw["max_num_seqs"] == 2  # engine_args last
    assert isinstance(kw["hf_overrides"], HeadDimGuard)
    engine = VllmEngine(cfg)
    assert (engine.kind, engine.output_format, engine.max_concurrency) == ("vllm", "grounding", 8)
