"""SAM's attention with its relative-position bias inside one flash-attention kernel.

DeepSeek-OCR-2's vision encoder starts with SAM ViT-B: 12 layers over 4,096 tokens per
1024 px global view and 2,304 per 768 px tile (8 layers in 14×14 windows, 4 global).
Every layer adds a decomposed relative-position bias to its attention scores:
`bias[q, k] = rel_h[q, row(k)] + rel_w[q, col(k)]`. vLLM ≤ 0.24 builds that bias as a
full tensor (heads × tokens² per view: 0.4 GB for a global layer of one 1024 px view, in
bf16), writes it with a broadcasting add and reads it back in PyTorch's memory-efficient
attention kernel. On an H200 the attention and those elementwise kernels were 22 of the
encoder's 36 ms of GPU time per A4 page (bench/GPU_RESULTS.md, round 3).

`relpos_attention` computes the same attention without the tensor: a flash-attention
forward (online softmax over key blocks) that loads the two small factors and adds them
to the scores in registers. Its work per view does not depend on the other views of the
call (one program per query block and view·head), so a page's result does not depend
on what else is in the engine step. Newer vLLM (≥ 0.30) ships a kernel of the same kind
for the four global layers only; ocrd's also covers the window layers.

Triton is the only dependency; without it (a CPU build of vLLM) nothing here is used.
`reference` is the bias-tensor computation, for the tests (which run the kernel in
Triton's interpreter on the CPU: tests/vllm_engine/test_relpos_attention.py).
"""

from __future__ import annotations

import math
import os
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds: the callers check `available()`
    triton = None
    tl = None

LOG2E = math.log2(math.e)  # the kernel spells it out: Triton reads no module globals
# TRITON_INTERPRET=1 runs kernels on the CPU (the tests); its dot has no bf16
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# (query block, key block, warps, pipeline stages). On the H200 128×64 with 8 warps and
# 3 stages was slower (bench/gpu.py mode padded_fused_b128; bench/GPU_RESULTS.md round 4).
BLOCKS = (64, 64, 4, 2)


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _relpos_flash_kernel(
        q_ptr, k_ptr, v_ptr, rh_ptr, rw_ptr, o_ptr, qk_scale,
        sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
        srhb, srhh, srhm, srhk, srwb, srwh, srwm, srwk, sob, soh, som, sod,
        heads, tokens,
        KEY_WIDTH: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
    ):
        block = tl.program_id(0)
        view_head = tl.program_id(1)
        b = view_head // heads
        h = view_head % heads
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        row_ok = rows < tokens
        q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :] * sqd,
                    mask=row_ok[:, None], other=0.0)
        rh_rows = rh_ptr + b * srhb + h * srhh + rows[:, None] * srhm
        rw_rows = rw_ptr + b * srwb + h * srwh + rows[:, None] * srwm
        running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        running_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for start in range(0, tokens, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < tokens
            kt = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skn + dims[:, None] * skd,
                         mask=col_ok[None, :], other=0.0)
            both = row_ok[:, None] & col_ok[None, :]
            bias = tl.load(rh_rows + (cols // KEY_WIDTH)[None, :] * srhk, mask=both,
                           other=0.0).to(tl.float32)
            bias += tl.load(rw_rows + (cols % KEY_WIDTH)[None, :] * srwk, mask=both,
                            other=0.0).to(tl.float32)
            # base-2 softmax: scores and bias scaled by log2(e)
            if UPCAST:  # noqa: SIM108 - Triton CPU interpreter: no bf16 dot (same math in fp32)
                qk = tl.dot(q.to(tl.float32), kt.to(tl.float32))
            else:
                qk = tl.dot(q, kt)
            scores = qk * qk_scale + bias * 1.4426950408889634
            scores = tl.where(col_ok[None, :], scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            p = tl.math.exp2(scores - new_max[:, None])
            alpha = tl.math.exp2(running_max - new_max)
            running_sum = running_sum * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None]
            v = tl.load(v_ptr + b * svb + h * svh + cols[:, None] * svn + dims[None, :] * svd,
                        mask=col_ok[:, None], other=0.0)
            p = p.to(v.dtype)  # the tensor cores' operand type (bf16 in vLLM)
            if UPCAST:  # noqa: SIM108 - a constexpr branch, resolved at compile time
                acc = tl.dot(p.to(tl.float32), v.to(tl.float32), acc)
            else:
                acc = tl.dot(p, v, acc)
            running_max = new_max
        out = acc / running_sum[:, None]
        tl.store(o_ptr + b * sob + h * soh + rows[:, None] * som + dims[None, :] * sod,
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def relpos_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     rel_h: torch.Tensor, rel_w: torch.Tensor, key_width: int,
                     scale: float, blocks: tuple[int, int, int, int] | None = None,
                     ) -> torch.Tensor:
    """softmax(q·kᵀ·scale + rel_h[:, :, :, row(k)] + rel_w[:, :, :, col(k)]) · v.
    q, k, v: [B, heads, tokens, head_dim]; rel_h: [B, heads, tokens, rows];
    rel_w: [B, heads, tokens, key_width]; key token t sits at (t // key_width,
    t % key_width). Returns [B, heads, tokens, head_dim], contiguous, q's dtype."""
    views, heads, tokens, head_dim = q.shape
    if head_dim & (head_dim - 1):
        raise ValueError(f"head_dim {head_dim} is not a power of two")
    block_m, block_n, warps, stages = blocks or BLOCKS
    out = torch.empty((views, heads, tokens, head_dim), dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(tokens, block_m), views * heads)
    _relpos_flash_kernel[grid](
        q, k, v, rel_h, rel_w, out, scale * LOG2E,
        *q.stride(), *k.stride(), *v.stride(), *rel_h.stride(), *rel_w.stride(),
        *out.stride(), heads, tokens,
        KEY_WIDTH=key_width, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        UPCAST=INTERPRETED, num_warps=warps, num_stages=stages,
    )
    return out


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_h: torch.Tensor,
              rel_w: torch.Tensor, key_width: int, scale: float) -> torch.Tensor:
    """The same attention with the bias built as a tensor (vLLM ≤ 0.24's way)."""
    views, heads, tokens, _ = q.shape
    rows = rel_h.shape[-1]
    bias = (rel_h[..., :, None] + rel_w[..., None, :]).reshape(views, heads, tokens,
                                                              rows * key_width)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def fused_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """vLLM's `RelPosAttention.forward` (same modules, same inputs and outputs) with the
    attention in `relpos_attention`. Bound to an instance by `patch_sam`; the instance's
    `_ocrd_fused` False runs vLLM's own forward."""
    if not self._ocrd_fused:
        return type(self).forward(self, x)
    views, height, width, _ = x.shape
    heads, tokens = self.num_heads, height * width
    qkv = self.qkv(x).reshape(views, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.reshape(3, views * heads, tokens, -1).unbind(0)
    rel_h, rel_w = self._ocrd_rel_pos(q, self.rel_pos_h, self.rel_pos_w,
                                      (height, width), (height, width))
    shape = (views, heads, tokens, -1)
    out = relpos_attention(q.view(shape), k.view(shape), v.view(shape),
                           rel_h.reshape(views, heads, tokens, height),
                           rel_w.reshape(views, heads, tokens, width), width, self.scale,
                           self._ocrd_blocks)
    out = out.view(views, heads, height, width, -1).permute(0, 2, 3, 1, 4)
    return self.proj(out.reshape(views, height, width, -1))


def patch_sam(sam_model: Any) -> int:
    """Give every relative-position attention layer of vLLM's SAM the fused kernel.
    Returns how many layers were patched (0: a SAM this code does not know)."""
    try:
        from vllm.model_executor.models.deepencoder import add_decomposed_rel_pos
    except ImportError:
        return 0
    patched = 0
    for module in sam_model.modules():
        if not all(hasattr(module, name) for name in (
                "qkv", "proj", "num_heads", "scale", "rel_pos_h", "rel_pos_w")):
            continue
        if not getattr(module, "use_rel_pos", False) or hasattr(module, "_ocrd_fused"):
            continue
        module._ocrd_fused = True
        module._ocrd_blocks = None
        module._ocrd_rel_pos = add_decomposed_rel_pos
        module.forward = MethodType(fused_forward, module)
        patched += 1
    return patched


def set_fused(sam_model: Any, on: bool, blocks: tuple[int, int, int, int] | None = None,
              ) -> int:
    """Switch patched layers between the fused kernel and vLLM's code (benchmarks)."""
    n = 0
    for module in sam_model.modules():
        if hasattr(module, "_ocrd_fused"):
            module._ocrd_fused = on
            module._ocrd_blocks = blocks
            n += 1
    return n
