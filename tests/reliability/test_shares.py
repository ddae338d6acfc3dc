"""Network-share behaviour: polling with a writer that pauses longer than the quiet
period, an inbox that disappears and comes back, two daemons on one inbox, inotify that
cannot be had."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest
from helpers import Daemon, drop, files_under, make_pdf, sentence_lines, wait_for

from ocrd.config.settings import InboxConfig
from ocrd.intake.watch import Observers

pytestmark = [pytest.mark.reliability]


@pytest.mark.e2e
def test_polling_writer_pausing_longer_than_quiet_period(tmp_path: Path) -> None:
    data = make_pdf(tmp_path / "a.pdf", [sentence_lines(70, 4)] * 2).read_bytes()
    with Daemon(tmp_path / "d") as d:
        box = d.config["inboxes"][0]
        box.update(watch="polling", quiet_seconds=0.5, incomplete_seconds=30)
        d.start()
        with open(d.inbox / "a.pdf", "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            time.sleep(3)  # six quiet periods: the completeness check must hold it back
            assert not (d.outbox / "a.md").exists()
            f.write(data[len(data) // 2:])
        wait_for((d.outbox / "a.md").exists, 60, "a.md")
        assert [e["file"] for e in d.events("file_claimed")] == ["a.pdf"]
        assert d.event("file_incomplete")["reason"] == "truncated"
    assert files_under(d.failed) == []


@pytest.mark.e2e
def test_inbox_that_disappears_and_comes_back(tmp_path: Path) -> None:
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(71, 3)])
    with Daemon(tmp_path / "d", rescan_seconds=0.5) as d:
        d.start()
        gone = tmp_path / "d" / "inbox-away"
        os.rename(d.inbox, gone)  # the share is unmounted
        wait_for(lambda: d.event("inbox_missing"), 30, "inbox_missing")
        time.sleep(1)
        assert d.proc.poll() is None
        drop(src, gone / "a.pdf")
        os.rename(gone, d.inbox)  # ... and mounted again, with a file in it
        wait_for(lambda: d.event("inbox_back"), 30, "inbox_back")
        wait_for((d.outbox / "a.md").exists, 60, "a.md after the inbox returned")
        # events work again too (the watch was re-established)
        drop(src, d.inbox / "b.pdf")
        wait_for((d.outbox / "b.md").exists, 60, "b.md")


@pytest.mark.e2e
def test_two_daemons_on_one_inbox_convert_each_file_exactly_once(tmp_path: Path) -> None:
    pdfs = [make_pdf(tmp_path / f"t{i}.pdf", [sentence_lines(80 + i, 2)]).read_bytes()
            for i in range(3)]
    shared = tmp_path / "share"
    box = {"path": str(shared / "inbox"), "outbox": str(shared / "out"),
           "failed": str(shared / "failed"), "archive": str(shared / "archive"),
           "quiet_seconds": 0.3}
    (shared / "inbox").mkdir(parents=True)
    a = Daemon(tmp_path / "a", inboxes=[box])
    b = Daemon(tmp_path / "b", inboxes=[box])
    names = [f"doc{i:03d}.pdf" for i in range(40)]
    with a, b:
        a.start()
        b.start()

        def writer() -> None:
            for i, name in enumerate(names):
                tmp = shared / "inbox" / (name + ".part")
                tmp.write_bytes(pdfs[i % 3])
                tmp.rename(shared / "inbox" / name)
                time.sleep(0.02)

        t = threading.Thread(target=writer)
        t.start()
        t.join()
        wait_for(lambda: len(list((shared / "out").glob("*.md"))) >= 40, 180,
                 "40 files converted")
        time.sleep(2)
        claims_a = [e["file"] for e in a.events("file_claimed")]
        claims_b = [e["file"] for e in b.events("file_claimed")]
    assert sorted(claims_a + claims_b) == names  # each claimed by exactly one daemon
    assert claims_a and claims_b, "both daemons should have taken work"
    assert sorted(p.name for p in (shared / "out").glob("*.md")) == \
        [n.replace(".pdf", ".md") for n in names]
    assert sorted(p.name for p in (shared / "archive").iterdir()) == names
    assert files_under(shared / "failed") == []


def test_inotify_unavailable_falls_back_to_polling(tmp_path: Path, monkeypatch) -> None:
    """Running out of inotify watches (ENOSPC) degrades to polling with a warning."""
    from watchdog.observers import inotify

    def no_watches(self, *args, **kwargs):  # what the kernel says at the watch limit
        raise OSError(errno.ENOSPC, "inotify watch limit reached")

    monkeypatch.setattr(inotify.InotifyObserver, "schedule", no_watches)
    box = InboxConfig(path=tmp_path, outbox=tmp_path / "o", failed=tmp_path / "f",
                      on_success="keep")
    obs = Observers(lambda *a: None)
    assert obs.watch(box) is False
    assert not obs.alive(tmp_path)


@pytest.mark.e2e
def test_many_subfolders_polled_and_watched(tmp_path: Path) -> None:
    """A deep, wide recursive tree: every file found, outputs mirror the tree, in both
    watch modes."""
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(72, 2)]).read_bytes()
    for mode in ("polling", "inotify"):
        root = tmp_path / mode
        inbox = root / "inbox"
        for i in range(300):
            (inbox / f"dept{i % 10}" / f"year{i // 10}" / f"box{i}").mkdir(parents=True)
        box = {"path": str(inbox), "outbox": str(root / "out"), "failed": str(root / "f"),
               "on_success": "delete", "recursive": True, "watch": mode,
               "quiet_seconds": 0.3}
        wanted = [f"dept{i % 10}/year{i // 10}/box{i}/scan.pdf" for i in range(0, 300, 37)]
        with Daemon(root, inboxes=[box]) as d:
            d.start()
            for rel in wanted:
                tmp = inbox / (rel + ".part")
                tmp.write_bytes(src)
                tmp.rename(inbox / rel)
            # a folder moved in with a file already inside (no event for the file)
            staged = root / "staged" / "late"
            staged.mkdir(parents=True)
            (staged / "inside.pdf").write_bytes(src)
            (root / "staged" / "late").rename(inbox / "late")
            wanted.append("late/inside.pdf")
            for rel in wanted:
                md = root / "out" / rel.replace(".pdf", ".md")
                wait_for(md.exists, 60, f"{mode}: {md}")
        assert files_under(root / "f") == []


def _inotify_watches() -> int:
    """Watches held by this process's inotify instances, as the kernel counts them
    (/proc/self/fdinfo)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}") as f:
                n += sum(line.startswith("inotify wd:") for line in f)
        except OSError:
            continue
    return n


def test_a_recursive_watch_leaves_out_the_work_area_and_dot_folders(tmp_path: Path) -> None:
    """Every claim makes a folder in .ocrd-work/; a recursive watch took each one in
    (thousands of watches in a busy inbox, and watchdog formatting its whole table into
    a warning at each re-added one: a long fuzzer run slowed 25-fold). Dot-folders are
    ignored by every scan, so they are not watched either; other subfolders are."""
    for sub in ("a", "a/b", ".ocrd-work/x", ".stfolder"):
        (tmp_path / sub).mkdir(parents=True)
    box = InboxConfig(path=tmp_path, outbox=tmp_path.parent / "o", failed=tmp_path.parent / "f",
                      on_success="keep", recursive=True)
    hints: list = []
    before = _inotify_watches()
    obs = Observers(lambda *a: hints.append(a))
    try:
        assert obs.watch(box)
        assert _inotify_watches() - before == 3  # the inbox, a, a/b
        for i in range(40):  # as claims do, while watched
            (tmp_path / ".ocrd-work" / "x" / str(i) / "sub").mkdir(parents=True)
        (tmp_path / "c").mkdir()
        wait_for(lambda: _inotify_watches() - before == 4, 10, "c watched")
        (tmp_path / "c" / "scan.pdf").write_bytes(b"%PDF-1.4\n")
        wait_for(lambda: hints, 10, "a hint for c/scan.pdf")
        assert _inotify_watches() - before == 4
    finally:
        obs.stop()
