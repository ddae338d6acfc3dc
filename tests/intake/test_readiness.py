"""Readiness rules and the ignore list, with a controllable clock; `readiness.decide`
as the pure function it is (no daemon, no files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ocrd import errors
from ocrd.config.settings import InboxConfig
from ocrd.intake.readiness import (
    Changed,
    Claim,
    Forget,
    Reject,
    Tracker,
    Wait,
    decide,
)
from ocrd.intake.watch import Entry, Ignore, fs_type, is_network_fs, scan
from ocrd.render.pages import DocInfo


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def entry(rel: str, size: int = 10, mtime: int = 1) -> Entry:
    return Entry(Path("/in") / rel, rel, size, mtime, 7, True)


def test_quiet_period_restarts_on_every_change() -> None:
    clock = Clock()
    t = Tracker(quiet_seconds=5, fast_close=False, clock=clock)
    t.observe(entry("a.pdf", 10))
    clock.t += 4
    assert t.due() == []
    t.observe(entry("a.pdf", 20))  # still growing
    clock.t += 4
    assert t.due() == []
    clock.t += 1.1
    assert [c.entry.relpath for c in t.due()] == ["a.pdf"]


def test_close_event_is_a_fast_path_only_on_local_filesystems() -> None:
    clock = Clock()
    local = Tracker(5, fast_close=True, clock=clock)
    local.observe(entry("a.pdf"), closed=True)
    assert len(local.due()) == 1
    remote = Tracker(5, fast_close=False, clock=clock)
    remote.observe(entry("a.pdf"), closed=True)
    assert remote.due() == []
    # a change after the close cancels the fast path
    local.observe(entry("a.pdf", 99))
    assert local.due() == []


def test_incomplete_files_are_rechecked_less_often_then_given_up() -> None:
    clock = Clock()
    t = Tracker(1, fast_close=False, clock=clock)
    cand = t.observe(entry("a.pdf"))
    clock.t += 1
    assert t.due() == [cand]
    t.recheck_later(cand)
    assert t.due() == []
    clock.t += 2.1
    assert t.due() == [cand]
    truncated = errors.Truncated("no trailer yet")
    assert isinstance(decide(cand, truncated, cand.entry, 1, 30, clock.t), Wait)
    clock.t += 30
    assert decide(cand, truncated, cand.entry, 1, 30, clock.t) == Claim(error=truncated)


def test_ignore_rules() -> None:
    box = InboxConfig(path=Path("/in"), outbox=Path("/o"), failed=Path("/f"),
                      on_success="keep", ignore=["*.bak"], include=["*.pdf", "*.png"])
    ig = Ignore(box)
    for junk in [".DS_Store", "._x.pdf", "Thumbs.db", "~$x.docx", "x.pdf.part", "x.tmp",
                 "x.crdownload", "x.pd~", "@eaDir/x.pdf", "#recycle/x.pdf", "a/.hidden/x.pdf",
                 "x.bak", "desktop.ini", "x.PDF.PART"]:
        assert not ig.wanted(junk), junk
    for good in ["x.pdf", "Scan 01.PDF", "sub/y.png", "ünï.pdf"]:
        assert ig.wanted(good), good
    assert not ig.wanted("notes.txt")  # not included


def test_scan_does_not_follow_symlinked_folders(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.pdf").write_text("x")
    inbox = tmp_path / "in"
    (inbox / "sub").mkdir(parents=True)
    (inbox / "sub" / "a.pdf").write_text("x")
    (inbox / "linkdir").symlink_to(outside)
    (inbox / "link.pdf").symlink_to(outside / "secret.pdf")
    (inbox / "dir.pdf").mkdir()  # a folder named like a document
    box = InboxConfig(path=inbox, outbox=tmp_path / "o", failed=tmp_path / "f",
                      on_success="keep", recursive=True)
    found = {e.relpath: e.regular for e in scan(inbox, True, Ignore(box))}
    assert found == {"sub/a.pdf": True, "link.pdf": False, "linkdir": False}


def test_fs_type_reads_mountinfo() -> None:
    assert fs_type(Path("/proc")) == "proc"
    assert is_network_fs("nfs4") and is_network_fs("fuse.sshfs") and not is_network_fs("ext4")


def test_moved_in_event_is_the_same_fast_path_as_close() -> None:
    """IN_MOVED_TO ("write elsewhere, then mv") arrives as a complete hint, like a
    close-after-write: due at once on a local filesystem (intake/watch.py's handler)."""
    from watchdog.events import FileCreatedEvent, FileMovedEvent

    from ocrd.intake.watch import _Handler

    hints: list[tuple[str, bool, bool]] = []
    handler = _Handler(lambda *h: hints.append(h))
    handler.on_any_event(FileMovedEvent("", "/in/a.pdf"))  # moved in from outside
    handler.on_any_event(FileMovedEvent("/in/a.part", "/in/b.pdf"))  # renamed inside
    handler.on_any_event(FileCreatedEvent("/in/c.pdf"))  # about to be written
    handler.on_any_event(FileMovedEvent("/in/d.pdf", ""))  # moved out: nothing to do
    assert hints == [("/in/a.pdf", True, False), ("/in/b.pdf", True, False),
                     ("/in/c.pdf", False, False)]


# -- decide(): every rule, with a fake clock ----------------------------------------------

INFO = DocInfo("pdf", "PDF", 1, "pypdfium2", 100)


def cand_at(last_change: float, regular: bool = True, reported: set | None = None):
    from ocrd.intake.readiness import Candidate

    e = Entry(Path("/in/a.pdf"), "a.pdf", 10, 1, 7, regular)
    return Candidate(e, last_change, reported=reported or set())


def test_decide_claims_a_complete_unchanged_file() -> None:
    c = cand_at(0)
    assert decide(c, INFO, c.entry, 5, 60, now=6) == Claim(info=INFO)


def test_decide_observes_again_a_file_that_changed_while_checked() -> None:
    c = cand_at(0)
    grown = Entry(c.entry.path, "a.pdf", 20, 2, 7, True)
    assert decide(c, INFO, grown, 5, 60, now=6) == Changed(grown)
    replaced = Entry(c.entry.path, "a.pdf", 10, 1, 8, True)  # same size, new inode
    assert decide(c, INFO, replaced, 5, 60, now=6) == Changed(replaced)


def test_decide_forgets_a_vanished_file() -> None:
    c = cand_at(0)
    assert decide(c, INFO, None, 5, 60, now=6) == Forget()
    gone = errors.Unreadable("gone", reason="vanished")
    assert decide(c, gone, None, 5, 60, now=6) == Forget()


@pytest.mark.parametrize("err", [errors.EmptyFile("0 bytes"), errors.Truncated("cut")])
def test_decide_waits_for_an_incomplete_file_then_gives_up(err) -> None:  # noqa: ANN001
    c = cand_at(0)
    first = decide(c, err, c.entry, 5, 60, now=10)
    assert first == Wait(report="incomplete", reason=err.reason, until=60, fails_then=True)
    c.reported.add("incomplete")
    assert decide(c, err, c.entry, 5, 60, now=59.9) == \
        Wait(report=None, reason=err.reason, until=60, fails_then=True)
    assert decide(c, err, c.entry, 5, 60, now=60) == Claim(error=err)


def test_decide_fails_a_file_that_never_converts_once_it_is_quiet() -> None:
    c = cand_at(0)
    bad = errors.UnsupportedFormat("not a document")
    assert decide(c, bad, c.entry, 5, 60, now=1) == Wait()  # closed early: quiet first
    assert decide(c, bad, c.entry, 5, 60, now=5) == Claim(error=bad)


def test_decide_looks_again_when_a_link_took_the_files_place_before_it_was_opened() -> None:
    c = cand_at(0)
    link = Entry(c.entry.path, "a.pdf", 30, 5, 99, False)
    assert decide(c, None, link, 5, 60, now=6) == Changed(link)
    assert decide(c, None, None, 5, 60, now=6) == Forget()


def test_decide_rejects_a_link_or_fifo_once_quiet() -> None:
    c = cand_at(0, regular=False)
    assert decide(c, None, None, 5, 60, now=4) == Wait()
    assert decide(c, None, None, 5, 60, now=5) == Reject()


# -- "complete" is "stopped changing", not "parses" ---------------------------------------

NO_EOF = DocInfo("pdf", "PDF", 1, "pypdfium2", 100, complete=False, warnings=("no %%EOF",))


def test_a_file_cut_short_waits_while_its_writer_may_still_write() -> None:
    """No close event (a writer holding it open, or a network share): it waits, quiet or
    not, until incomplete_seconds without a change — readable or not."""
    c = cand_at(0)
    undecodable = errors.Damaged("the PNG image is damaged and cannot be decoded")
    undecodable.cut_short = True  # as an image still being written fails to decode
    for probe in (NO_EOF, errors.Truncated("cut"), errors.EmptyFile("0 bytes"), undecodable):
        assert isinstance(decide(c, probe, c.entry, 5, 600, now=300), Wait), probe
    assert decide(c, NO_EOF, c.entry, 5, 600, now=600) == Claim(info=NO_EOF)


def test_a_file_cut_short_waits_incomplete_seconds_even_after_its_writer_closed_it() -> None:
    """A writer that closes the file and pauses before it appends the next chunk (SMB
    clients, some scanners) is not done: a file that looks cut short and does not read
    waits incomplete_seconds unchanged, closed or not, then fails. The wait says until
    when, and that the file fails then. A complete file still goes at once."""
    clock = Clock()
    t = Tracker(5, fast_close=True, clock=clock)
    cand = t.observe(entry("a.pdf"), closed=True)
    assert t.due() == [cand]  # checked at once ...
    cut = errors.Truncated("cut")
    waiting = decide(cand, cut, cand.entry, 5, 60, clock.t)
    assert waiting == Wait(report="incomplete", reason="truncated", until=clock.t + 60,
                           fails_then=True)
    t.recheck_later(cand, waiting.until)  # ... and again when the wait ends
    clock.t += 59.9  # long past the 10 s a closed file used to be given
    assert t.due() == []
    for probe in (cut, errors.EmptyFile("0")):
        assert isinstance(decide(cand, probe, cand.entry, 5, 60, clock.t), Wait), probe
    clock.t += 0.1
    assert t.due() == [cand]
    assert decide(cand, cut, cand.entry, 5, 60, clock.t) == Claim(error=cut)
    # the writer appends again: the wait starts over
    t.observe(entry("a.pdf", size=99))
    assert isinstance(decide(cand, cut, cand.entry, 5, 60, clock.t + 10), Wait)
    # a complete file that was closed goes at once, quiet period or not
    whole = t.observe(entry("b.pdf"), closed=True)
    assert whole in t.due()
    assert decide(whole, INFO, whole.entry, 5, 60, clock.t) == Claim(info=INFO)


def test_a_pdf_that_reads_without_its_trailer_also_waits_incomplete_seconds() -> None:
    """What a writer closed may read all the same (a PDF's first pages, an image's first
    rows): a file without its end waits incomplete_seconds, closed or not, and is then
    read as it is (converted with a warning) — it does not fail."""
    clock = Clock()
    t = Tracker(5, fast_close=True, clock=clock)
    cand = t.observe(entry("a.pdf"), closed=True)
    waiting = decide(cand, NO_EOF, cand.entry, 5, 60, clock.t)
    assert waiting == Wait(report="incomplete", reason="no_trailer", until=clock.t + 60,
                           fails_then=False)
    assert isinstance(decide(cand, NO_EOF, cand.entry, 5, 60, clock.t + 59.9), Wait)
    assert decide(cand, NO_EOF, cand.entry, 5, 60, clock.t + 60) == Claim(info=NO_EOF)


def test_due_gives_the_soonest_first_up_to_a_limit_and_a_checked_one_comes_back() -> None:
    """The tracker keeps when each candidate may be due (a heap): what is due comes out
    soonest first, as many as asked for; a candidate being checked is not due, and is
    due again as its check left it; the oldest are the longest unchanged."""
    clock = Clock()
    t = Tracker(5, fast_close=False, clock=clock)
    a = t.observe(entry("a.pdf"))
    clock.t += 1
    b = t.observe(entry("b.pdf"))
    clock.t += 1
    c = t.observe(entry("c.pdf"))
    clock.t += 10
    assert t.due(2) == [a, b]
    assert t.due() == [a, b, c]  # asking changes nothing
    a.busy = True  # its check begins
    assert t.due() == [b, c] and t.next_wakeup() == 0.0
    t.recheck_later(a)  # the check found it incomplete ...
    t.checked(a)  # ... and ended: due when the recheck is
    assert t.due() == [b, c]
    clock.t += 60
    assert t.due() == [b, c, a]
    t.forget("b.pdf")
    assert t.due() == [c, a]
    assert [x.entry.relpath for x in t.oldest(5)] == ["a.pdf", "c.pdf"]
    t.observe(entry("a.pdf", 99))  # it changed: the newest now, and quiet again
    assert [x.entry.relpath for x in t.oldest(5)] == ["c.pdf", "a.pdf"]
    assert t.due() == [c] and t.next_wakeup() == 0.0
    t.quiet = 100  # a reload: the new quiet period counts for every candidate
    assert t.due() == [] and t.next_wakeup() == 100 - (clock.t - c.last_change)
