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
from simulated_engines import SIMULATED


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
    d = Daemon(out / "d", engine={"kind": SIMULATED,
                                  "options": {"step_seconds": 0.02, "decode_steps": 20}},
               log={"level": "info", "format": "json"})
    d.config["inboxes"][0].update(on_success="delete", quiet_seconds=0.5)
    d.start()
    stop = threading.Event()
    dropped = 0

    def converted_count() -> int:
        return sum(1 for _ in d.outbox.glob("*.md")) if d.outbox.exists() else 0

    def idle(timeout: float) -> dict:
        """The daemon's tree once every file dropped so far is converted: file
        descriptors held while files are in flight are gone then, leaked ones are not."""
        deadline = time.monotonic() + timeout
        while converted_count() < dropped and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # the last file's clean-up after its Markdown appeared
        return {"converted": converted_count(), "dropped": dropped, **sample(d.proc.pid)}

    # a few files first, so that what is opened once (the first conversion's) is in both
    for i in range(len(templates)):
        (d.inbox / f"w{i}.pdf").write_bytes(templates[i])
        dropped += 1
    idle_before = idle(120)

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
            converted = converted_count()
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
        try:
            idle_after = idle(120) if d.proc.poll() is None else None
        finally:
            d.stop()
    print(json.dumps({"idle_before": idle_before, "idle_after": idle_after}), flush=True)
    return {"rows": rows, "dropped": dropped, "rate": rate, "minutes": minutes,
            "idle_before": idle_before, "idle_after": idle_after}


def verdict(result: dict) -> list[str]:
    """Leaks are looked for when the daemon is idle: after the soak, with every file
    converted, against the idle daemon after its first few files. While files are in
    flight each holds memory and descriptors — more of them when the machine is slow
    and a backlog builds up (a busy CI machine once took the fds from 41 to 87 for a
    while) — so the samples of the run show whether it kept up, not whether it leaks."""
    rows = result["rows"]
    if len(rows) < 4:
        return ["too few samples"]
    problems = []
    before, after = result.get("idle_before"), result.get("idle_after")
    if after is None or after["converted"] < after["dropped"]:
        problems.append("the daemon did not catch up after the soak")
    else:
        if after["rss_mb"] > before["rss_mb"] * 1.10 + 5:
            problems.append(f"memory grew: {before['rss_mb']:.0f} → {after['rss_mb']:.0f} MB "
                            "when idle")
        if after["fds"] > before["fds"] + 3:
            problems.append(f"file descriptors grew: {before['fds']} → {after['fds']} "
                            "when idle")
        if after["threads"] > before["threads"] + 3:
            problems.append(f"threads grew: {before['threads']} → {after['threads']} when "
                            "idle")
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
