"""The fused SAM attention kernel (ocrd/vllm_model/relpos_attention.py), run on the CPU by
Triton's interpreter. Not collected on its own (no test_ prefix): test_relpos_attention.py
runs this file in a subprocess with TRITON_INTERPRET=1 and Triton on the path, which
the main test process must not see (vLLM's CPU build is installed without Triton).
"""

from __future__ import annotations

import os

import pytest
import torch
from small_sam import small_sam  # tests/vllm_engine (conftest.py puts it on the path)

from ocrd.vllm_model import relpos_attention as ra

assert os.environ.get("TRITON_INTERPRET") == "1", "run through test_relpos_attention.py"
assert ra.available() and ra.INTERPRETED


def inputs(views: int, heads: int, rows: int, width: int, dim: int, dtype: torch.dtype,
           seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    tokens = rows * width

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    # q, k, v as SAM makes them: views of one qkv tensor (not contiguous per head)
    qkv = rand(views, tokens, 3, heads, dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    return q, k, v, rand(views, heads, tokens, rows, scale=2.0), rand(
        views, heads, tokens, width, scale=2.0)


SHAPES = [(2, 3, 14, 14, 64),  # a window layer: 14×14 tokens, SAM's head size
          (1, 2, 16, 16, 32),  # a small global layer
          (1, 1, 9, 7, 16),    # not square, tokens not a multiple of the block
          (3, 2, 5, 13, 64)]
# rows as wide as SAM's tiles (48: padded to 64 in the one-hot matrix) and its global
# view (64)
WIDE = [(1, 2, 12, 48, 16), (1, 1, 4, 64, 32)]


@pytest.mark.parametrize("shape", SHAPES + WIDE, ids=str)
def test_float32_is_the_bias_tensor_computation(shape: tuple[int, ...]) -> None:
    q, k, v, rel_h, rel_w = inputs(*shape, torch.float32)
    width, dim = shape[3], shape[4]
    got = ra.relpos_attention(q, k, v, rel_h, rel_w, width, dim ** -0.5)
    want = ra.reference(q, k, v, rel_h, rel_w, width, dim ** -0.5)
    assert got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bfloat16_is_as_close_as_vllms_own_bf16_path(shape: tuple[int, ...]) -> None:
    """In bf16 both ways round; the kernel must be no further from the float32 truth
    than vLLM's bias-tensor way in bf16 (plus a margin of one bf16 step)."""
    q, k, v, rel_h, rel_w = inputs(*shape, torch.bfloat16, seed=3)
    width, scale = shape[3], shape[4] ** -0.5
    truth = ra.reference(*(t.float() for t in (q, k, v, rel_h, rel_w)), width, scale)
    got = ra.relpos_attention(q, k, v, rel_h, rel_w, width, scale)
    vllm_way = ra.reference(q, k, v, rel_h, rel_w, width, scale)
    assert got.dtype == torch.bfloat16
    ours = (got.float() - truth).abs().max().item()
    theirs = (vllm_way.float() - truth).abs().max().item()
    assert ours <= theirs + 2 ** -7 * truth.abs().max().item(), (ours, theirs)


def test_a_view_does_not_depend_on_the_other_views_of_the_call() -> None:
    q, k, v, rel_h, rel_w = inputs(4, 2, 8, 8, 32, torch.bfloat16, seed=5)
    together = ra.relpos_attention(q, k, v, rel_h, rel_w, 8, 32 ** -0.5)
    for i in range(4):
        alone = ra.relpos_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], rel_h[i:i + 1],
                                    rel_w[i:i + 1], 8, 32 ** -0.5)
        assert torch.equal(alone[0], together[i])


def test_other_block_sizes_give_the_same_result() -> None:
    q, k, v, rel_h, rel_w = inputs(1, 2, 12, 12, 32, torch.float32, seed=7)
    base = ra.relpos_attention(q, k, v, rel_h, rel_w, 12, 0.2)
    other = ra.relpos_attention(q, k, v, rel_h, rel_w, 12, 0.2, blocks=(32, 16, 4, 2))
    torch.testing.assert_close(other, base, rtol=1e-5, atol=2e-6)


def test_head_size_must_be_a_power_of_two() -> None:
    q, k, v, rel_h, rel_w = inputs(1, 1, 4, 4, 16, torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        ra.relpos_attention(q[..., :12], k[..., :12], v[..., :12], rel_h, rel_w, 4, 0.3)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "copies"])
def test_vllms_sam_gives_the_same_features_with_the_kernel(
        monkeypatch: pytest.MonkeyPatch, lean: bool) -> None:
    """vLLM's own SAM (window and global layers, relative positions on), patched: the
    same output as vLLM's forward, which the switch brings back bit for bit; with the
    lean layout (strided views in and out of the kernel) and vLLM's copies."""
    monkeypatch.setattr(ra, "LEAN", lean)
    sam = small_sam()
    calls, lean_calls = [], []
    run_kernel = ra.relpos_attention

    def counted(*a, **kw):
        calls.append(a[0].shape)
        lean_calls.append(kw.get("out") is not None)  # `out` given: lean_forward
        return run_kernel(*a, **kw)

    monkeypatch.setattr(ra, "relpos_attention", counted)
    x = torch.randn(3, 3, 128, 128)
    with torch.inference_mode():
        want = sam(x)
        assert ra.patch_sam(sam) == 3  # every layer: 2 in windows (8×8 → padded 9×9), 1 global
        assert ra.patch_sam(sam) == 0  # once only
        got = sam(x)
        assert ra.set_fused(sam, False) == 3
        again = sam(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # the kernel ran in every layer: windows (3 views × 9 windows of 3×3), global (8×8)
    assert calls == [(27, 2, 9, 32), (3, 2, 64, 32), (27, 2, 9, 32)]
    assert lean_calls == [lean] * 3
    assert torch.equal(again, want)
