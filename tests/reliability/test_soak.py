"""A short soak in the suite (the 30-minute one is tests/reliability/soak.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from soak import run, verdict

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.slow]


def test_short_soak_memory_fds_threads_flat_and_keeping_up(tmp_path: Path) -> None:
    result = run(tmp_path, minutes=1.5, rate=4, every=6)
    assert result["dropped"] >= 300
    assert verdict(result) == [], result["rows"]


def test_the_verdict_looks_for_leaks_when_the_daemon_is_idle() -> None:
    """A backlog's descriptors during the run are no leak (CI once saw 41 → 87 → 41);
    what stays after every file is converted is."""
    rows = [{"t_s": t, "dropped": 4 * t, "converted": 4 * t - 2, "fds": fds, "rss_mb": rss,
             "threads": 13} for t, fds, rss in ((6, 40, 200), (12, 41, 201), (18, 87, 255),
                                                (24, 41, 201))]
    idle = {"converted": 100, "dropped": 100, "fds": 32, "rss_mb": 196.6, "threads": 13}
    result = {"rows": rows, "rate": 4, "idle_before": idle, "idle_after": dict(idle)}
    assert verdict(result) == []
    leaked = dict(idle, fds=42, rss_mb=260.0, threads=20)
    assert verdict({**result, "idle_after": leaked}) == [
        "memory grew: 197 → 260 MB when idle", "file descriptors grew: 32 → 42 when idle",
        "threads grew: 13 → 20 when idle"]
    behind = dict(idle, converted=90)
    assert verdict({**result, "idle_after": behind}) == [
        "the daemon did not catch up after the soak"]
