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


def test_a_file_the_daemon_dies_on_every_time_ends_in_failed(tmp_path: Path) -> None:
    """schedule.max_attempts: the daemon is killed whenever one file is being converted
    (as if that file crashed it). Killed alone, the file's attempt counts; after 3 such
    starts the next run moves it to failed/ with too_many_attempts and a readable reason,
    and a file dropped next to it is converted exactly once."""
    import json

    from helpers import Daemon, make_pdf, sentence_lines, wait_for

    src = tmp_path / "src"
    src.mkdir()
    poison = make_pdf(src / "poison.pdf", [sentence_lines(1, 3)] * 6)
    good = make_pdf(src / "good.pdf", [sentence_lines(2, 3)])
    d = Daemon(tmp_path / "d")
    d.config["inboxes"][0]["quiet_seconds"] = 0.3
    (d.inbox / "poison.pdf").write_bytes(poison.read_bytes())
    kills = 0
    for _ in range(8):  # 3 counted kills are enough; a few spare for slow starts
        d.start(timeout=60)
        converting = wait_for(
            lambda: any(e.get("file") == "poison.pdf" for e in d.events("page_done"))
            or (d.failed / "poison.pdf").exists(), 60, "poison.pdf converting or failed")
        if (d.failed / "poison.pdf").exists():
            break
        assert converting
        d.kill()
        kills += 1
    (d.inbox / "good.pdf").write_bytes(good.read_bytes())
    try:
        wait_for(lambda: (d.outbox / "good.md").exists(), 60, "good.md")
    finally:
        d.stop()
    assert kills == 3
    error = json.loads((d.failed / "poison.pdf.error.json").read_text())
    assert error["reason"] == "too_many_attempts", error
    assert "3 times" in error["message"]
    assert not (d.outbox / "poison.md").exists()
    assert sorted(p.name for p in d.outbox.glob("*.md")) == ["good.md"]
    failed = d.events("file_failed", since_start=False)
    assert [e["file"] for e in failed] == ["poison.pdf"]
