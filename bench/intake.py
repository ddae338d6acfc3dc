"""A huge backlog against the intake loop, side by side with a backlog of 1,000 files:

- `intake_rescan_blocked_{50k,200k}_vs_50ms`: the longest the daemon's event loop was
  blocked while it rescanned an inbox of 50,000 / 200,000 files (target: 50 ms at most,
  whatever the backlog). The files wait for their quiet period (an hour) the whole
  time, so the loop has nothing else to do than the rescans (every 3 s), the console's
  questions and the ticker; the window begins once the first scan has taken them all in.
- `intake_files_per_s_{50k,200k}_vs_1k`: files converted per second while the backlog
  is worked off (quiet period 1 s, simulated engine at its default ~15 pages/s), ÷ the
  same with 1,000 files; the longest block and the console's answers in the details.

Each run is the real daemon (`service.daemon.Daemon`, the console on) in this process,
on a fresh inbox of N one-page PNGs (hard links to a few distinct ones: the files cost
no disk). A ticker on the daemon's loop wakes every 2 ms; its worst lateness in the
window is the longest the loop was blocked; the rescans run twice (three times in full)
on the same inbox, the least blocked round counting (a busy machine only adds); the
same ticker's worst lateness alone, before the daemon starts, is the machine's noise.
Meanwhile a thread asks the console's /api/status every 0.25 s, as a browser's overview
does, and counts the answers in which the daemon did not answer within its second ("the
daemon does not answer").

    PYTHONPATH=$PWD .venv/bin/python -m bench.intake [--files 50000,200000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from bench.cases import SIMULATED, Result, _log, fresh
from bench.harness import daemon_config, png_bytes

TARGET_MS = 50.0
TICK_S = 0.002
RESCAN_SECONDS = 3.0
BASELINE_FILES = 1_000
SIZES = (50_000, 200_000)
DISTINCT = 64  # distinct images the backlog's files are links to
IDLE_SECONDS = 2.0  # the ticker alone before the daemon starts


class Ticker:
    """Wakes every TICK_S on the running loop; keeps every lateness after `since`."""

    def __init__(self) -> None:
        self.late: list[tuple[float, float]] = []  # (monotonic time, seconds late)
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            self.late.append((now, now - last - TICK_S))
            last = now

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ticker")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def between(self, t0: float, t1: float) -> list[float]:
        return sorted(late for t, late in self.late if t0 <= t <= t1)


class StatusPoller:
    """/api/status every `every` seconds from a thread: answers, and answers where the
    daemon's loop did not answer (`"daemon": null`)."""

    def __init__(self, address: str, every: float = 0.25) -> None:
        self.host, _, port = address.rpartition(":")
        self.port = int(port)
        self.every = every
        self.asked = self.no_daemon = self.errors = 0
        self.slowest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
                conn.request("GET", "/api/status", headers={"Host": f"127.0.0.1:{self.port}"})
                body = json.loads(conn.getresponse().read())
                conn.close()
                self.no_daemon += body.get("daemon") is None
            except (OSError, ValueError):
                self.errors += 1
            self.asked += 1
            self.slowest = max(self.slowest, time.monotonic() - t0)
            self._stop.wait(self.every)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def fill_inbox(root: Path, files: int) -> Path:
    """An inbox of `files` one-page PNGs, hard links to DISTINCT images."""
    sources = root / "sources"
    sources.mkdir()
    for i in range(DISTINCT):
        (sources / f"{i}.png").write_bytes(png_bytes(i, (240, 80)))
    inbox = root / "inbox"
    inbox.mkdir()
    for k in range(files):
        os.link(sources / f"{k % DISTINCT}.png", inbox / f"scan_{k:06d}.png")
    # written out now: the daemon's first fsyncs must not pay for the new folder's blocks
    os.sync()
    return inbox


async def _run_daemon(root: Path, files: int, quiet: float, seconds: float
                      ) -> dict[str, Any]:
    from ocrd.config.load import parse_config
    from ocrd.service.daemon import Daemon

    raw = daemon_config(root, SIMULATED, rescan_seconds=RESCAN_SECONDS,
                        drain_timeout_seconds=0, web={"listen": "127.0.0.1:0"},
                        inbox={"on_success": "delete", "quiet_seconds": quiet,
                               "incomplete_seconds": max(quiet, 60.0)})
    raw.pop("log")
    daemon = Daemon(parse_config(raw, root))
    ticker = Ticker()
    ticker.start()
    idle_from = time.monotonic()
    await asyncio.sleep(IDLE_SECONDS)  # the ticker alone: the machine's own noise
    idle = ticker.between(idle_from, time.monotonic())
    serving = asyncio.create_task(daemon.serve(), name="daemon")
    t_start = time.monotonic()

    async def until(what: Any) -> None:
        while not what():
            if serving.done():
                serving.result()
                raise RuntimeError("the daemon stopped")
            await asyncio.sleep(0.05)

    await until(lambda: daemon.ready)
    ready = time.monotonic()
    parts = daemon.parts
    assert daemon.console is not None and daemon.console.address and parts is not None
    (inbox,) = list(parts.inboxes)
    # the first scan has taken every file in (or, converting, has got under way)
    await until(lambda: daemon.metrics.rescans._value.get() >= 1 and inbox.scanning
                is not None and inbox.scanning.done() and
                (quiet < 60 or len(inbox.tracker) >= files))
    begin = time.monotonic()
    poller = StatusPoller(daemon.console.address)
    poller.start()
    done_before = parts.outcomes.done_pages
    rescans_before = daemon.metrics.rescans._value.get()  # prometheus_client's value
    await asyncio.sleep(seconds)
    end = time.monotonic()
    done = parts.outcomes.done_pages - done_before
    rescans = daemon.metrics.rescans._value.get() - rescans_before
    await asyncio.to_thread(poller.stop)
    os.kill(os.getpid(), signal.SIGTERM)
    await serving
    ticker.stop()
    late = ticker.between(begin, end)
    first = ticker.between(ready, begin)
    return {"blocked_ms": round(late[-1] * 1000, 1),
            "p99_ms": round(late[int(0.99 * (len(late) - 1))] * 1000, 1),
            "over_50ms": sum(x > TARGET_MS / 1000 for x in late),
            "files_per_s": round(done / (end - begin), 2), "files_done": done,
            "seconds": round(end - begin, 1), "rescans": int(rescans),
            "start_seconds": round(ready - t_start, 1),
            "first_scan_seconds": round(begin - ready, 1),
            "first_scan_blocked_ms": round(max(first, default=0.0) * 1000, 1),
            "status_asked": poller.asked, "status_no_daemon": poller.no_daemon,
            "status_errors": poller.errors,
            "status_slowest_ms": round(poller.slowest * 1000, 1),
            "idle_noise_ms": round(max(idle, default=0.0) * 1000, 1),
            "load_average": round(os.getloadavg()[0], 2)}


def backlog_run(files: int, seconds: float, converting: bool, rounds: int = 1
                ) -> dict[str, Any]:
    """The daemon on an inbox of `files`, `rounds` times (each with a fresh state folder,
    the same inbox); the least blocked round counts: a busy machine's noise only adds."""
    what = "converting" if converting else "rescanning"
    root = fresh(f"intake-{what}-{files}")
    t0 = time.monotonic()
    fill_inbox(root, files)
    made = time.monotonic() - t0
    runs = []
    for _ in range(rounds):
        for name in ("state", "outbox", "failed", "archive"):
            shutil.rmtree(root / name, ignore_errors=True)
        runs.append(asyncio.run(_run_daemon(root, files, 1.0 if converting else 3600.0,
                                            seconds)))
    row = dict(min(runs, key=lambda r: r["blocked_ms"]))
    row.update(files=files, inbox_made_seconds=round(made, 1),
               rounds_blocked_ms=[r["blocked_ms"] for r in runs])
    _log(f"intake, {files} files, {what}: loop blocked {row['blocked_ms']} ms at most "
         f"(rounds {row['rounds_blocked_ms']}; p99 {row['p99_ms']} ms, {row['over_50ms']} "
         f"ticks over 50 ms; first scan {row['first_scan_blocked_ms']} ms), "
         f"{row['files_per_s']} files/s, console: {row['status_no_daemon']} of "
         f"{row['status_asked']} without the daemon, {row['rescans']} rescans; idle "
         f"noise {row['idle_noise_ms']} ms, load {row['load_average']}")
    return row


def intake_backlog(quick: bool, sizes: tuple[int, ...] = SIZES) -> list[Result]:
    from ocrd.service import log

    log.setup("warning", "console")
    seconds, rounds = (15.0, 2) if quick else (30.0, 3)
    results = []
    base = backlog_run(BASELINE_FILES, seconds, converting=False, rounds=rounds)
    for n in sizes:
        row = backlog_run(n, seconds, converting=False, rounds=rounds)
        results.append(Result(f"intake_rescan_blocked_{n // 1000}k_vs_50ms",
                              row["blocked_ms"] / TARGET_MS, 1.0, "<=",
                              {"backlog": row, "baseline": base}))
    base = backlog_run(BASELINE_FILES, seconds, converting=True)
    for n in sizes:
        row = backlog_run(n, seconds, converting=True)
        results.append(Result(f"intake_files_per_s_{n // 1000}k_vs_1k",
                              row["files_per_s"] / max(base["files_per_s"], 1e-9), 0.9,
                              ">=", {"backlog": row, "baseline": base}))
    return results


INTAKE_CASES = {"intake_backlog": intake_backlog}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", default=",".join(str(n) for n in SIZES),
                   help="backlog sizes, each beside the 1,000-file baseline")
    p.add_argument("--quick", action="store_true", help="15 s windows instead of 30 s")
    args = p.parse_args(argv)
    sizes = tuple(int(n) for n in args.files.split(",") if n)
    for r in intake_backlog(args.quick, sizes):
        print(f"{r.name:<36} {r.value:>8.3f}  {'ok' if r.ok else 'MISSED'}")


if __name__ == "__main__":
    main()
