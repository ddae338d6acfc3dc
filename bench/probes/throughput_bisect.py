"""Which change cost the daemon throughput: ocrd at several commits against one
fixed-capacity server (bench/sim_server.py, the simulated engine behind vLLM's routes,
batch 16, in a process of its own), in alternating rounds, beside the same server fed
directly by the remote client.

For each commit a worktree is made under --work (git worktree add); its daemon is
`python -m ocrd run` with PYTHONPATH at that worktree (the engine named the way every one
of these commits reads: engine.urls at the top of `engine:`; the console on, at a free
port, as a user runs the daemon). The same documents (bench/cases.saturation_docs) are
dropped at once; pages/s from the first byte written to the last Markdown file, and the
CPU seconds the daemon's process tree used for them (from /proc, user + system). Each
round runs the commits in turn, the order reversed every round; the best round counts for
pages/s, the median for CPU.

    PYTHONPATH=$PWD .venv/bin/python -m bench.probes.throughput_bisect \\
        --commits 6dec598,4cdba2e,5cadf70,a07d2d7,3baca0d,def5b4e,1910684,d410416,HEAD \\
        [--rounds 3] [--work /tmp/ocrd-bisect]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.cases import _answers, _drive, design_images, fresh, saturation_docs
from bench.harness import ROOT, DaemonProcess, daemon_config, drop_file, wait_for
from tests.helpers import free_port

BATCH = 16


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` and every process below it (now)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / ticks
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += cpu.get(p, 0.0)
        todo.extend(c for c, parent in parents.items() if parent == p)
    return total


def worktree(work: Path, commit: str) -> tuple[str, Path]:
    sha = subprocess.run(["git", "rev-parse", "--short", commit], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    path = work / sha
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(path), sha],
                       cwd=ROOT, check=True)
    return sha, path


def one_run(checkout: Path, url: str, docs: list[Any], label: str) -> dict[str, Any]:
    root = fresh(f"bisect-{label}")
    engine = {"kind": "remote", "urls": [url], "concurrency_per_url": BATCH,
              "loop_retries": 0}
    cfg = daemon_config(root, engine, web={"listen": f"127.0.0.1:{free_port()}"})
    d = DaemonProcess(root, cfg)
    d.env = {"PYTHONPATH": str(checkout)}  # the daemon's ocrd is the commit's
    with d.start() as running:
        cpu0 = tree_cpu_seconds(running.proc.pid)
        t0 = time.time()
        for doc in docs:
            drop_file(running.inbox / doc.name, doc.data)
        done = running.wait_markdown(len(docs), 600)
        cpu = tree_cpu_seconds(running.proc.pid) - cpu0
    pages = sum(doc.pages for doc in docs)
    seconds = done[-1] - t0
    return {"pages_per_s": pages / seconds, "seconds": round(seconds, 3),
            "cpu_seconds": round(cpu, 2), "cpu_ms_per_page": round(1000 * cpu / pages, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ocrd-bisect"))
    ap.add_argument("--full", action="store_true", help="twice the documents")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    commits = [worktree(args.work, c) for c in args.commits.split(",")]
    docs = saturation_docs(quick=not args.full)
    proc = subprocess.Popen([sys.executable, "-m", "bench.sim_server", "--max-batch",
                             str(BATCH)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    results: dict[str, list[dict]] = {sha: [] for sha, _ in commits}
    direct: list[float] = []
    try:
        port = int(proc.stdout.readline().split()[1])  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}/v1"
        wait_for(lambda: _answers(url), 30, "the simulated server")
        from ocrd.engines.base import PageRequest

        images = design_images()
        requests = [PageRequest(image=images[design], page_no=k + 1, doc_id=doc.doc_id)
                    for doc in docs for k, design in enumerate(doc.designs())]
        for r in range(args.rounds):
            cfg = {"kind": "remote", "loop_retries": 0,
                   "remote": {"urls": [url], "concurrency_per_url": 2 * BATCH,
                              "queue_per_url": 0}}
            direct.append(asyncio.run(_drive(cfg, requests, BATCH + 2))["pages_per_s"])
            print(f"round {r + 1}: server fed directly {direct[-1]:.2f} pages/s", flush=True)
            order = commits if r % 2 == 0 else commits[::-1]
            for sha, path in order:
                res = one_run(path, url, docs, sha)
                results[sha].append(res)
                print(f"  {sha}: {res['pages_per_s']:.2f} pages/s, "
                      f"{res['cpu_ms_per_page']} ms CPU a page", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    best_direct = max(direct)
    print(f"\nserver fed directly: best {best_direct:.2f} pages/s")
    print("| commit | pages/s (best) | ÷ direct | rounds | CPU ms a page (median) |")
    print("|---|---|---|---|---|")
    for sha, _ in commits:
        rates = [r["pages_per_s"] for r in results[sha]]
        cpu = statistics.median(r["cpu_ms_per_page"] for r in results[sha])
        print(f"| {sha} | {max(rates):.2f} | {max(rates) / best_direct:.3f} | "
              f"{' / '.join(f'{x / best_direct:.3f}' for x in rates)} | {cpu:.1f} |")
    out = ROOT / "bench" / "out" / "throughput_bisect.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"direct": direct, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
