"""Tune vLLM's Triton fused-MoE kernel for DeepSeek-OCR-2's decoder on this GPU.

    python bench/gpu/moe_tune.py --out DIR        # on the GPU machine (bench/gpu/run.sh moe)

vLLM ships no tuned configuration for DeepSeek-OCR-2's experts (64 experts, 896 wide,
hidden 1280, 6 per token, bf16) on an H200: its engine logs "Using default MoE config"
and falls back to `get_default_config`. This times `fused_experts` (routing alignment,
both expert GEMMs, the activation, the sum: what one MoE layer costs) for each batch size
M that the engine meets (decode steps up to max_num_seqs, prefill chunks up to
max_num_batched_tokens), first with vLLM's default configuration, then with every
candidate of a grid (plus the tuned configurations vLLM ships for 64-expert models on
H100/H200, as starting points), and writes the fastest per M as
`E=64,N=896,device_name=<GPU>.json` in vLLM's format (a folder of such files is what
vLLM reads first when `VLLM_TUNED_CONFIG_FOLDER` names it). ocrd ships none yet: round
10 (bench/GPU_RESULTS.md) found vLLM's default best at a full decode step (M=384).

The kernels of the whole grid are compiled first, in parallel worker processes (Triton's
on-disk cache then serves the timing process), then timed one configuration at a time on
the one GPU: CUDA graphs of 8 calls over three weight sets (one layer's weights, 440 MB,
do not fit the L2 cache), replayed and timed with CUDA events, the median. Output: one
line per M with the default's and the best time, and results.json with every timing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu.inputs import full_size_text_config  # noqa: E402

_TEXT = full_size_text_config()  # DeepSeek-OCR-2's decoder
E, N, HIDDEN, TOPK = (_TEXT["n_routed_experts"], _TEXT["moe_intermediate_size"],
                      _TEXT["hidden_size"], _TEXT["num_experts_per_tok"])
# most important first (a step of a full batch of decodes; then smaller steps, prefill
# chunks): what the time budget leaves out keeps vLLM's default
BATCHES = (384, 256, 192, 128, 320, 512, 64, 96, 32, 16, 8, 4, 2, 1, 768, 1024, 2048,
           4096, 8192, 16384)


def grid() -> list[dict[str, int]]:
    """The candidates: Triton tile shapes for a memory-bound small-M GEMM up to a
    compute-bound large one."""
    out = []
    for bm, bn, bk, gm, warps, stages in itertools.product(
            (16, 32, 64, 128), (64, 128, 256), (64, 128, 256), (1, 16), (4, 8), (3, 4)):
        if bm == 128 and bn == 256 and bk == 256:
            continue  # shared memory: does not fit with more than one stage
        if bm * bk * stages + bn * bk * stages > 6 * 64 * 256 * 4:  # > ~200 KB of smem
            continue
        if gm == 16 and bm < 64:
            continue  # grouping helps only where an expert has several M blocks
        out.append({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk,
                    "GROUP_SIZE_M": gm, "num_warps": warps, "num_stages": stages})
    return out


def shipped() -> list[dict[str, int]]:
    """The configurations vLLM ships for other 64-expert models on H100/H200."""
    from vllm.model_executor.layers.fused_moe import fused_moe

    folder = Path(fused_moe.__file__).parent / "configs"
    seen, out = set(), []
    for f in sorted(folder.glob("E=64,N=*,device_name=NVIDIA_H*.json")):
        if "dtype" in f.name:
            continue
        for cfg in json.loads(f.read_text()).values():
            if not isinstance(cfg, dict):
                continue
            cfg = {k: v for k, v in cfg.items() if k in KEYS}
            key = tuple(sorted(cfg.items()))
            if len(cfg) == len(KEYS) and key not in seen:
                seen.add(key)
                out.append(cfg)
    return out


CALLS = 8  # fused_experts calls per timed graph replay
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
        "num_stages")


class Layer:
    """One MoE layer's inputs for batch size M: weight sets to rotate among, a routing
    that spreads tokens as a trained router does (random top-6 of 64)."""

    def __init__(self, sets: int = 3) -> None:
        import torch

        g = torch.Generator(device="cuda").manual_seed(0)
        self.w1 = [torch.randn(E, 2 * N, HIDDEN, device="cuda", dtype=torch.bfloat16,
                               generator=g) * 0.02 for _ in range(sets)]
        self.w2 = [torch.randn(E, HIDDEN, N, device="cuda", dtype=torch.bfloat16,
                               generator=g) * 0.02 for _ in range(sets)]

    def inputs(self, m: int) -> tuple[Any, Any, Any]:
        import torch

        g = torch.Generator(device="cuda").manual_seed(m)
        x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=g)
        logits = torch.randn(m, E, device="cuda", dtype=torch.float32, generator=g)
        w, ids = torch.topk(torch.softmax(logits, dim=-1), TOPK, dim=-1)
        return x, w / w.sum(-1, keepdim=True), ids.to(torch.int32)

    def time_ms(self, m: int, cfg: dict[str, int] | None, reps: int) -> float:
        """Median over `reps` timed replays of a CUDA graph of CALLS calls (rotating among
        the weight sets), per call: kernel time as the engine's decode steps see it,
        without the Python and launch overhead of each call (which, timed call by call,
        put a floor of ~0.23 ms under every batch size on the H200 in round 10)."""
        import torch
        from vllm.model_executor.layers.fused_moe import fused_experts, override_config

        x, w, ids = self.inputs(m)

        def calls() -> None:
            for i in range(CALLS):
                fused_experts(x, self.w1[i % len(self.w1)], self.w2[i % len(self.w2)], w, ids)

        with override_config(cfg):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                calls()  # warm-up (and the compile, on a cold cache)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                calls()
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / CALLS)
        del graph
        return statistics.median(times)


def default_config(m: int) -> dict[str, int]:
    from vllm.model_executor.layers.fused_moe.fused_moe import get_default_config

    cfg = get_default_config(m, E, N, HIDDEN, TOPK, None)
    return {k: v for k, v in cfg.items() if k in KEYS}


def _compile(cfgs: list[dict[str, int]]) -> int:
    """In a worker process: run each configuration once at batch sizes that cover
    Triton's integer specialisations, so that the kernels land in the on-disk cache."""
    layer, failed = Layer(sets=1), 0
    for cfg in cfgs:
        for m in (1, 8, 384):
            try:
                layer.time_ms(m, cfg, reps=1)
            except Exception:  # noqa: BLE001 - a shape Triton cannot build: skipped later
                failed += 1
    return failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=300,
                    help="stop timing new batch sizes after this long (the rest keep "
                    "their nearest tuned neighbour, as vLLM looks them up)")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = ap.parse_args()
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    cands = shipped()
    seen = {tuple(sorted(c.items())) for c in cands}
    cands += [c for c in grid() if tuple(sorted(c.items())) not in seen]
    print(f"MOE {len(cands)} candidates ({len(shipped())} shipped), "
          f"{torch.cuda.get_device_name()}", flush=True)
    t0 = time.monotonic()
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.workers) as pool:
        failed = sum(pool.map(_compile, [cands[i::args.workers]
                                         for i in range(args.workers)]))
    print(f"MOE compiled in {time.monotonic() - t0:.1f} s ({failed} shape runs failed)",
          flush=True)
    layer = Layer()
    best: dict[int, dict[str, int]] = {}
    rows: list[dict[str, Any]] = []
    for m in [int(b) for b in args.batches.split(",")]:
        if time.monotonic() - t_start > args.budget_s:
            print(f"MOE budget spent before M={m}", flush=True)
            break
        dflt = default_config(m)
        t_dflt = layer.time_ms(m, dflt, args.reps)
        timed = []
        for cfg in cands:
            if cfg["BLOCK_SIZE_M"] > max(16, 4 * m * TOPK // E):
                continue  # a tile far taller than an expert's tokens: wasted work
            try:
                timed.append((layer.time_ms(m, cfg, max(5, args.reps // 3)), cfg))
            except Exception:  # noqa: BLE001
                continue
        timed.sort(key=lambda t: t[0])
        # the five fastest again with the full repetitions: the winner is not luck
        final = sorted(((layer.time_ms(m, c, args.reps), c) for _, c in timed[:5]),
                       key=lambda t: t[0])
        t_best, cfg_best = final[0]
        if t_dflt <= t_best:
            t_best, cfg_best = t_dflt, dflt
        best[m] = cfg_best
        rows.append({"M": m, "default_ms": round(t_dflt, 4), "best_ms": round(t_best, 4),
                     "speedup": round(t_dflt / t_best, 3), "default": dflt,
                     "best": cfg_best, "candidates_timed": len(timed)})
        print(f"MOE M={m} default {t_dflt * 1000:.1f} us best {t_best * 1000:.1f} us "
              f"(x{t_dflt / t_best:.2f}) {cfg_best}", flush=True)
    for m in [int(b) for b in args.batches.split(",")]:
        # not timed (the budget): vLLM's default there, not a neighbour's tuned tiles
        best.setdefault(m, default_config(m))
    name = torch.cuda.get_device_name().replace(" ", "_")
    if "H200" in name.split("_"):
        name = "NVIDIA_H200"
    cfg_file = args.out / f"E={E},N={N},device_name={name}.json"
    cfg_file.write_text(json.dumps({str(m): c for m, c in sorted(best.items())}, indent=1))
    (args.out / "results.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "candidates": len(cands), "rows": rows,
         "seconds": round(time.monotonic() - t_start, 1)}, indent=1))
    print(f"MOE wrote {cfg_file} after {time.monotonic() - t_start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
