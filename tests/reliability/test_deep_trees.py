"""Recursive inboxes and what their trees can do to the daemon: a chain of folders far
deeper than PATH_MAX moved in (it killed watchdog's inotify thread with RecursionError
and held the main loop for the length of the scan), a watch thread that dies anyway,
and a scan that takes long (a huge tree, a slow share) — none may stop files elsewhere
from converting."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest
from helpers import Daemon, drop, files_under, make_pdf, sentence_lines, wait_for

from ocrd.config.load import parse_config
from ocrd.intake import inboxes as inboxes_mod
from ocrd.intake import watch as watch_mod
from ocrd.intake.claims import Claims
from ocrd.intake.inboxes import Inboxes
from ocrd.intake.loop import Intake
from ocrd.intake.watch import MAX_DEPTH
from ocrd.render.pool import RenderPool
from ocrd.service.metrics import Metrics
from ocrd.work.journal import Journal

pytestmark = [pytest.mark.reliability]

CHAIN = 2100  # levels: "d/" × 2100 is longer than PATH_MAX (4096)


def make_chain(top: Path, levels: int, files: dict[int, bytes]) -> None:
    """top/d/d/…/d (levels deep), built through folder descriptors (its paths are too
    long for the kernel); files[k]: a PDF put into the folder k levels down."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(1, levels + 1):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
            if level in files:
                out = os.open("scan.pdf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
                os.write(out, files[level])
                os.close(out)
    finally:
        os.close(fd)


def remove_tree(top: Path) -> None:
    """Remove top/d and everything under it, deepest first, without recursion
    (shutil.rmtree recurses, and the chain's paths are too long for the kernel)."""
    if not (top / "d").exists():
        return
    stack: list[tuple[int, str, int | None]] = [
        (os.open(top, os.O_RDONLY | os.O_DIRECTORY), "d", None)]
    root_fd = stack[0][0]
    while stack:
        parent, name, fd = stack[-1]
        if fd is None:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
            stack[-1] = (parent, name, fd)
            subdirs = []
            for entry in os.scandir(fd):
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.name)
                else:
                    os.unlink(entry.name, dir_fd=fd)
            if subdirs:
                stack.extend((fd, sub, None) for sub in subdirs)
                continue
        stack.pop()
        os.close(fd)
        os.rmdir(name, dir_fd=parent)
    os.close(root_fd)


@pytest.mark.e2e
def test_a_chain_deeper_than_path_max_costs_neither_the_watch_nor_the_loop(
        tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "a.pdf", [sentence_lines(1, 3)]).read_bytes()
    staging = tmp_path / "staging"
    staging.mkdir()
    # a file within the depth limit converts; one below it is left, and said so
    make_chain(staging, CHAIN, {5: pdf, MAX_DEPTH + 40: pdf})
    d = Daemon(tmp_path / "d", rescan_seconds=600)  # only events can find a new file
    d.config["inboxes"][0].update(recursive=True, watch="inotify", quiet_seconds=0.5,
                                  on_success="delete")
    try:
        with d:
            d.start()
            os.rename(staging / "d", d.inbox / "d")  # the whole chain moved in at once
            shallow = d.outbox.joinpath(*["d"] * 5, "scan.md")
            wait_for(shallow.exists, 120, "the file five levels down converted")
            drop(pdf, d.inbox / "after.pdf")  # found by its inotify event
            wait_for((d.outbox / "after.md").exists, 120, "after.md")
            assert d.proc.poll() is None
            assert d.events("watch_thread_died") == []
            deep = d.events("folders_too_deep")
            assert len(deep) == 1 and deep[0]["max_depth"] == MAX_DEPTH, deep
            assert deep[0]["first"] == "/".join(["d"] * (MAX_DEPTH + 1))
            assert files_under(d.failed) == []
            assert not [e for e in d.events() if "RecursionError" in str(e)]
    finally:
        for top in (d.inbox, staging, d.outbox):
            remove_tree(top)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_watch_thread_fake_recursion_error_is_noticed_and_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread that reads an inbox's inotify events dies of an exception (a fake:
    the RecursionError that watchdog's recursive walk raised on a deep chain, raised
    once by the watch group): the inbox notices, replaces its observer, and events
    come again."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    cfg = parse_config({"state_dir": str(tmp_path / "state"), "inboxes": [{
        "path": str(inbox), "outbox": str(tmp_path / "out"), "failed": str(tmp_path / "f"),
        "on_success": "delete", "watch": "inotify"}]}, tmp_path)
    raised: list[bool] = []
    real_on_event = watch_mod._InboxWatchGroup.on_event

    def on_event(self, event):  # noqa: ANN001, ANN202
        if not raised:
            raised.append(True)
            raise RecursionError("maximum recursion depth exceeded (fake)")
        return real_on_event(self, event)

    monkeypatch.setattr(watch_mod._InboxWatchGroup, "on_event", on_event)

    async def until(pred, what: str) -> None:  # noqa: ANN001
        for _ in range(400):
            if pred():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    async def scenario() -> list[str]:
        boxes = Inboxes("0" * 32, is_kept=lambda *_: False)
        try:
            box = boxes.add(cfg.inboxes[0])
            (inbox / "first.pdf").write_bytes(b"%PDF-1.4\n")  # the event it dies of
            await until(lambda: raised, "the fake failure")
            await until(lambda: not boxes.observers.alive(inbox), "the thread to die")
            boxes.check_watches(time.monotonic())
            assert box.watch == "inotify" and boxes.observers.alive(inbox)
            boxes.hints.clear()
            (inbox / "after.pdf").write_bytes(b"%PDF-1.4\n")
            await until(lambda: any(h[0].endswith("after.pdf") for h in boxes.hints),
                        "an event for after.pdf")
            return [h[0] for h in boxes.hints]
        finally:
            boxes.stop()

    hints = asyncio.run(scenario())
    assert any(h.endswith("after.pdf") for h in hints), hints


def test_a_scan_that_hangs_fake_blocks_neither_the_loop_nor_other_inboxes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One inbox's scan hangs (a fake: `scan` held on an event, as a huge tree or a
    stalled share holds it); the intake loop keeps turning (the watchdog's pings depend
    on it) and a file in another inbox is claimed meanwhile."""
    root = tmp_path
    boxes = []
    for name in ("huge", "small"):
        for folder in (name, f"{name}-out", f"{name}-failed"):
            (root / folder).mkdir()
        boxes.append({"path": str(root / name), "outbox": str(root / f"{name}-out"),
                      "failed": str(root / f"{name}-failed"), "on_success": "delete",
                      "watch": "polling", "quiet_seconds": 0.1, "recursive": True})
    cfg = parse_config({"state_dir": str(root / "state"), "poll_seconds": 0.2,
                        "metrics": {"listen": None}, "inboxes": boxes}, root)
    make_pdf(root / "small" / "b.pdf", [sentence_lines(2, 2)])
    hang = threading.Event()
    real_scan = inboxes_mod.scan

    def scan(top: Path, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if top == root / "huge":
            hang.wait(60)
        return real_scan(top, *args, **kwargs)

    monkeypatch.setattr(inboxes_mod, "scan", scan)
    (root / "state").mkdir()

    async def scenario() -> tuple[int, list]:
        journal = Journal(root / "state" / "journal.sqlite3")
        pool = RenderPool(1)
        await pool.start()
        inboxes = Inboxes("1" * 32, is_kept=lambda *_: False)
        for box in cfg.inboxes:
            inboxes.add(box)
        turns, claimed = [0], []
        engine_open = asyncio.Event()
        engine_open.set()
        intake = Intake(cfg, inboxes, Claims(journal, Metrics()), pool, claimed.append,
                        engine_open, Metrics(), lambda: turns.__setitem__(0, turns[0] + 1))
        task = asyncio.create_task(intake.run(lambda: 0, lambda: 0))
        try:
            for _ in range(600):
                if claimed and turns[0] > 20:
                    break
                await asyncio.sleep(0.05)
            return turns[0], [c.relpath for c in claimed]
        finally:
            hang.set()
            await intake.stop()
            task.cancel()
            inboxes.stop()
            await pool.close()
            journal.close()

    turns, claimed = asyncio.run(scenario())
    assert claimed == ["b.pdf"], (claimed, turns)
    assert turns > 20
