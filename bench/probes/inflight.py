"""A GPU engine's pages in flight, without a GPU: does ocrd keep as many A4 pages in
the engine as the engine takes, and what does that cost the daemon in memory?

    PYTHONPATH=$PWD .venv/bin/python bench/probes/inflight.py [--servers 2] [--batch 256]
        [--queue 16] [--pages 560] [--budget BYTES]

`--servers` simulated `vllm serve` processes (bench/sim_server.py: ocrd's simulated
continuous-batching engine behind vLLM's routes; pages decode for minutes, so they pile
up) fed by the daemon's remote engine with `concurrency_per_url` = batch and
`queue_per_url` = queue — the layout of two managed servers on an H200 (544 pages in
flight). `--pages` A4 pages at 144 dpi (8-page PDFs, as bench/gpu/multi.py drops them)
go into the inbox at once. Prints the daemon's page slots and memory budget (its `ready`
line), the most pages it had in the engine (its ocrd_pages_in_flight gauge, every 0.5 s)
and the peak RSS of its process tree (daemon and render workers), in all and per page
in flight. `--budget` sets limits.memory_bytes (default: unset, sized to the slots; issue
16's fixed 1 GiB held this layout at 76 pages: GPU_RESULTS.md round 7).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def tree_rss(pid: int) -> int:
    """RSS in bytes of every process in `pid`'s process group (the daemon's session)."""
    group, total = os.getpgid(pid), 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != group:
                continue
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return total


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--queue", type=int, default=16)
    p.add_argument("--pages", type=int, default=560)
    p.add_argument("--budget", type=int, default=None, help="limits.memory_bytes")
    p.add_argument("--seconds", type=float, default=240, help="give up after")
    args = p.parse_args(argv)

    from helpers import Daemon, drop

    from bench.gpu.inputs import make_pdfs

    want = args.servers * (args.batch + args.queue)
    with tempfile.TemporaryDirectory(prefix="ocrd-inflight-") as tmp:
        work = Path(tmp)
        pdfs = make_pdfs(work / "pdfs", args.pages, 8, 5000)
        servers, urls = [], []
        try:
            for _ in range(args.servers):
                srv = subprocess.Popen(
                    [sys.executable, "-m", "bench.sim_server", "--max-batch", str(args.batch),
                     "--decode-steps", "600", "--step-seconds", "0.2"],
                    stdout=subprocess.PIPE, text=True, cwd=ROOT)
                servers.append(srv)
                assert srv.stdout is not None
                urls.append(f"http://127.0.0.1:{int(srv.stdout.readline().split()[1])}/v1")
            engine = {"kind": "remote", "remote": {
                "urls": urls, "concurrency_per_url": args.batch, "queue_per_url": args.queue}}
            top = {"limits": {"memory_bytes": args.budget}} if args.budget else {}
            with Daemon(work / "daemon", engine=engine, **top) as d:
                d.start()
                ready = d.event("ready") or {}
                t0 = time.monotonic()
                for pdf in pdfs:
                    drop(pdf, d.inbox / pdf.name)
                peak, rss = 0.0, 0
                while time.monotonic() - t0 < args.seconds:
                    peak = max(peak, d.metric("ocrd_pages_in_flight") or 0)
                    rss = max(rss, tree_rss(d.pid))
                    if peak >= min(want, args.pages):
                        time.sleep(3)  # let the last requests settle in memory
                        rss = max(rss, tree_rss(d.pid))
                        break
                    time.sleep(0.5)
                took = time.monotonic() - t0
                d.stop(strict=False)
        finally:
            for srv in servers:
                srv.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(f"| page slots | memory budget | most pages in flight | after | daemon RSS "
          f"| RSS per page in flight |\n|---|---|---|---|---|---|\n"
          f"| {ready.get('pages_in_flight')} | {ready.get('memory_budget_bytes', 0) / 2**30:.2f} "
          f"GiB | {peak:.0f} of {min(want, args.pages)} | {took:.0f} s | {rss / 2**20:,.0f} MiB "
          f"| {rss / 2**20 / max(peak, 1):.1f} MiB |")


if __name__ == "__main__":
    main()
