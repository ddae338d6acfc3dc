"""Soak: a steady drop rate into a running daemon (simulated engine) for a long time,
sampling memory, file descriptors, threads and throughput of the daemon's process tree.

    .venv/bin/python tests/reliability/soak.py --minutes 30 --rate 4 --out /tmp/soak

Prints a table (one row per sample) and a verdict; exits non-zero when memory, fds or
threads grow, or throughput falls behind the drop rate. tests/reliability/test_soak.py
runs a one-minute version in the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers import Daemon, make_pdf, sentence_lines  # noqa: E402


def tree(pid: int) -> list[int]:
    """pid and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def sample(pid: int) -> dict:
    rss = fds = threads = 0
    procs = tree(pid)
    for p in procs:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Threads:") and p == pid:
                        threads = int(line.split()[1])
            if p == pid:
                fds = len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue
    return {"rss_mb": round(rss / 2**20, 1), "fds": fds, "threads": threads,
            "processes": len(procs)}


def run(out: Path, minutes: float, rate: float, every: float) -> dict:
    src = out / "src"
    src.mkdir(parents=True, exist_ok=True)
    templates = [make_pdf(src / f"t{i}.pdf", [sentence_lines(i, 4)] * (1 + i % 3)).read_bytes()
                 for i in range(5)]
    d = Daemon(out / "d", engine={"kind": "simulated",
                                  "simulated": {"step_seconds": 0.02, "decode_steps": 20}},
               log={"level": "info", "format": "json"})
    d.config["inboxes"][0].update(on_success="delete", quiet_seconds=0.5)
    d.start()
    stop = threading.Event()
    dropped = 0

    def writer() -> None:
        nonlocal dropped
        interval = 1.0 / rate
        next_at = time.monotonic()
        while not stop.is_set():
            name = f"s{dropped:07d}.pdf"
            tmp = d.inbox / (name + ".part")
            tmp.write_bytes(templates[dropped % len(templates)])
            tmp.rename(d.inbox / name)
            dropped += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    rows = []
    t0 = time.monotonic()
    converted_before = 0
    try:
        while time.monotonic() - t0 < minutes * 60:
            time.sleep(every)
            converted = sum(1 for _ in d.outbox.glob("*.md")) if d.outbox.exists() else 0
            row = {"t_s": round(time.monotonic() - t0), "dropped": dropped,
                   "converted": converted,
                   "files_per_s": round((converted - converted_before) / every, 2),
                   **sample(d.proc.pid)}
            converted_before = converted
            rows.append(row)
            print(json.dumps(row), flush=True)
            if d.proc.poll() is not None:
                break
    finally:
        stop.set()
        t.join()
        d.stop()
    return {"rows": rows, "dropped": dropped, "rate": rate, "minutes": minutes}


def verdict(result: dict) -> list[str]:
    rows = result["rows"]
    problems = []
    if len(rows) < 4:
        return ["too few samples"]
    warm = rows[len(rows) // 4:]  # the first quarter is warm-up
    half = len(warm) // 2
    early, late = warm[:half], warm[half:]

    def avg(rs: list[dict], key: str) -> float:
        return sum(r[key] for r in rs) / len(rs)

    if avg(late, "rss_mb") > avg(early, "rss_mb") * 1.10 + 5:
        problems.append(f"memory grew: {avg(early, 'rss_mb'):.0f} → {avg(late, 'rss_mb'):.0f} MB")
    if max(r["fds"] for r in late) > max(r["fds"] for r in early) + 5:
        problems.append("file descriptors grew")
    if max(r["threads"] for r in late) > max(r["threads"] for r in early) + 3:
        problems.append("threads grew")
    lag = rows[-1]["dropped"] - rows[-1]["converted"]
    if lag > result["rate"] * 30:
        problems.append(f"throughput fell behind: {lag} files not converted at the end")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=float, default=4, help="files dropped per second")
    ap.add_argument("--every", type=float, default=30, help="seconds between samples")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    result = run(args.out, args.minutes, args.rate, args.every)
    problems = verdict(result)
    print(json.dumps({"dropped": result["dropped"], "problems": problems}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
