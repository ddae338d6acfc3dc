"""The files in systemd/, checked offline with systemd's own tools: the unit loads without
a single warning, its sandbox scores as exposed as we claim, the sysusers and tmpfiles
snippets create what the unit expects, and its timeouts cover what the daemon does.

A real systemd runs the unit in tests/systemd/test_nspawn.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ocrd.config.settings import Config

UNITS = Path(__file__).resolve().parents[2] / "systemd"
UNIT = UNITS / "ocrd.service"
EXPOSURE_LIMIT = 3.0


@pytest.fixture(autouse=True)
def _systemd_tools() -> None:
    missing = [t for t in ("systemd-analyze", "systemd-sysusers", "systemd-tmpfiles")
               if shutil.which(t) is None]
    if missing:
        why = f"{', '.join(missing)} not installed (apt-get install systemd)"
        if os.environ.get("OCRD_REQUIRE_SYSTEMD") == "1":
            pytest.fail(f"OCRD_REQUIRE_SYSTEMD=1 but {why}")
        pytest.skip(why)


def settings(path: Path = UNIT) -> dict[str, list[str]]:
    """KEY → every value it is given, in order (unit files repeat keys)."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def seconds(value: str) -> float:
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "ms": 0.001}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


def ocrd_dropin(unit_dir: Path, ocrd: str) -> None:
    """What an installation elsewhere than /opt/ocrd does (see the unit's header): a
    drop-in that changes ExecStart's path and nothing else."""
    dropin = unit_dir / "ocrd.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    exec_start = settings()["ExecStart"][0]
    assert exec_start.startswith("/opt/ocrd/bin/ocrd "), exec_start
    (dropin / "path.conf").write_text(
        "[Service]\nExecStart=\nExecStart=" + exec_start.replace("/opt/ocrd/bin/ocrd", ocrd, 1)
        + "\n")


def test_verify_prints_nothing(tmp_path: Path) -> None:
    """`systemd-analyze verify` exits 0 even on unknown keys and bad values: any output
    at all is a failure. /opt/ocrd/bin/ocrd does not exist here, so the unit is checked
    with a drop-in pointing ExecStart at this checkout's ocrd."""
    ocrd = str(Path(sys.executable).parent / "ocrd")
    assert Path(ocrd).exists(), ocrd
    shutil.copy(UNIT, tmp_path / "ocrd.service")
    ocrd_dropin(tmp_path, ocrd)
    res = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "ocrd.service")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout + res.stderr == "", res.stdout + res.stderr


def test_verify_would_notice_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt key is reported."""
    ocrd = str(Path(sys.executable).parent / "ocrd")
    (tmp_path / "ocrd.service").write_text(
        UNIT.read_text().replace("ProtectHome=yes", "ProtectHome=yes\nProtectHomes=yes"))
    ocrd_dropin(tmp_path, ocrd)
    res = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "ocrd.service")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "ProtectHomes" in res.stdout + res.stderr


def test_security_exposure_is_low() -> None:
    res = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(UNIT)],
                         capture_output=True, text=True, timeout=60)
    out = res.stdout + res.stderr
    match = re.search(r"Overall exposure level for ocrd\.service:\s*([\d.]+)", out)
    assert match, out
    assert float(match.group(1)) <= EXPOSURE_LIMIT, out


def test_timeouts_cover_the_daemon() -> None:
    unit = settings()
    assert unit["Type"] == ["notify"] and unit["NotifyAccess"] == ["main"]
    assert unit["KillMode"] == ["mixed"]
    # Stop: the drain, then up to 60 s to close the engine (service.shutdown).
    drain = Config.model_fields["drain_timeout_seconds"].default
    assert seconds(unit["TimeoutStopSec"][0]) >= drain + 60
    # Watchdog: ocrd pings every min(WatchdogSec/2, 5 s); leave room for a slow turn.
    assert seconds(unit["WatchdogSec"][0]) >= 30
    # Start: a model loads for minutes (EXTEND_TIMEOUT_USEC covers longer loads).
    assert seconds(unit["TimeoutStartSec"][0]) >= 120
    # Not these: they hide the NVIDIA device nodes or /proc/driver/nvidia.
    assert unit.get("PrivateDevices", ["no"]) == ["no"]
    assert "ProcSubset" not in unit
    env = dict(v.split("=", 1) for v in unit["Environment"])
    for name in ("HF_HOME", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):
        assert env[name].startswith("/var/cache/ocrd"), name
    assert unit["CacheDirectory"] == ["ocrd"] and unit["StateDirectory"] == ["ocrd"]


def test_sysusers_and_tmpfiles_create_what_the_unit_expects(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    res = subprocess.run(["systemd-sysusers", f"--root={root}", str(UNITS / "ocrd.sysusers")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    passwd = (root / "etc/passwd").read_text()
    assert re.search(r"^ocrd:x:\d+:\d+:[^:]*:/var/lib/ocrd:/usr/sbin/nologin$", passwd, re.M)
    assert re.search(r"^scans:x:\d+:", (root / "etc/group").read_text(), re.M)
    res = subprocess.run(["systemd-tmpfiles", f"--root={root}", "--create",
                          str(UNITS / "ocrd.tmpfiles")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and res.stdout + res.stderr == "", res.stderr
    for folder in ("inbox", "markdown", "archive", "failed"):
        mode = (root / "srv/scans" / folder).stat().st_mode & 0o7777
        assert mode == 0o2770, (folder, oct(mode))
    assert (root / "etc/ocrd").stat().st_mode & 0o777 == 0o750
    # Every folder the example creates is writable under ProtectSystem=strict.
    assert "-/srv/scans" in settings()["ReadWritePaths"]
