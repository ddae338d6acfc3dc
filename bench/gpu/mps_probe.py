"""Do two CUDA processes run their kernels at the same time on this GPU?

    python bench/gpu/mps_probe.py            # alone, then two at once (time-sliced)
    (with CUDA_MPS_PIPE_DIRECTORY set and nvidia-cuda-mps-control -d running: under MPS)

Each process replays, many times, a kernel that fills few of the GPU's SMs (a 512 x 512
fp32 matrix product: ~16 thread blocks of 132 SMs), like a decode step's small kernels.
Without MPS the GPU gives each process's context its own time slices, so two processes
take about twice as long as one; under MPS their kernels share the SMs and two take
about as long as one. Prints PROBE lines: seconds alone, seconds each of two at once,
and their ratio (≈ 2 time-sliced, ≈ 1 concurrent).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

N = int(os.environ.get("MPS_PROBE_N", "100000"))


def work(start: float) -> None:
    import torch

    a = torch.randn(512, 512, device="cuda")
    b = torch.randn(512, 512, device="cuda")
    for _ in range(50):
        a @ b
    torch.cuda.synchronize()
    time.sleep(max(0.0, start - time.time()))  # both children begin together
    t0 = time.perf_counter()
    for _ in range(N):
        a @ b
    torch.cuda.synchronize()
    print(json.dumps({"s": time.perf_counter() - t0}), flush=True)


def run(k: int) -> list[float]:
    start = str(time.time() + 12)  # after every child's CUDA start and warm-up
    procs = [subprocess.Popen([sys.executable, __file__, "--child", start],
                              stdout=subprocess.PIPE, text=True) for _ in range(k)]
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise SystemExit(f"child failed rc={p.returncode}")
        out.append(json.loads(text.strip().splitlines()[-1])["s"])
    return out


def main() -> None:
    if "--child" in sys.argv:
        work(float(sys.argv[2]))
        return
    alone = run(1)[0]
    two = run(2)
    print("PROBE " + json.dumps({
        "mps_pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"), "kernels": N,
        "alone_s": round(alone, 3), "two_at_once_s": [round(t, 3) for t in two],
        "ratio": round(max(two) / alone, 2)}), flush=True)


if __name__ == "__main__":
    main()
