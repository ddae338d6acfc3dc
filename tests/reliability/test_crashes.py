"""SIGKILL at random moments while files keep arriving: nothing lost, nothing twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from crash_cycles import check, run

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]


def test_kill_restart_cycles_lose_nothing_and_duplicate_nothing(tmp_path: Path) -> None:
    report = run(tmp_path, cycles=6, seed=7)
    assert report["files_dropped"] >= 12
    assert check(report) == [], report
