"""`ocrd run` as a real subprocess: the one harness that the tests (helpers.Daemon), the
benchmarks (bench/harness.py) and the GPU benchmark (bench/gpu/daemon.py) start the
daemon with.

The daemon runs in its own session (a stop or kill reaches its whole process group),
without the caller's systemd variables (unless a test gives its own), its JSON log
appended to a file that `events()` reads incrementally. A failure to start or stop
raises AssertionError with the log's end.
(tests/systemd/runner.py runs alone inside a container under systemd, which starts the
daemon there, so it has only its own few journal helpers.)

Imported as `daemon_process` by the tests (tests/ is on sys.path) and as
`tests.daemon_process` by the benchmarks (the repository root is).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

# ocrd as a user installs it: `pip install .` into a virtual environment of its own,
# without the test tools. scripts/test names that environment's `ocrd` command here for
# its second pass; the daemon and the other `ocrd` commands the tests start are then
# that one, so that a dependency only the test environment has cannot make them pass.
USER_OCRD = "OCRD_TEST_OCRD"
# this folder: the test engines (simulated_engines.py) that daemons load by class path
TESTS = str(Path(__file__).resolve().parent)


def ocrd_command() -> list[str]:
    """How the tests start `ocrd`: the command in $OCRD_TEST_OCRD, else this
    interpreter's `python -m ocrd` (the checkout's ocrd, with the test tools)."""
    installed = os.environ.get(USER_OCRD)
    return [installed] if installed else [sys.executable, "-m", "ocrd"]


def ocrd_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for an `ocrd` the tests start: `env` (default: this process's),
    with this folder on PYTHONPATH (the engines the tests name by class path:
    simulated_engines.py) — and only this folder when `ocrd` is the user's install (the
    checkout on PYTHONPATH would stand in for the installed copy)."""
    out = dict(os.environ if env is None else env)
    if os.environ.get(USER_OCRD):
        out["PYTHONPATH"] = TESTS
    else:
        rest = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != TESTS]
        out["PYTHONPATH"] = os.pathsep.join([TESTS, *rest])
    return out


def wait_for(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.1,
             error: type[Exception] = AssertionError) -> Any:
    """pred()'s first true value, polled every `every` s; `error` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class DaemonProcess:
    """One daemon: `config` is written to root/config.yaml at each start; the log goes to
    root/daemon.log. `prefix`: a command that runs the daemon (e.g. setpriv with fewer
    capabilities); `env`: variables on top of this process's."""

    def __init__(self, root: Path, config: dict, env: dict[str, str] | None = None,
                 prefix: list[str] | None = None, cwd: Path | None = None) -> None:
        self.root = root
        self.config = config
        self.env = env or {}
        self.prefix = prefix or []
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.log_path = root / "daemon.log"
        self.config_path = root / "config.yaml"
        self.started_at = 0.0  # time.monotonic() of the last start
        self._events: list[dict] = []  # every event of the log file read so far
        self._read_to = 0  # bytes of the log file parsed into _events
        self._first_of_run = 0  # index in _events of this run's first event

    # -- life ----------------------------------------------------------------------------

    def write_config(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config))

    def start(self, wait_ready: bool = True, timeout: float = 60,
              systemd: dict[str, str] | None = None) -> DaemonProcess:
        """Start `ocrd run`; `systemd`: the variables systemd would set (NOTIFY_SOCKET,
        WATCHDOG_USEC), for a run under a test's notify socket."""
        self.write_config()
        self._parse()  # earlier runs' events: counted before this run's
        self._first_of_run = len(self._events)
        # a line a killed run left unfinished is not joined to this run's first one
        self._read_to = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = ocrd_env({**os.environ, **self.env})
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            env.pop(name, None)
        env.update(systemd or {})
        with open(self.log_path, "ab") as logf:
            self.started_at = time.monotonic()
            self.proc = subprocess.Popen(
                [*self.prefix, *ocrd_command(), "run", "-c", str(self.config_path)],
                cwd=self.cwd, stdout=logf,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)
        if wait_ready:
            self.wait_event("ready", timeout, what="daemon ready")
            if self.died():
                raise AssertionError(f"daemon exited early:\n{self.log_text()[-3000:]}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def died(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def stop(self, timeout: float = 60, strict: bool = True) -> int:
        """SIGTERM and wait; past `timeout` the group is killed and, when `strict`, that
        is an AssertionError. Returns the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                if strict:
                    raise AssertionError("daemon did not stop within the timeout") from None
        return self.proc.returncode

    def kill(self, group_left: bool = False) -> None:
        """SIGKILL the daemon's process group while it runs; `group_left`: also after it
        exited (what it left in its session, e.g. a vLLM server it started)."""
        if self.proc is None or (self.proc.poll() is not None and not group_left):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.stop()
        finally:
            self.kill()

    # -- the log -------------------------------------------------------------------------

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _parse(self) -> None:
        """Read the log's complete lines since the last call into _events."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._read_to)
                data = f.read()
        except FileNotFoundError:
            return
        cut = data.rfind(b"\n") + 1
        self._read_to += cut
        for line in data[:cut].splitlines():
            line = line.strip()
            if line.startswith(b"{"):
                with contextlib.suppress(ValueError):
                    self._events.append(json.loads(line))

    def events(self, name: str | None = None, since_start: bool = True) -> list[dict]:
        """The log's events (of this run, or of every run), those called `name` only."""
        self._parse()
        evs = self._events[self._first_of_run:] if since_start else self._events
        return [e for e in evs if name is None or e.get("event") == name]

    def event(self, name: str) -> dict | None:
        evs = self.events(name)
        return evs[-1] if evs else None

    def wait_event(self, name: str, timeout: float, what: str | None = None) -> dict:
        """The last event `name` of this run, waited for; AssertionError with the log's
        end if the daemon exits first."""
        found = wait_for(lambda: self.event(name) or self.died(), timeout,
                         what or f"event {name}", every=0.1)
        if found is True:
            assert self.proc is not None
            raise AssertionError(f"daemon exited ({self.proc.returncode}) before {name}:\n"
                                 f"{self.log_text()[-3000:]}")
        return found
