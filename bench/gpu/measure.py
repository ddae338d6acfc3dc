"""What the GPU benchmark samples beside a measured run: GPU memory and busy share
(nvidia-smi), Prometheus gauges of vLLM and ocrd, the engine core's stacks (py-spy), and
the processes a run leaves behind (only those of its own sessions are ever killed).
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class Sampler:
    """Calls `sample()` every 0.5 s on a background thread inside a `with` block."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.sample()

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


class GpuMemory(Sampler):
    """Peak GPU memory in use and the GPU's busy share (nvidia-smi, every 0.5 s) while a
    phase runs."""

    def __init__(self) -> None:
        super().__init__()
        self.peak: int | None = None
        self.samples: list[tuple[float, int]] = []
        self.busy: list[tuple[float, int]] = []  # (monotonic time, utilization.gpu %)

    @staticmethod
    def query() -> tuple[int, int] | None:
        """(MiB in use, % of the last sample period a kernel ran)."""
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,utilization.gpu",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=10).stdout
            used, util = out.splitlines()[0].split(",")
            return int(used), int(util)
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None

    @classmethod
    def used(cls) -> int | None:
        q = cls.query()
        return q[0] if q else None

    def sample(self) -> None:
        q = self.query()
        if q is not None:
            now = time.monotonic()
            self.samples.append((round(now - self.t0, 1), q[0]))
            self.busy.append((now, q[1]))
            self.peak = max(self.peak or 0, q[0])

    def busy_between(self, t0: float, t1: float) -> float | None:
        """Mean GPU utilisation (%) between two time.monotonic() readings."""
        xs = [u for t, u in self.busy if t0 <= t <= t1]
        return round(sum(xs) / len(xs), 1) if xs else None


class Gauges(Sampler):
    """Prometheus gauges sampled every 0.5 s while a phase runs: vLLM's requests running
    and waiting in the engine (the server's /metrics) and ocrd's pages in flight (the
    daemon's), to see whether the engine was kept full."""

    WANTED = ("vllm:num_requests_running", "vllm:num_requests_waiting",
              "vllm:kv_cache_usage_perc", "ocrd_pages_in_flight", "ocrd_queue_depth")

    def __init__(self, urls: list[str]) -> None:
        super().__init__()
        self.urls = urls
        self.samples: list[tuple[float, dict[str, float]]] = []

    @classmethod
    def parse(cls, text: str) -> dict[str, float]:
        """Each wanted gauge's largest value over its label sets (with several API
        servers, each may report the one engine's gauge)."""
        out: dict[str, float] = {}
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in cls.WANTED:
                try:
                    value = float(line.rsplit(" ", 1)[1])
                except (IndexError, ValueError):
                    continue
                out[name] = max(out.get(name, value), value)
        return out

    def sample(self) -> None:
        import urllib.request

        now, values = time.monotonic(), {}
        for url in self.urls:
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    values.update(self.parse(resp.read().decode()))
            except OSError:
                continue
        if values:
            self.samples.append((now, values))

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """Mean of each gauge between two time.monotonic() readings."""
        rows = [v for t, v in self.samples if t0 <= t <= t1]
        names = sorted({k for v in rows for k in v})
        return {f"mean_{k.replace('vllm:', 'vllm_')}": round(
            statistics.fmean(v[k] for v in rows if k in v), 2) for k in names}


def live_processes() -> Iterator[tuple[int, int, str]]:
    """(pid, session id, command line) of every live (not zombie) process."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[-1].split()
            cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if stat[0] != "Z":
            yield int(entry.name), int(stat[3]), cmd.decode(errors="replace")


def engine_core_pids() -> list[int]:
    """vLLM's engine core processes (they name themselves VLLM::EngineCore...)."""
    return [pid for pid, _, cmd in live_processes() if "EngineCore" in cmd]


def py_spy() -> str | None:
    """py-spy from PATH or from a --target install on PYTHONPATH (gpu_run.sh's)."""
    found = shutil.which("py-spy")
    for entry in [*os.environ.get("PYTHONPATH", "").split(os.pathsep), sys.prefix]:
        if not found and entry and (Path(entry) / "bin" / "py-spy").exists():
            found = str(Path(entry) / "bin" / "py-spy")
    return found


# --profile-native: py-spy also samples C/C++ frames, pausing the engine core for each
# sample (py-spy cannot read native stacks otherwise): a diagnosis, not a measured row
PYSPY_NATIVE = False


def profile_engine_core(out: Path, name: str, delay: float, seconds: int) -> threading.Thread:
    """After `delay` s, sample the engine core's Python stacks for `seconds` s (py-spy,
    every thread, idle frames included, without pausing it unless PYSPY_NATIVE) into
    OUT/pyspy_NAME.txt (collapsed stacks). Runs beside the measured run; the same for
    every row compared."""

    def run() -> None:
        time.sleep(delay)
        exe, pids = py_spy(), engine_core_pids()
        note = out / f"pyspy_{name}.txt"
        if not exe or not pids:
            note.write_text(f"no py-spy ({exe}) or no engine core ({pids})\n")
            return
        mode = ["--native"] if PYSPY_NATIVE else ["--nonblocking"]
        r = subprocess.run([exe, "record", "--pid", str(pids[0]), "--duration", str(seconds),
                            "--rate", "50", *mode, "--idle", "--threads",
                            "--format", "raw", "--output", str(note)],
                           capture_output=True, text=True, timeout=seconds + 60)
        if r.returncode:
            note.write_text(f"py-spy rc={r.returncode}: {r.stderr[-2000:]}\n")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def gpu_processes() -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=10).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        return []


def session_processes(sessions: set[int]) -> list[str]:
    """Live processes (not zombies) in the given sessions: what our daemon (its own
    session) and its vLLM server (another one) left behind. Nothing else is touched."""
    return [f"{pid} {cmd[:160]}" for pid, sid, cmd in live_processes() if sid in sessions]


def end_sessions(sessions: set[int]) -> list[str]:
    """SIGKILL what is left of our own daemon's and server's sessions; what was left."""
    left = session_processes(sessions)
    for line in left:
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    return left
