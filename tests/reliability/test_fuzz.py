"""The stateful inbox fuzzer (fuzz_inbox.py), seeded and short: 75 s of random inbox
operations against a running daemon, then every invariant. The long run:
`.venv/bin/python tests/reliability/fuzz_inbox.py --minutes 30 --seed N --out DIR`."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_inbox import problems, run

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.parametrize("seed", [11])
def test_random_inbox_operations_keep_every_promise(tmp_path: Path, seed: int) -> None:
    report = run(tmp_path, seed=seed, seconds=75)
    assert report["ops"].get("folder_to_link") and report["ops"].get("hardlink"), report
    assert report["expected"] > 100, report  # the run did something
    assert problems(report) == [], report
