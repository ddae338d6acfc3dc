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
