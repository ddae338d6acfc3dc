"""Where a served step's GPU time goes: PyTorch's profiler (CUDA kernels only) inside
vLLM's worker for a window of a few seconds, started and stopped through
`LLM.apply_model` between the engine's steps (bench/gpu/offline.py, `--kernels`).

A window's summary: its span, the GPU's busy time (the union of the kernels' intervals:
what is left is the GPU waiting for the engine core's thread), the steps in it (the
decoder's MoE layers run twice per layer and step) and the kernel time per class and per
kernel. Kernel names are matched, not the code that launched them: a GEMM of the vision
encoder and one of the decoder are both "gemm" — compare a window of pure decoding with
one where pages are being encoded.
"""

from __future__ import annotations

import re
from typing import Any

_PROF: Any = None

# first match wins: ocrd's kernels, then vLLM's, then the generic kinds
CLASSES = (
    ("sam_attention", r"relpos"),
    ("moe", r"fused_moe|moe_align|moe_sum|count_and_sort|topk_softmax|grouped_topk"),
    ("attention", r"flash|fmha|attn|attention|paged|unified|cudnn"),
    ("gemm", r"gemm|nvjet|sm90_|cutlass|cublas|xmma|splitk|wgmma|Kernel2"),
    ("norm", r"norm"),
    ("sampling", r"argmax|sampl|softmax|topk|sort|ngram|scatter|masked_fill|index_fill"),
    ("copy", r"memcpy|memset|copy|cat_|CatArray|gather|index"),
    ("elementwise", r"elementwise|vectorized|unrolled|reduce|act_and_mul|silu|gelu|add|mul"),
)
MOE_LAYERS = 11  # DeepSeek-OCR-2: 12 decoder layers, the first dense


def start(model: Any) -> bool:
    """In the worker: start recording kernels."""
    global _PROF
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    # the CPU dry run (--tiny) records the operators instead: the same code path
    _PROF = profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU])
    _PROF.start()
    return True


def kind(name: str) -> str:
    for label, pattern in CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def summary(kernels: list[tuple[str, float, float]], top: int = 25) -> dict[str, Any]:
    """kernels: (name, start µs, end µs). Busy time is the union of the intervals."""
    if not kernels:
        return {"kernels": 0}
    kernels = sorted(kernels, key=lambda k: k[1])
    span = kernels[-1][2] - kernels[0][1]
    busy, cur_s, cur_e = 0.0, kernels[0][1], kernels[0][2]
    for _, s, e in kernels[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    per_class: dict[str, float] = {}
    per_name: dict[str, list[float]] = {}
    moe_gemms = 0
    for name, s, e in kernels:
        per_class[kind(name)] = per_class.get(kind(name), 0.0) + (e - s)
        entry = per_name.setdefault(name[:140], [0.0, 0])
        entry[0] += e - s
        entry[1] += 1
        if name.startswith("fused_moe_kernel"):
            moe_gemms += 1
    steps = moe_gemms / (2 * MOE_LAYERS)
    ms = 1e-3
    return {
        "kernels": len(kernels), "span_ms": round(span * ms, 2),
        "busy_ms": round(busy * ms, 2), "busy_pct": round(100 * busy / span, 1) if span else None,
        "kernel_ms": round(sum(e - s for _, s, e in kernels) * ms, 2),
        "steps": round(steps, 1),
        "per_step_ms": round(span * ms / steps, 3) if steps else None,
        "classes_ms": {k: round(v * ms, 2) for k, v in
                       sorted(per_class.items(), key=lambda kv: -kv[1])},
        "top": [{"name": n, "ms": round(v[0] * ms, 2), "count": v[1]} for n, v in
                sorted(per_name.items(), key=lambda kv: -kv[1][0])[:top]],
    }


def stop(model: Any) -> dict[str, Any]:
    """In the worker: stop, and summarise the window's kernels."""
    global _PROF
    import torch
    from torch.autograd import DeviceType

    device = DeviceType.CUDA if torch.cuda.is_available() else DeviceType.CPU
    if device == DeviceType.CUDA:
        torch.cuda.synchronize()
    prof, _PROF = _PROF, None
    if prof is None:
        return {"kernels": 0}
    prof.stop()
    kernels = [(e.name, float(e.time_range.start), float(e.time_range.end))
               for e in prof.events() if e.device_type == device]
    if not kernels:  # the raw kineto events (ns), should events() leave them out
        raw = prof.profiler.kineto_results.events() if prof.profiler else []
        kernels = [(e.name(), e.start_ns() / 1e3, (e.start_ns() + e.duration_ns()) / 1e3)
                   for e in raw if e.device_type() == device]
    return summary(kernels)
