"""Test-only vLLM plugin: a tiny DeepSeek-OCR-2 vision tower and image-sensitive dummy weights.

vLLM's deepseek_ocr2.py hard-codes its encoders (SAM ViT-B and a 24-layer Qwen2-shaped
encoder, ~0.45 B parameters: 6-27 s per page on 2 CPU cores), so config.json cannot make
them small. With DSOCR2_TINY_VISION=1 this swaps the two constructors, in that module's
namespace, for tiny instances of the same classes: same forward code, same token counts
(256 queries for the 1024 px global view, 144 per 768 px tile). Pair it with
projector_config.input_dim == VISION_DIM (tests/vllm_engine/tiny_model.py).

With DSOCR2_SCALED_DUMMY=1 it also replaces vLLM's dummy initialiser (U(-1e-3, 1e-3),
which makes logits ignore the image) with fan-in scaled values of gain WEIGHT_GAIN, drawn
from a new seed for every tensor. At gain 1 (or with tensors of equal size sharing values)
the image moves logits by ~1%: every page gives the same tokens. At gain 3 the random
network is sensitive to its input, so different images give different tokens and random
pages end with EOS after a few tokens, as real pages do. That must happen at load time:
the CPU backend pre-packs linear weights after loading.

vLLM loads general plugins (entry point group `vllm.general_plugins`) in every process it
starts, including spawned engine cores and `vllm serve`; the sibling .dist-info folder
makes this one discoverable just by putting this folder on sys.path / PYTHONPATH.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

VISION_DIM = 64
WEIGHT_GAIN = 3.0


def shrink_vision_tower(vision_dim: int = VISION_DIM) -> None:
    import torch
    from vllm.model_executor.models import deepseek_ocr2 as m
    from vllm.model_executor.models.deepencoder import ImageEncoderViT
    from vllm.model_executor.models.deepencoder2 import build_qwen2_decoder_as_encoder

    if getattr(m, "_ocrd_tiny_vision", False):
        return

    def tiny_sam(**kw: Any) -> Any:
        # out_chans must stay 256: the next conv is hard-coded Conv(256 -> 512)
        kw.update(depth=2, embed_dim=64, num_heads=2, global_attn_indexes=(1,),
                  last_conv_output=vision_dim)
        kw["norm_layer"] = partial(torch.nn.LayerNorm, eps=1e-6)
        return ImageEncoderViT(**kw)

    def tiny_qwen2() -> Any:
        return build_qwen2_decoder_as_encoder(
            decoder_layer=1, hidden_dimension=vision_dim, num_attention_heads=2,
            num_key_value_heads=1, intermediate_size=2 * vision_dim)

    m.ImageEncoderViT = tiny_sam
    m.build_qwen2_decoder_as_encoder = tiny_qwen2
    m._ocrd_tiny_vision = True


def scale_dummy_weights() -> None:
    import torch
    from vllm.model_executor.model_loader import dummy_loader

    if getattr(dummy_loader, "_ocrd_scaled", False):
        return

    calls = [0]

    def init(param: Any, *args: Any, **kwargs: Any) -> None:
        if param.device.type == "meta" or not torch.is_floating_point(param):
            return
        # vLLM initialises tensors in a fixed order: engines built from the same folder
        # (in-process, spawned, `vllm serve`) get the same weights.
        calls[0] += 1
        g = torch.Generator().manual_seed(1234 + calls[0])
        if param.dim() >= 2:
            bound = WEIGHT_GAIN * (3.0 / max(1, param[0].numel())) ** 0.5
            value = torch.empty(param.shape).uniform_(-bound, bound, generator=g)
        else:  # norms and biases near 1
            value = torch.empty(param.shape).uniform_(0.9, 1.1, generator=g)
        with torch.no_grad():
            param.copy_(value.to(param.dtype))

    dummy_loader.initialize_single_dummy_weight = init
    dummy_loader._ocrd_scaled = True


def plugin() -> None:
    """vllm.general_plugins entry point (vLLM calls it in every process)."""
    if os.environ.get("DSOCR2_TINY_VISION") == "1":
        shrink_vision_tower()
    if os.environ.get("DSOCR2_SCALED_DUMMY") == "1":
        scale_dummy_weights()
