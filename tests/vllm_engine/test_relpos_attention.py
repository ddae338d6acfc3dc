"""SAM's fused relative-position attention (ocrd/vllm_model/relpos_attention.py).

The kernel itself runs in Triton's CPU interpreter: tests/vllm_engine/triton_cases.py,
run here in a subprocess with Triton on its path (scripts/test installs Triton into
.triton-cpu/, outside the venv: vLLM's CPU build is installed without it). The rest
runs in this process: the layer's reshapes around the kernel against vLLM's forward
(with the kernel's math done by the bias-tensor reference), and when the model class
patches SAM at all.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from needs import require_vllm  # tests/vllm_engine, on sys.path (conftest.py)

require_vllm()
import torch  # noqa: E402
from small_sam import small_sam  # noqa: E402  (tests/vllm_engine)

from ocrd.vllm_model import dsocr2_fast, switches  # noqa: E402
from ocrd.vllm_model import relpos_attention as ra  # noqa: E402

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
TRITON_DIR = ROOT / ".triton-cpu"  # scripts/test: pip install --target .triton-cpu triton


def test_the_kernel_in_tritons_interpreter() -> None:
    if not (TRITON_DIR / "triton").is_dir():
        message = f"Triton is not installed in {TRITON_DIR} (./scripts/test installs it)"
        if os.environ.get("OCRD_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(TRITON_DIR), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-o", "addopts=", str(Path(__file__).with_name("triton_cases.py"))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    summary = re.search(r"(\d+) passed", proc.stdout)
    assert summary and int(summary.group(1)) >= 12, tail
    assert not re.search(r"\d+ (skipped|failed|error)", proc.stdout), tail


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "copies"])
def test_the_layer_around_the_kernel_is_vllms_layer(monkeypatch: pytest.MonkeyPatch,
                                                    lean: bool) -> None:
    """fused_forward's reshapes, strides and factors, with the kernel's math done by the
    bias-tensor reference: vLLM's SAM output, in window and global layers; lean (q, k,
    v, the factors and the output as strided views, no copies) and vLLM's reshapes."""
    calls = []

    def reference(q: Any, k: Any, v: Any, rel_h: Any, rel_w: Any, width: int, scale: float,
                  blocks: Any = None, out: Any = None) -> Any:
        calls.append((tuple(q.shape), tuple(rel_h.shape), tuple(rel_w.shape), width,
                      out is not None, q.is_contiguous()))
        got = ra.reference(q, k, v, rel_h, rel_w, width, scale)
        return got if out is None else out.copy_(got)

    monkeypatch.setattr(ra, "relpos_attention", reference)
    sam = small_sam()
    x = torch.randn(2, 3, 128, 128)
    with torch.inference_mode():
        want = sam(x)
        assert ra.patch_sam(sam) == 3
        assert ra.set_fused(sam, True, lean=lean) == 3
        got = sam(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # 2 views: window layers see 2×9 windows of 3×3 tokens, the global one 8×8 tokens
    if lean:  # the factors by query row and column, the output written in place
        assert calls == [((18, 2, 9, 32), (18, 2, 3, 3, 3), (18, 2, 3, 3, 3), 3, True, False),
                         ((2, 2, 64, 32), (2, 2, 8, 8, 8), (2, 2, 8, 8, 8), 8, True, False),
                         ((18, 2, 9, 32), (18, 2, 3, 3, 3), (18, 2, 3, 3, 3), 3, True, False)]
    else:
        assert calls == [((18, 2, 9, 32), (18, 2, 9, 3), (18, 2, 9, 3), 3, False, True),
                         ((2, 2, 64, 32), (2, 2, 64, 8), (2, 2, 64, 8), 8, False, True),
                         ((18, 2, 9, 32), (18, 2, 9, 3), (18, 2, 9, 3), 3, False, True)]


def test_when_the_model_fuses_sams_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(switches.FUSED_SAM_ENV, raising=False)
    monkeypatch.setattr(ra, "available", lambda: True)
    assert dsocr2_fast.fused_sam_wanted() == (False, "not on a GPU")  # this CPU
    monkeypatch.setenv(switches.FUSED_SAM_ENV, "1")
    assert dsocr2_fast.fused_sam_wanted()[0]
    monkeypatch.setenv(switches.FUSED_SAM_ENV, "0")
    assert not dsocr2_fast.fused_sam_wanted()[0]
    monkeypatch.setattr(ra, "available", lambda: False)
    monkeypatch.setenv(switches.FUSED_SAM_ENV, "1")
    assert dsocr2_fast.fused_sam_wanted() == (False, "Triton is not installed")


def test_switching_the_fast_path_off_switches_the_kernel_off() -> None:
    """ocrd_set_fast(False) (vLLM's own code) and ocrd_set_fused reach every layer."""
    model = object.__new__(dsocr2_fast.FastDeepseekOCR2ForCausalLM)
    torch.nn.Module.__init__(model)
    model.sam_model = small_sam()
    model.qwen2_model = model.projector = torch.nn.Identity()  # unused here
    model.view_seperator = torch.nn.Parameter(torch.zeros(4))
    model.ocrd_fused_layers = ra.patch_sam(model.sam_model)
    model.ocrd_mask_patched = False
    layers = [m for m in model.sam_model.modules() if hasattr(m, "_ocrd_fused")]
    assert len(layers) == 3 and all(m._ocrd_fused for m in layers)
    model.ocrd_set_fast(False)
    assert not any(m._ocrd_fused for m in layers)
    model.ocrd_set_fast(True)
    assert all(m._ocrd_fused for m in layers)
    assert model.ocrd_set_fused(True, (32, 16, 4, 2))
    assert all(m._ocrd_blocks == (32, 16, 4, 2) for m in layers)
    model.ocrd_fused_layers = 0  # nothing patched: the switch cannot turn it on
    assert not model.ocrd_set_fused(True)


def test_when_padded_encoder_calls_become_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    def config(eager: bool) -> Any:
        return SimpleNamespace(model_config=SimpleNamespace(enforce_eager=eager))

    monkeypatch.delenv(switches.GRAPHS_ENV, raising=False)
    assert not dsocr2_fast.graphs_wanted(config(False))  # this CPU: no CUDA
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert dsocr2_fast.graphs_wanted(config(False))
    assert not dsocr2_fast.graphs_wanted(config(True))  # vLLM's enforce_eager: none
    monkeypatch.setenv(switches.GRAPHS_ENV, "0")
    assert not dsocr2_fast.graphs_wanted(config(False))
