"""A small instance of vLLM's own SAM (DeepSeek-OCR-2's first encoder stage) for the
fused-attention tests: 128 px views, 3 layers (windowed, global, windowed), relative
positions on, weights drawn (vLLM leaves them uninitialised)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch


def small_sam() -> Any:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.deepencoder import ImageEncoderViT

    torch.manual_seed(0)
    with set_current_vllm_config(VllmConfig()):
        sam = ImageEncoderViT(img_size=128, patch_size=16, embed_dim=64, depth=3,
                              num_heads=2, mlp_ratio=4, out_chans=256, qkv_bias=True,
                              norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
                              use_rel_pos=True, window_size=3, global_attn_indexes=(1,),
                              last_conv_output=32)
    with torch.no_grad():
        for name, p in sam.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if "rel_pos" in name else 0.05))
    return sam.eval()
