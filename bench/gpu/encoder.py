"""Run inside vLLM's engine worker (`LLM.apply_model`) by the offline phase of the GPU
benchmark (bench/gpu/offline.py): switch ocrd's fast-encoder model between vLLM's
encoder path and ocrd's modes, and time the encoder alone on A4-shaped inputs.

Loaded there by name (like bench.gpu.logits's logits processors), so it imports nothing
from the other bench modules.
"""

from __future__ import annotations

import time
from typing import Any

# SAM's attention with vLLM's reshapes around the fused kernel ("copies") and without
# them (the default lean layout)
ENCODER_MODES = (("stock", None), ("page", None),
                 ("bucketed_fused_graphs_copies", None), ("bucketed_fused_graphs", None),
                 ("padded_fused_graphs_copies", None), ("padded_fused_graphs", None))
# the modes whose CUDA kernels are listed (where the time goes)
PROFILED = ("padded_fused_graphs_copies", "padded_fused_graphs")
# page counts timed besides one page and `pages` (a step's new pages when they trickle)
FEW_PAGES = (2, 3, 4)


def model_class(model: Any) -> str:
    return type(model).__name__


def set_mode(model: Any, mode: str, chunks: tuple[int, int] | None = None) -> str | None:
    """stock: vLLM's encoder code; page / batched / padded / bucketed: ocrd's modes
    (padded: batched in calls of the full size; bucketed: of the full size or one of its
    halves, the default), optionally `_fused` (SAM's attention in ocrd's fused
    kernel; `_copies`: with vLLM's reshapes around it, else the lean layout) and `_graphs`
    (padded calls replayed as CUDA graphs). chunks: (global views, tiles) per call."""
    if not hasattr(model, "ocrd_set_fast"):
        return None
    import torch

    from ocrd.vllm_model import dsocr2_fast

    base, *flags = mode.split("_")
    model.ocrd_set_fast(base != "stock")
    model.ocrd_batched = base in ("batched", "padded", "bucketed")
    model.ocrd_padded = base in ("padded", "bucketed")
    model.ocrd_bucketed = base == "bucketed"
    model.ocrd_set_fused("fused" in flags, lean=False if "copies" in flags else None)
    graphs = "graphs" in flags and model.ocrd_padded and torch.cuda.is_available()
    if graphs != bool(getattr(model, "ocrd_graphs", None)) or (chunks and graphs):
        model.ocrd_graphs = dsocr2_fast.EncoderGraphs() if graphs else None
    if chunks:
        model.ocrd_chunks = chunks
    return mode


class _Inputs:
    """`pages` A4-shaped pages (a global view and 2×3 tiles each), random, on the
    model's device; `encode(n)` runs the first n through the model's encoder."""

    def __init__(self, model: Any, pages: int) -> None:
        import torch

        self.model, self.pages = model, pages
        p = next(model.sam_model.parameters())
        self.device = p.device
        g = torch.Generator(device=p.device).manual_seed(0)
        self.pixel_values = torch.randn(pages, 3, 1024, 1024, device=p.device,
                                        dtype=p.dtype, generator=g)
        self.crops = torch.randn(6 * pages, 3, 768, 768, device=p.device, dtype=p.dtype,
                                 generator=g)
        self.spatial = torch.tensor([[2, 3]] * pages, dtype=torch.long)
        self.sync = torch.cuda.synchronize if p.device.type == "cuda" else (lambda: None)

    def encode(self, n: int) -> Any:
        return self.model._pixel_values_to_embedding(
            self.pixel_values[:n], self.crops[:6 * n], self.spatial[:n])

    def ms_per_page(self, n: int, reps: int) -> tuple[float, Any]:
        """The best of `reps` timings of n pages (ms per page), and the embeddings."""
        times, out = [], None
        for _ in range(reps):
            t0 = time.perf_counter()
            out = self.encode(n)
            self.sync()
            times.append(time.perf_counter() - t0)
        return round(min(times) / n * 1000, 2), out


def encoder_bench(model: Any, pages: int, reps: int = 3) -> dict[str, Any]:
    """vLLM's per-page encoder code against ocrd's modes on the same A4-shaped inputs:
    wall time per page with the GPU synchronised (`pages` at once, and one page alone: a
    step's latency), how far the embeddings differ from vLLM's, and the GPU kernels that
    take the time."""
    import torch

    if not hasattr(model, "ocrd_set_fast"):
        return {"error": f"{type(model).__name__} is not ocrd's fast model"}
    default_chunks = model.ocrd_chunks
    inputs = _Inputs(model, pages)
    out: dict[str, Any] = {"pages": pages, "mask_patched": model.ocrd_mask_patched,
                           "chunks_default": list(default_chunks),
                           "fused_layers": getattr(model, "ocrd_fused_layers", None)}
    embeddings = {}
    with torch.inference_mode():
        for mode, chunks in ENCODER_MODES:
            label = mode if chunks is None else f"{mode}_{chunks[0]}x{chunks[1]}"
            set_mode(model, mode, chunks or default_chunks)
            inputs.encode(2)  # warm-up
            inputs.sync()
            out[f"{label}_one_page_ms"], alone = inputs.ms_per_page(1, reps)
            out[f"{label}_few_pages_ms_per_page"] = {
                n: inputs.ms_per_page(n, reps)[0] for n in FEW_PAGES if n < pages}
            out[f"{label}_ms_per_page"], embeddings[label] = inputs.ms_per_page(pages, reps)
            # batch invariance: page 0 alone and among `pages` others, the same numbers?
            out[f"{label}_page_alone_equal"] = bool(torch.equal(alone[0],
                                                                embeddings[label][0]))
        set_mode(model, "page", default_chunks)
        out.update(_differences(embeddings))
        if inputs.device.type == "cuda":
            out.update(_profiles(model, inputs, default_chunks))
    set_mode(model, "page", default_chunks)
    return out


def _differences(embeddings: dict[str, Any]) -> dict[str, Any]:
    """How far each mode's embeddings are from vLLM's own ("stock")."""
    out: dict[str, Any] = {}
    for label in embeddings:
        if label == "stock":
            continue
        pairs = list(zip(embeddings[label], embeddings["stock"], strict=True))
        out[f"{label}_max_abs_diff"] = max((a.float() - b.float()).abs().max().item()
                                           for a, b in pairs)
        out[f"{label}_shapes_equal"] = all(a.shape == b.shape for a, b in pairs)
    out["max_abs_value"] = max(b.float().abs().max().item() for b in embeddings["stock"])
    return out


def _profiles(model: Any, inputs: _Inputs, default_chunks: tuple[int, int]) -> dict[str, Any]:
    """Where each PROFILED mode's encoder time goes on the GPU: the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, Any] = {}
    pages = inputs.pages
    for mode in PROFILED:
        set_mode(model, mode, default_chunks)
        inputs.encode(pages)  # capture
        inputs.sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            inputs.encode(pages)
            inputs.sync()
        # CUDA activity only: the rows are kernels and copies (self time = time)
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
        total = sum(e.self_device_time_total for e in rows) / 1000
        out[f"profile_{mode}_gpu_ms_per_page"] = round(total / pages, 2)
        out[f"profile_{mode}_top"] = [
            [e.key[:90], round(e.self_device_time_total / 1000 / pages, 2), e.count]
            for e in rows[:15]]
    return out
