"""A booted throwaway container for the systemd tests: this machine's own /usr under
`systemd-nspawn --volatile=yes` (an empty root, nothing persists), booted into a oneshot
runner.service that does the test's steps and powers the container off when it ends.
What the runner saw comes back through a folder bound at /out.

Needs root and systemd-nspawn (apt-get install systemd-container). Without them the tests
skip, or fail when OCRD_REQUIRE_SYSTEMD=1 (CI)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

RUNNER_UNIT = """\
[Unit]
Description=ocrd systemd test runner
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
ExecStart={exec_start}
TimeoutStartSec={timeout}
StandardOutput=journal+console
StandardError=journal+console
"""


def unavailable() -> str | None:
    """Why no container can boot here, or None."""
    if os.geteuid() != 0:
        return "systemd-nspawn needs root"
    if shutil.which("systemd-nspawn") is None:
        return "systemd-nspawn is not installed (apt-get install systemd-container)"
    if not os.path.exists("/usr/lib/systemd/systemd"):
        return "systemd is not installed"
    return None


def cannot_run(why: str) -> None:
    if os.environ.get("OCRD_REQUIRE_SYSTEMD") == "1":
        pytest.fail(f"OCRD_REQUIRE_SYSTEMD=1 but a real systemd cannot run here: {why}")
    pytest.skip(why)


def boot(work: Path, exec_start: str, binds: list[str], *, timeout: float,
         runner_timeout: float, private_network: bool = False) -> tuple[str, int | None]:
    """Boot into runner.service (ExecStart=`exec_start`, at most `runner_timeout` s) with
    `binds` (systemd-nspawn --bind=/--bind-ro= values, given whole); the container's
    console output and exit status, after at most `timeout` s."""
    unit = work / "runner.service"
    unit.write_text(RUNNER_UNIT.format(exec_start=exec_start, timeout=int(runner_timeout)))
    cmd = ["systemd-nspawn", "--quiet", "--directory=/", "--volatile=yes", "--register=no",
           "--keep-unit", f"--machine=ocrd-test-{uuid.uuid4().hex[:8]}",
           *(["--private-network"] if private_network else []),
           *binds, f"--bind-ro={unit}:/etc/systemd/system/runner.service",
           "--boot", "--console=pipe", "--", "systemd.unit=runner.service"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace")
    try:
        console, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM makes systemd-nspawn power the container off; SIGKILL if even that hangs.
        proc.send_signal(signal.SIGTERM)
        try:
            console, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            console, _ = proc.communicate()
        console += f"\n[test] the container ran past {timeout} s and was stopped"
    (work / "console.log").write_text(console)
    return console, proc.returncode
