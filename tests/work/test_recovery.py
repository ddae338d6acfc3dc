"""Crash recovery in-process (no daemon, no engine): each rule of work/recovery.py against a
journal and work areas laid out the way a crashed run leaves them."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from ocrd.config.settings import InboxConfig
from ocrd.intake.inboxes import Inboxes
from ocrd.service.metrics import Metrics
from ocrd.work.area import host_id
from ocrd.work.journal import Journal
from ocrd.work.outcomes import Outcomes
from ocrd.work.recovery import Recovery

INSTANCE = "a" * 32


class World:
    """An inbox (polling: no inotify thread), its destinations, a journal."""

    def __init__(self, tmp_path: Path, fresh: bool = False) -> None:
        self.root = tmp_path
        self.inbox = tmp_path / "inbox"
        self.inbox.mkdir()
        self.state = tmp_path / "state"
        self.state.mkdir()
        for folder in ("outbox", "failed", "archive"):
            (tmp_path / folder).mkdir()
        self.box = InboxConfig(path=self.inbox, outbox=tmp_path / "outbox",
                               failed=tmp_path / "failed", archive=tmp_path / "archive",
                               on_success="archive", watch="polling")
        self.journal = Journal(self.state / "journal.sqlite3")
        self.fresh = fresh
        self.submitted: list = []

    def work(self, instance: str = INSTANCE) -> Path:
        return self.inbox / ".ocrd-work" / instance

    def claimed(self, job: int, relpath: str, data: bytes = b"%PDF-1.4 x",
                instance: str = INSTANCE) -> Path:
        path = self.work(instance) / str(job) / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def row(self, relpath: str, claim: Path | str, state: str, attempts: int = 0) -> int:
        j = self.journal.begin_claim(str(self.inbox), relpath, str(claim), 1, 1)
        self.journal.db.execute("UPDATE jobs SET state=?, attempts=? WHERE id=?",
                                (state, attempts, j))
        return j

    def recover(self) -> list:
        async def go() -> list:
            inboxes = Inboxes(INSTANCE, is_kept=lambda *_: False)
            inboxes.add(self.box)
            outcomes = Outcomes(self.journal, Metrics(), resubmit=self.submitted.append)
            rec = Recovery(self.journal, inboxes.by_path, outcomes, self.state, self.fresh)
            try:
                return await rec.run()
            finally:
                inboxes.stop()
        return asyncio.run(go())

    def state_of(self, job: int) -> tuple[str, str | None]:
        got = self.journal.get(job)
        assert got is not None
        return got.state, got.reason


def test_claiming_rows_become_claimed_or_are_dropped(tmp_path: Path) -> None:
    w = World(tmp_path)
    there = w.row("a.pdf", w.claimed(1, "a.pdf"), "claiming")
    gone = w.row("b.pdf", w.work() / "2" / "b.pdf", "claiming")
    resumed = w.recover()
    assert [r.item.job_id for r in resumed] == [there]
    assert w.state_of(there)[0] == "claimed"
    assert w.journal.get(gone) is None


def test_a_finishing_row_gets_its_original_disposed_of_not_converted_again(
        tmp_path: Path) -> None:
    w = World(tmp_path)
    job = w.row("sub/a.pdf", w.claimed(1, "sub/a.pdf", b"original"), "finishing")
    assert w.recover() == []
    assert w.state_of(job)[0] == "done"
    assert (tmp_path / "archive" / "sub" / "a.pdf").read_bytes() == b"original"
    assert not (w.work() / "1").exists()  # the emptied job folder is gone


def test_a_claimed_file_that_is_gone_fails_as_vanished(tmp_path: Path) -> None:
    w = World(tmp_path)
    job = w.row("a.pdf", w.work() / "1" / "a.pdf", "claimed")
    assert w.recover() == []
    assert w.state_of(job) == ("failed", "vanished")


def test_one_file_converting_at_the_crash_keeps_its_attempt(tmp_path: Path) -> None:
    w = World(tmp_path)
    job = w.row("a.pdf", w.claimed(1, "a.pdf"), "converting", attempts=2)
    resumed = w.recover()
    assert [(r.item.job_id, r.exclusive) for r in resumed] == [(job, False)]
    assert w.journal.get(job).attempts == 2


def test_several_files_converting_at_the_crash_are_each_converted_alone(
        tmp_path: Path) -> None:
    """The crash cannot be pinned on one of them: none has the attempt counted, and
    each runs alone first, so a file that really kills the daemon is found."""
    w = World(tmp_path)
    a = w.row("a.pdf", w.claimed(1, "a.pdf"), "converting", attempts=2)
    b = w.row("b.pdf", w.claimed(2, "b.pdf"), "converting", attempts=1)
    queued = w.row("c.pdf", w.claimed(3, "c.pdf"), "claimed")
    resumed = {r.item.job_id: r.exclusive for r in w.recover()}
    assert resumed == {a: True, b: True, queued: False}
    assert (w.journal.get(a).attempts, w.journal.get(b).attempts) == (1, 0)


def test_files_without_rows_are_adopted_where_their_place_makes_sense(
        tmp_path: Path) -> None:
    w = World(tmp_path)
    w.claimed(7, "2024/March/scan.pdf")
    resumed = w.recover()
    assert [r.item.relpath for r in resumed] == ["2024/March/scan.pdf"]
    job = w.journal.get(resumed[0].item.job_id)
    assert job.state == "claimed" and job.claim_path.endswith("/7/2024/March/scan.pdf")


def test_files_planted_in_the_work_area_go_to_failed(tmp_path: Path) -> None:
    w = World(tmp_path)
    (w.work()).mkdir(parents=True)
    (w.work() / "planted.pdf").write_bytes(b"%PDF planted")
    (w.work() / "notajob").mkdir()
    (w.work() / "notajob" / "deep.pdf").write_bytes(b"%PDF deep")
    assert w.recover() == []
    err = json.loads((tmp_path / "failed" / "planted.pdf.error.json").read_text())
    assert err["reason"] == "not_claimed"
    assert (tmp_path / "failed" / "planted.pdf").read_bytes() == b"%PDF planted"
    assert (tmp_path / "failed" / "notajob" / "deep.pdf").read_bytes() == b"%PDF deep"
    assert not (tmp_path / "destinations.md").exists()  # never beside the outbox


def _mark(w: World, instance: str, host: str, state_dir: Path) -> None:
    w.work(instance).mkdir(parents=True, exist_ok=True)
    (w.work(instance) / ".owner").write_text(json.dumps(
        {"host": host, "state_dir": str(state_dir), "instance": instance}))


def test_an_earlier_instance_of_this_host_is_adopted_into_this_work_area(
        tmp_path: Path) -> None:
    w = World(tmp_path)
    old = "b" * 32
    _mark(w, old, host_id(), w.state)
    w.claimed(3, "x.pdf", instance=old)
    resumed = w.recover()
    assert [r.item.relpath for r in resumed] == ["x.pdf"]
    assert resumed[0].item.claim[0] == INSTANCE  # moved into this daemon's area
    assert (w.inbox / ".ocrd-work" / INSTANCE / resumed[0].item.claim[1] / "x.pdf").exists()
    assert not w.work(old).exists()


@pytest.mark.parametrize("host,state_named", [("another-host", False), (None, True)])
def test_work_areas_that_may_belong_to_a_running_daemon_are_left_alone(
        tmp_path: Path, host: str | None, state_named: bool) -> None:
    w = World(tmp_path)
    other = "c" * 32
    other_state = tmp_path / "other-state"
    other_state.mkdir()
    if state_named:
        (other_state / "instance-id").write_text(other + "\n")
    _mark(w, other, host or host_id(), other_state)
    w.claimed(4, "y.pdf", instance=other)
    assert w.recover() == []
    assert (w.work(other) / "4" / "y.pdf").exists()


def test_unmarked_work_areas_are_adopted_only_when_the_journal_is_new(
        tmp_path: Path) -> None:
    w = World(tmp_path)
    legacy = "d" * 32
    w.claimed(5, "z.pdf", instance=legacy)
    assert w.recover() == []
    assert (w.work(legacy) / "5" / "z.pdf").exists()
    w.fresh = True
    assert [r.item.relpath for r in w.recover()] == ["z.pdf"]


def test_a_kept_original_counts_as_kept_the_moment_it_is_back_in_the_inbox(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """on_success: keep puts the original back from a worker thread; the intake (another
    thread) may look at it between the move and its record in `kept`. It must count as
    kept then too, or it is claimed and converted again (seen under CPU load)."""
    import os

    from ocrd.intake.watch import entry_for
    from ocrd.outputs import destinations

    w = World(tmp_path)
    w.box = w.box.model_copy(update={"on_success": "keep", "archive": None})
    job = w.row("a.pdf", w.claimed(1, "a.pdf", b"original"), "finishing")
    seen: list[bool] = []
    real_move = destinations.move_unique
    holder: dict = {}

    def move_then_look(src, name, dst, want):  # type: ignore[no-untyped-def]
        moved = real_move(src, name, dst, want)
        path = w.inbox / moved
        entry = entry_for(path, moved, os.lstat(path))
        seen.append(holder["outcomes"].is_kept(holder["inbox"], entry))
        return moved

    monkeypatch.setattr(destinations, "move_unique", move_then_look)
    # the journal records the file as done only after the put-back: it cannot know it yet
    # (and its connection belongs to the event loop's thread)
    monkeypatch.setattr(w.journal, "is_kept", lambda *_: False)
    real_outcomes = Outcomes

    def outcomes_spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        holder["outcomes"] = real_outcomes(*args, **kwargs)
        return holder["outcomes"]

    real_add = Inboxes.add

    def add_spy(self, cfg):  # type: ignore[no-untyped-def]
        holder["inbox"] = real_add(self, cfg)
        return holder["inbox"]

    monkeypatch.setattr(sys.modules[__name__], "Outcomes", outcomes_spy)
    monkeypatch.setattr(Inboxes, "add", add_spy)
    assert w.recover() == []
    assert w.state_of(job)[0] == "done"
    assert (w.inbox / "a.pdf").read_bytes() == b"original"
    assert seen == [True]
