"""The state folder under stress: a damaged journal, a deleted state folder, a full one,
a read-only one. Claimed files are never stranded, no file fails for the state folder's
trouble, and the daemon resumes alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import Daemon, claimed_files, fill, make_pdf, sentence_lines, wait_for
from simulated_engines import SIMULATED

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]

SLOW = {"kind": SIMULATED, "options": {"max_batch": 1, "step_seconds": 0.05,
                                           "decode_steps": 10, "decode_jitter": 0}}


def leave_claimed(tmp_path: Path, n: int) -> Daemon:
    """A daemon that claimed n files and stopped at once (drain 0): they wait in its work
    area, with journal rows."""
    d = Daemon(tmp_path / "d", engine=SLOW, drain_timeout_seconds=0,
               schedule={"max_active_documents": 1, "pages_in_flight": 1})
    d.config["inboxes"][0]["quiet_seconds"] = 0.2
    d.start()
    for i in range(n):
        make_pdf(d.inbox / f"doc{i}.pdf", [sentence_lines(i, 2)] * 3)
    wait_for(lambda: len(claimed_files(d.inbox)) == n, 60, f"{n} files claimed")
    assert d.stop() == 0
    assert len(claimed_files(d.inbox)) == n
    return d


def all_converted(d: Daemon, n: int) -> bool:
    return all((d.outbox / f"doc{i}.md").exists() for i in range(n))


def test_a_damaged_journal_is_set_aside_and_claimed_files_are_taken_up(
        tmp_path: Path) -> None:
    d = leave_claimed(tmp_path, 6)
    state = d.root / "state"
    journal = state / "journal.sqlite3"
    for extra in ("journal.sqlite3-wal", "journal.sqlite3-shm"):
        (state / extra).unlink(missing_ok=True)
    journal.write_bytes(os.urandom(journal.stat().st_size or 8192))
    with d:
        d.start()
        wait_for(lambda: all_converted(d, 6), 120, "the six claimed files converted")
        ev = d.event("journal_corrupt")
        assert ev is not None and ev["set_aside"].startswith("journal.sqlite3.corrupt-"), ev
        assert (state / ev["set_aside"]).exists()
        assert len(d.events("orphan_adopted")) == 6
    assert claimed_files(d.inbox) == []


def test_a_deleted_state_folder_does_not_strand_claimed_files(tmp_path: Path) -> None:
    d = leave_claimed(tmp_path, 6)
    old = {p.name for p in (d.inbox / ".ocrd-work").iterdir()}
    shutil.rmtree(d.root / "state")
    with d:
        d.start()
        wait_for(lambda: all_converted(d, 6), 120, "the six claimed files converted")
        adopted = d.event("work_area_adopted")
        assert adopted is not None and adopted["instance"] in old, adopted
    assert claimed_files(d.inbox) == []
    # the old work area is gone; only the new instance's remains
    assert {p.name for p in (d.inbox / ".ocrd-work").iterdir()}.isdisjoint(old)


def test_a_work_area_of_another_live_state_folder_is_left_alone(tmp_path: Path) -> None:
    """Two daemons with their own state folders share an inbox: one's claimed files are
    never taken by the other while its state still names its work area."""
    d = leave_claimed(tmp_path, 2)
    other = Daemon(tmp_path / "other", inboxes=d.config["inboxes"])
    with other:
        other.start()
        make_pdf(d.inbox / "new.pdf", [sentence_lines(50, 2)])
        wait_for(lambda: (d.outbox / "new.md").exists(), 60, "new.md")
        assert other.events("work_area_adopted") == []
        assert len(claimed_files(d.inbox)) == 2  # still d's, waiting for d


def test_a_full_state_folder_pauses_claims_fails_nothing_and_resumes(
        tmp_path: Path, tiny_fs: Path) -> None:
    d = Daemon(tmp_path / "d", state_dir=str(tiny_fs / "state"),
               engine={"kind": SIMULATED, "options": {"instant": True}},
               render={"dpi": 36})
    d.config["inboxes"][0]["quiet_seconds"] = 0.2
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(1, 2)]).read_bytes()
    with d:
        d.start()
        filler = fill(tiny_fs)
        for i in range(60):
            (d.inbox / f"f{i}.pdf").write_bytes(src)
        wait_for(lambda: d.events("state_unwritable"), 60, "the full state folder reported")
        log_lines = len(d.log_text().splitlines())
        wait_for(lambda: len(d.log_text().splitlines()) > log_lines, 30, "time passing")
        assert not d.failed.exists() or not any(d.failed.iterdir())  # nothing failed
        filler.unlink()  # space comes back
        wait_for(lambda: all((d.outbox / f"f{i}.md").exists() for i in range(60)), 120,
                 "all 60 converted without a restart")
        assert d.proc.poll() is None
        assert not d.failed.exists() or not any(d.failed.iterdir())
        # Backing off, not spinning: a handful of lines, not tens of thousands.
        assert len(d.events("state_unwritable")) < 40, len(d.events("state_unwritable"))
        assert d.events("check_failed") == [] and d.events("task_failed") == []
    assert claimed_files(d.inbox) == []


def test_a_read_only_state_folder_at_start_is_one_clear_line(tmp_path: Path,
                                                             tiny_fs: Path) -> None:
    (tiny_fs / "state").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    d = Daemon(tmp_path / "d", state_dir=str(tiny_fs / "state"))
    d.write_config()
    res = subprocess.run([sys.executable, "-m", "ocrd", "run", "-c", str(d.config_path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res
    assert "Traceback" not in res.stderr, res.stderr
    line = [x for x in res.stderr.splitlines() if x.startswith("ocrd: ")]
    assert len(line) == 1 and "state folder" in line[0] and "Read-only" in line[0], \
        res.stderr
