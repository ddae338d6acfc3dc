"""SAM's attention with its relative-position bias inside one flash-attention kernel.

DeepSeek-OCR-2's vision encoder starts with SAM ViT-B: 12 layers over 4,096 tokens per
1024 px global view and 2,304 per 768 px tile (8 layers in 14×14 windows, 4 global).
Every layer adds a decomposed relative-position bias to its attention scores:
`bias[q, k] = rel_h[q, row(k)] + rel_w[q, col(k)]`. vLLM ≤ 0.24 builds that bias as a
full tensor (heads × tokens² per view: 0.4 GB for a global layer of one 1024 px view, in
bf16), writes it with a broadcasting add and reads it back in PyTorch's memory-efficient
attention kernel. On an H200 the attention and those elementwise kernels were most of
the encoder's GPU time.

`relpos_attention` computes the same attention without the tensor: a flash-attention
forward (online softmax over key blocks) that adds the two small factors to the scores
in registers, as two dots per key block of the query block's factors (loaded once) with
one-hot matrices built in registers: the bias on the tensor cores (measured faster on an
H200 than gathering the factors per key block). `lean_forward`
feeds it strided views and takes its output in the layout the next projection reads,
without vLLM's copies around the attention. Its work
per view does not depend on the other views of the call (one program per query block
and view·head), so a page's result does not depend on what else is in the engine step.
Newer vLLM (≥ 0.30) ships a kernel of the same kind for the four global layers only;
ocrd's also covers the window layers.

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

from ocrd.vllm_model.switches import SAM_LEAN_ENV

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds: the callers check `available()`
    triton = None
    tl = None

LOG2E = math.log2(math.e)  # the kernel spells it out: Triton reads no module globals
# TRITON_INTERPRET=1 runs kernels on the CPU (the tests); its dot has no bf16
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# (query block, key block, warps, pipeline stages). On an H200 128×64 with 8 warps and
# 3 stages was slower.
BLOCKS = (64, 64, 4, 2)
# lean_forward (no copies around the kernel) unless the benchmark switch says 0
LEAN = os.environ.get(SAM_LEAN_ENV, "1") != "0"


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _relpos_onehot_kernel(
        q_ptr, k_ptr, v_ptr, rh_ptr, rw_ptr, o_ptr, qk_scale,
        sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
        srhb, srhh, srhr, srhc, srhk, srwb, srwh, srwr, srwc, srwk, sob, soh, som, sod,
        heads, tokens,
        KEY_ROWS: tl.constexpr, KEY_WIDTH: tl.constexpr, ROWS_P: tl.constexpr,
        WIDTH_P: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
    ):
        """SAM's attention with the bias on the tensor cores: a query block's factors
        rel_h [BLOCK_M, rows] and rel_w [BLOCK_M, width] are loaded once, and each key
        block's bias is rel_h · onehot(row(k)) + rel_w · onehot(col(k)) — two small dots
        against one-hot matrices built in registers — instead of two gathers of
        BLOCK_M × BLOCK_N values per key block. A product with a one-hot column is the
        factor itself (one non-zero term), so the scores are those of the bias tensor."""
        block = tl.program_id(0)
        view_head = tl.program_id(1)
        b = view_head // heads
        h = view_head % heads
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        key_rows = tl.arange(0, ROWS_P)
        key_cols = tl.arange(0, WIDTH_P)
        row_ok = rows < tokens
        q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :] * sqd,
                    mask=row_ok[:, None], other=0.0)
        # the factors' row of a query: its (row, column) on the grid, each with its stride
        at_r = (rows // KEY_WIDTH)[:, None]
        at_c = (rows % KEY_WIDTH)[:, None]
        rh = tl.load(rh_ptr + b * srhb + h * srhh + at_r * srhr + at_c * srhc
                     + key_rows[None, :] * srhk,
                     mask=row_ok[:, None] & (key_rows < KEY_ROWS)[None, :], other=0.0)
        rw = tl.load(rw_ptr + b * srwb + h * srwh + at_r * srwr + at_c * srwc
                     + key_cols[None, :] * srwk,
                     mask=row_ok[:, None] & (key_cols < KEY_WIDTH)[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
            rh = rh.to(tl.float32)
            rw = rw.to(tl.float32)
        running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        running_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for start in range(0, tokens, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < tokens
            kt = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skn + dims[:, None] * skd,
                         mask=col_ok[None, :], other=0.0)
            at_row = ((cols // KEY_WIDTH)[None, :] == key_rows[:, None]).to(rh.dtype)
            at_col = ((cols % KEY_WIDTH)[None, :] == key_cols[:, None]).to(rw.dtype)
            bias = tl.dot(rh, at_row)
            bias = tl.dot(rw, at_col, bias)
            if UPCAST:  # noqa: SIM108 - Triton CPU interpreter: no bf16 dot
                qk = tl.dot(q, kt.to(tl.float32))
            else:
                qk = tl.dot(q, kt)
            # base-2 softmax: scores and bias scaled by log2(e)
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


def _pow2(n: int) -> int:
    """The next power of two ≥ n and ≥ 16 (the smallest side of a Triton dot)."""
    return max(16, 1 << (n - 1).bit_length())


def _grid_strides(rel: torch.Tensor, key_width: int) -> tuple[int, ...]:
    """A factor's strides (view, head, query row, query column, key) from its
    [B, heads, tokens, k] or [B, heads, rows, columns, k] form (any layout)."""
    if rel.dim() == 5:
        return tuple(rel.stride())
    sb, sh, sm, sk = rel.stride()
    return sb, sh, sm * key_width, sm, sk


def relpos_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     rel_h: torch.Tensor, rel_w: torch.Tensor, key_width: int,
                     scale: float, blocks: tuple[int, int, int, int] | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q·kᵀ·scale + rel_h[:, :, :, row(k)] + rel_w[:, :, :, col(k)]) · v.
    q, k, v: [B, heads, tokens, head_dim]; rel_h: [B, heads, tokens, rows] or
    [B, heads, rows, key_width, rows]; rel_w: the same with key_width as its last size;
    key token t sits at (t // key_width, t % key_width). Any strides (views of other
    tensors need no copy). Returns [B, heads, tokens, head_dim] in q's dtype: `out` when
    given (any strides, e.g. a view of the tokens-first tensor the next layer reads), else
    a new contiguous tensor."""
    views, heads, tokens, head_dim = q.shape
    if head_dim & (head_dim - 1):
        raise ValueError(f"head_dim {head_dim} is not a power of two")
    block_m, block_n, warps, stages = blocks or BLOCKS
    if out is None:
        out = torch.empty((views, heads, tokens, head_dim), dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(tokens, block_m), views * heads)
    strides = (*q.stride(), *k.stride(), *v.stride(), *_grid_strides(rel_h, key_width),
               *_grid_strides(rel_w, key_width), *out.stride())
    key_rows = rel_h.shape[-1]
    _relpos_onehot_kernel[grid](
        q, k, v, rel_h, rel_w, out, scale * LOG2E, *strides, heads, tokens,
        KEY_ROWS=key_rows, KEY_WIDTH=key_width, ROWS_P=_pow2(key_rows),
        WIDTH_P=_pow2(key_width), HEAD_DIM=head_dim, BLOCK_M=block_m,
        BLOCK_N=block_n, UPCAST=INTERPRETED, num_warps=warps, num_stages=stages,
    )
    return out


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_h: torch.Tensor,
              rel_w: torch.Tensor, key_width: int, scale: float) -> torch.Tensor:
    """The same attention with the bias built as a tensor (vLLM ≤ 0.24's way); the
    factors in either of relpos_attention's forms."""
    views, heads, tokens, _ = q.shape
    rows = rel_h.shape[-1]
    rel_h = rel_h.reshape(views, heads, tokens, rows)
    rel_w = rel_w.reshape(views, heads, tokens, key_width)
    bias = (rel_h[..., :, None] + rel_w[..., None, :]).reshape(views, heads, tokens,
                                                              rows * key_width)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def fused_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """vLLM's `RelPosAttention.forward` (same modules, same inputs and outputs) with the
    attention in `relpos_attention`. Bound to an instance by `patch_sam`; the instance's
    `_ocrd_fused` False runs vLLM's own forward; `_ocrd_lean` False the first fused
    version (vLLM's reshapes, which copy q, k, v and the output)."""
    if not self._ocrd_fused:
        return type(self).forward(self, x)
    if self._ocrd_lean:
        return lean_forward(self, x)
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


def lean_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """fused_forward without the copies around the kernel: q, k and v are read where the
    qkv projection wrote them (strided views), the factors stay in the layout einsum
    leaves them in, and the kernel writes its output tokens-first, where `proj` reads it.
    vLLM's way copies q, k and v to heads-first (3 × the layer's activations), q twice
    more inside its einsums, both factors and the output (copy kernels were a visible
    share of the encoder's time on an H200); this
    copies q twice, inside the two einsums. The same products and sums: the factors
    are the same einsums over the same q."""
    views, height, width, _ = x.shape
    heads = self.num_heads
    qkv = self.qkv(x).view(views, height, width, 3, heads, -1)
    q, k, v = qkv.unbind(3)  # [views, H, W, heads, head_dim], strided
    rh = self._ocrd_get_rel_pos(height, height, self.rel_pos_h)  # [H, H, head_dim]
    rw = self._ocrd_get_rel_pos(width, width, self.rel_pos_w)  # [W, W, head_dim]
    rel_h = torch.einsum("vhwnd,hkd->vnhwk", q, rh)  # views of einsum's result
    rel_w = torch.einsum("vhwnd,wkd->vnhwk", q, rw)
    out = torch.empty(qkv.shape[:3] + qkv.shape[4:], dtype=x.dtype, device=x.device)

    def heads_first(t: torch.Tensor) -> torch.Tensor:  # [views, heads, tokens, head_dim]
        return t.flatten(1, 2).transpose(1, 2)

    relpos_attention(heads_first(q), heads_first(k), heads_first(v), rel_h, rel_w, width,
                     self.scale, self._ocrd_blocks, out=heads_first(out))
    return self.proj(out.view(views, height, width, -1))


def patch_sam(sam_model: Any) -> int:
    """Give every relative-position attention layer of vLLM's SAM the fused kernel.
    Returns how many layers were patched (0: a SAM this code does not know)."""
    try:
        from vllm.model_executor.models.deepencoder import add_decomposed_rel_pos, get_rel_pos
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
        module._ocrd_lean = LEAN
        module._ocrd_blocks = None
        module._ocrd_rel_pos = add_decomposed_rel_pos
        module._ocrd_get_rel_pos = get_rel_pos
        module.forward = MethodType(fused_forward, module)
        patched += 1
    return patched


def set_fused(sam_model: Any, on: bool, blocks: tuple[int, int, int, int] | None = None,
              lean: bool | None = None) -> int:
    """Switch patched layers between the fused kernel and vLLM's code (benchmarks), and
    the block sizes and layout they use (None: the defaults, BLOCKS and LEAN)."""
    n = 0
    for module in sam_model.modules():
        if hasattr(module, "_ocrd_fused"):
            module._ocrd_fused = on
            module._ocrd_blocks = blocks
            module._ocrd_lean = LEAN if lean is None else lean
            n += 1
    return n
