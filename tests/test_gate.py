"""Readiness rules and the ignore list, with a controllable clock."""

from __future__ import annotations

from pathlib import Path

from ocrd.config import InboxConfig
from ocrd.gate import Tracker
from ocrd.watch import Entry, Ignore, fs_type, is_network_fs, scan


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def entry(rel: str, size: int = 10, mtime: int = 1) -> Entry:
    return Entry(Path("/in") / rel, rel, size, mtime, 7, True)


def test_quiet_period_restarts_on_every_change() -> None:
    clock = Clock()
    t = Tracker(quiet_seconds=5, incomplete_seconds=60, fast_close=False, clock=clock)
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
    local = Tracker(5, 60, fast_close=True, clock=clock)
    local.observe(entry("a.pdf"), closed=True)
    assert len(local.due()) == 1
    remote = Tracker(5, 60, fast_close=False, clock=clock)
    remote.observe(entry("a.pdf"), closed=True)
    assert remote.due() == []
    # a change after the close cancels the fast path
    local.observe(entry("a.pdf", 99))
    assert local.due() == []


def test_incomplete_files_are_rechecked_less_often_then_given_up() -> None:
    clock = Clock()
    t = Tracker(1, 30, fast_close=False, clock=clock)
    cand = t.observe(entry("a.pdf"))
    clock.t += 1
    assert t.due() == [cand]
    t.recheck_later(cand)
    assert t.due() == []
    clock.t += 2.1
    assert t.due() == [cand]
    assert not t.given_up(cand)
    clock.t += 30
    assert t.given_up(cand)


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
