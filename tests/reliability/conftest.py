"""Fixtures of the reliability tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def tiny_fs(tmp_path: Path):
    """A 256 KiB tmpfs (a real filesystem that fills up), mounted for the test."""
    if os.geteuid() != 0:
        if os.environ.get("OCRD_REQUIRE_SYSTEMD") == "1":
            pytest.fail("mounting a tmpfs needs root (CI runs as root)")
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
