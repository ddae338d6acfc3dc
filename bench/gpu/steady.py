"""Steady state: files arriving at a fixed rate, as the daemon's real job is — not a
batch dropped at once.

A ladder of rates (pages/s), each held for a segment: files are written into the inbox
evenly spaced (a file of n pages every n/rate seconds), and every .md is timed from its
file's drop to its appearance. A rate is *held* when, over the segment's second half,
pages finish at ≥ 95 % of the rate and the backlog (pages dropped, not yet done) grows by
no more than five seconds' worth. Then the daemon is fed at 50 % and 90 % of the highest
rate held, and the time from drop to Markdown is reported (p50/p95) per kind of file.

Mixes: `8` — 8-page PDFs; `receipts` — 1-page receipts and 40-page reports, half the
pages each.

    python3 bench/gpu/steady.py --rates 2,4,6 --segment 60          # simulated engine, CPU
    bash bench/gpu/run.sh steady --rates 12,15,18,21 --segment 60   # the GPU (auto profile)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# the simulated engine (tests/simulated_engines.py), named by class path
SIMULATED = "simulated_engines:SimulatedEngine"

HOLD_DONE_SHARE = 0.95  # pages done in the second half ÷ pages the rate asks for
HOLD_BACKLOG_SECONDS = 5.0  # the backlog may grow by this many seconds of arrivals


@dataclass
class Arrival:
    """One file of the schedule: when it is due (seconds from the segment's start)."""

    name: str
    kind: str
    pages: int
    due: float
    dropped: float = 0.0  # monotonic time it was written
    done: float = 0.0  # monotonic time its .md was first seen


MIXES: dict[str, list[tuple[str, int]]] = {
    # (kind, pages) in the order they arrive; repeated
    "8": [("doc8", 8)],
    "receipts": [("receipt", 1)] * 40 + [("report", 40)],
}


def schedule(rate: float, seconds: float, mix: str, tag: str) -> list[Arrival]:
    """The files one segment drops: a file of n pages n/rate seconds after the last."""
    out: list[Arrival] = []
    t, k = 0.0, 0
    cycle = MIXES[mix]
    while t < seconds:
        kind, pages = cycle[k % len(cycle)]
        out.append(Arrival(f"{tag}_{k:05d}_{kind}.pdf", kind, pages, t))
        t += pages / rate
        k += 1
    return out


class Outbox(threading.Thread):
    """Polls the outbox every 50 ms and notes when each NAME.md first appears."""

    def __init__(self, folder: Path, failed: Path) -> None:
        super().__init__(daemon=True)
        self.folder, self.failed = folder, failed
        self.seen: dict[str, float] = {}
        self.failures: list[str] = []
        self._stop_flag = threading.Event()

    def run(self) -> None:
        while not self._stop_flag.is_set():
            now = time.monotonic()
            for p in self.folder.glob("*.md"):
                self.seen.setdefault(p.stem, now)
            if self.failed.exists():
                self.failures = sorted(n for n in os.listdir(self.failed)
                                       if not n.endswith(".error.json"))
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop_flag.set()
        self.join()


def pages_done(arrivals: list[Arrival], seen: dict[str, float], at: float) -> int:
    return sum(a.pages for a in arrivals if seen.get(Path(a.name).stem, 1e18) <= at)


def pages_dropped(arrivals: list[Arrival], at: float) -> int:
    return sum(a.pages for a in arrivals if a.dropped and a.dropped <= at)


def feed(inbox: Path, source: Callable[[Arrival], bytes], arrivals: list[Arrival]) -> float:
    """Writes each file at its due time (as a scanner does: write, close); returns the
    segment's start (monotonic)."""
    t0 = time.monotonic()
    for a in arrivals:
        delay = t0 + a.due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        data = source(a)
        a.dropped = time.monotonic()
        (inbox / a.name).write_bytes(data)
    return t0


def segment(inbox: Path, watcher: Outbox, source: Callable[[Arrival], bytes],
            everything: list[Arrival], rate: float, seconds: float, mix: str,
            tag: str) -> dict[str, Any]:
    """One rate for `seconds`: its arrivals join `everything` (the backlog counts all)."""
    arrivals = schedule(rate, seconds, mix, tag)
    everything.extend(arrivals)
    t0 = feed(inbox, source, arrivals)
    t_end = t0 + seconds
    time.sleep(max(0.0, t_end - time.monotonic()))
    half = t0 + seconds / 2
    seen = watcher.seen
    backlog = {at: pages_dropped(everything, at) - pages_done(everything, seen, at)
               for at in (half, t_end)}
    done_second_half = pages_done(everything, seen, t_end) - pages_done(everything, seen, half)
    asked = rate * seconds / 2
    held = (done_second_half >= HOLD_DONE_SHARE * asked
            and backlog[t_end] - backlog[half] <= HOLD_BACKLOG_SECONDS * rate)
    return {"rate": rate, "seconds": seconds, "files": len(arrivals),
            "pages": sum(a.pages for a in arrivals),
            "done_rate_second_half": round(done_second_half / (seconds / 2), 3),
            "backlog_pages_half": backlog[half], "backlog_pages_end": backlog[t_end],
            "held": held, "arrivals": arrivals}


def latencies(arrivals: list[Arrival], seen: dict[str, float], skip_seconds: float
              ) -> dict[str, dict[str, float]]:
    """p50/p95 seconds from drop to Markdown per kind, for files due after the warm-in."""
    by_kind: dict[str, list[float]] = {}
    for a in arrivals:
        done = seen.get(Path(a.name).stem)
        if a.due >= skip_seconds and done is not None:
            by_kind.setdefault(a.kind, []).append(done - a.dropped)
    out = {}
    for kind, xs in sorted(by_kind.items()):
        xs.sort()
        out[kind] = {"n": len(xs), "p50_s": round(statistics.median(xs), 2),
                     "p95_s": round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 2)}
    return out


def ladder(inbox: Path, watcher: Outbox, source: Callable[[Arrival], bytes],
           rates: list[float], seconds: float, mix: str, latency_seconds: float,
           drain: Callable[[], None], log: Callable[[str], None] = print) -> dict[str, Any]:
    """The rates in order until one is not held; then 50 % and 90 % of the best held."""
    everything: list[Arrival] = []
    steps = []
    best = 0.0
    for i, rate in enumerate(rates):
        r = segment(inbox, watcher, source, everything, rate, seconds, mix, f"r{i}")
        r.pop("arrivals")
        steps.append(r)
        log("STEADY " + json.dumps(r))
        if not r["held"]:
            break
        best = rate
    result: dict[str, Any] = {"mix": mix, "segment_s": seconds, "ladder": steps,
                              "highest_held_pages_per_s": best}
    drain()  # the backlog of the last rung is not the next measurement's
    if best:
        for share in (0.5, 0.9):
            everything_here: list[Arrival] = []
            r = segment(inbox, watcher, source, everything_here, round(best * share, 3),
                        latency_seconds, mix, f"l{int(share * 100)}")
            arrivals = r.pop("arrivals")
            drain()
            r["latency"] = latencies(arrivals, watcher.seen, latency_seconds * 0.2)
            result[f"at_{int(share * 100)}pct"] = r
            log("STEADY " + json.dumps(r))
    result["failed_files"] = watcher.failures
    return result


def wait_drained(watcher: Outbox, everything: Callable[[], int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(watcher.seen) + len(watcher.failures) < everything():
        if time.monotonic() > deadline:
            raise TimeoutError("the backlog did not drain")
        time.sleep(0.1)


def run_simulated(args: argparse.Namespace) -> dict[str, Any]:
    """The daemon with the simulated engine (no OCR) on this machine."""
    from bench.harness import OUT, pdf_bytes
    from tests.daemon_process import DaemonProcess

    root = OUT / "steady"
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    inbox, outbox, failed = root / "in", root / "out", root / "failed"
    for d in (inbox, outbox, failed):
        d.mkdir(parents=True)
    config = {"state_dir": str(root / "state"), "drain_timeout_seconds": 5,
              "engine": {"kind": SIMULATED, "options": {"max_batch": 16}},
              "log": {"level": "info", "format": "json"},
              "metrics": {"listen": None}, "web": {"listen": None},
              "inboxes": [{"path": str(inbox), "outbox": str(outbox), "failed": str(failed),
                           "on_success": "delete", "quiet_seconds": 0.5}]}
    d = DaemonProcess(root, config)
    cache: dict[int, bytes] = {}

    def source(a: Arrival) -> bytes:
        if a.pages not in cache:
            cache[a.pages] = pdf_bytes(a.pages)
        return cache[a.pages]

    watcher = Outbox(outbox, failed)
    try:
        d.start()
        watcher.start()
        total = [0]

        def count_source(a: Arrival) -> bytes:
            total[0] += 1
            return source(a)

        return ladder(inbox, watcher, count_source, args.rates, args.segment, args.mix,
                      args.latency_segment or args.segment,
                      lambda: wait_drained(watcher, lambda: total[0], 600))
    finally:
        if watcher.is_alive():
            watcher.stop()
        d.stop(strict=False)
        d.kill(group_left=True)


def run_gpu(args: argparse.Namespace) -> dict[str, Any]:
    """The daemon on this machine's GPU with the layout ocrd picks itself (engine.vllm
    profile auto: bench/gpu/multi.py's `auto` row), dummy weights, 1,024 tokens a page;
    pages from a pool of distinct generated pages (reused under new names)."""
    from bench.gpu import common, inputs
    from bench.gpu.daemon import GpuDaemon, stop_and_record
    from bench.gpu.multi import auto_engine, memory

    for k, v in common.ENV.items():
        os.environ.setdefault(k, v)
    args.model = args.model or args.work / ("tiny-model" if args.tiny else "model")
    if not (args.model / "config.json").exists():
        if args.tiny:
            from tests.vllm_engine.tiny_model import build

            build(args.model)
        else:
            inputs.build_model(args.model)
    args.engine_arg = []
    engine = auto_engine("auto", args)
    env = common.tiny_env() if args.tiny else {"PYTHONPATH": os.pathsep.join(
        [os.environ.get("PYTHONPATH", ""), str(ROOT)])}
    pool: dict[int, list[bytes]] = {}
    for n in sorted({pages for _, pages in MIXES[args.mix]}):
        files = max(2, args.pool_pages // n)
        pdfs = inputs.make_pdfs(args.work / f"steady_pool_{n}", files * n, n, 400_000 + n * 1000)
        pool[n] = [p.read_bytes() for p in pdfs]
    turn: dict[int, int] = {}

    def source(a: Arrival) -> bytes:
        turn[a.pages] = turn.get(a.pages, -1) + 1
        return pool[a.pages][turn[a.pages] % len(pool[a.pages])]

    # (WORK/steady/daemon: its sessions land in WORK/sessions.txt, where `run.py cleanup`
    # looks for what a cut run left running)
    d = GpuDaemon(args.work / "steady" / "daemon", engine, env, quiet_seconds=1.0)
    if args.tiny:  # a shared CPU machine: its ports may be taken
        d.config.update(metrics={"listen": None}, web={"listen": None})
    result: dict[str, Any] = {}
    d.start(wait_ready=False)
    try:
        ready = d.wait_event("ready", 1200)
        result["daemon_ready_s"] = round(time.monotonic() - d.started_at, 1)
        result["pages_in_flight"] = ready.get("pages_in_flight")
        profile = d.events("vllm_profile")
        result["profile"] = profile[-1].get("profile") if profile else None
        result["gpu_mem_after_start_mib"] = memory()
        d.remember_sessions()
        watcher = Outbox(d.outbox, d.failed)
        watcher.start()
        dropped = [0]

        def counted(a: Arrival) -> bytes:
            dropped[0] += 1
            return source(a)

        try:
            result.update(ladder(d.inbox, watcher, counted, args.rates, args.segment,
                                 args.mix, args.latency_segment or args.segment,
                                 lambda: wait_drained(watcher, lambda: dropped[0], 600)))
        finally:
            watcher.stop()
    finally:
        stop_and_record(d, result, memory)
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")],
                   default=[2.0, 4.0, 6.0], help="pages/s, in rising order")
    p.add_argument("--segment", type=float, default=60.0, help="seconds per rate")
    p.add_argument("--latency-segment", type=float, default=0.0,
                   help="seconds at 50 %% and 90 %% (default: --segment)")
    p.add_argument("--mix", choices=sorted(MIXES), default="8")
    p.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    p.add_argument("--gpu", action="store_true",
                   help="vLLM with the auto profile (bench/gpu/run.sh steady) instead of "
                        "the simulated engine")
    p.add_argument("--tiny", action="store_true", help="with --gpu: the CPU build's tiny model")
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu-work"))
    p.add_argument("--model", type=Path, default=None, help="with --gpu (default WORK/model)")
    p.add_argument("--pool-pages", type=int, default=256,
                   help="with --gpu: distinct generated pages per file size")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    # a time limit's SIGTERM unwinds (the finally blocks stop the daemon and its servers)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run_gpu(args) if args.gpu else run_simulated(args)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
