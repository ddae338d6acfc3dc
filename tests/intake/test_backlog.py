"""A huge backlog in an inbox against the intake loop (the real inboxes, journal,
outcomes and intake; files on disk): a scan asks the journal about its files in one
batch, beside the loop, never once per file on it; it hands what it found to the
readiness tracker in parts, the loop turning in between; a rescan leaves unchanged files
alone and still sees a changed one; and a backlog of due files starts a bounded number
of checks, not one task per file; and no claims are made while enough files wait
queued for the engine. How long the loop is blocked is measured by
bench/intake.py, not here."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ocrd.config.load import parse_config
from ocrd.config.settings import Config
from ocrd.intake.claims import Claims
from ocrd.intake.inboxes import OBSERVE_SLICE, Inboxes
from ocrd.intake.loop import CHECKS_STARTED, CLAIMED_AHEAD, Intake
from ocrd.intake.waiting import waiting_files
from ocrd.intake.watch import Entry
from ocrd.render.pool import RenderPool
from ocrd.service.metrics import Metrics
from ocrd.work.journal import Journal
from ocrd.work.outcomes import Outcomes


def config(tmp_path: Path, **inbox: object) -> Config:
    """An inbox whose folders are there (a missing one would pause it)."""
    for folder in ("state", "out", "failed"):
        (tmp_path / folder).mkdir(exist_ok=True)
    return parse_config({"state_dir": str(tmp_path / "state"), "inboxes": [{
        "path": str(tmp_path / "inbox"), "outbox": str(tmp_path / "out"),
        "failed": str(tmp_path / "failed"), "watch": "polling", **inbox}]}, tmp_path)


def fill(folder: Path, n: int) -> list[Path]:
    folder.mkdir(exist_ok=True)
    paths = [folder / f"scan_{k:05d}.pdf" for k in range(n)]
    for p in paths:
        p.write_bytes(b"%PDF-1.4 " + str(p).encode())
    return paths


def test_a_scan_asks_the_journal_once_beside_the_loop_not_once_per_file(
        tmp_path: Path) -> None:
    cfg = config(tmp_path, on_success="keep")
    paths = fill(tmp_path / "inbox", 3000)
    journal = Journal(cfg.state_dir / "journal.sqlite3")
    kept = paths[:10]  # converted before and put back unchanged (on_success: keep)
    for p in kept:
        st = p.stat()
        job = journal.begin_claim(str(cfg.inboxes[0].path), p.name, "", st.st_size,
                                  st.st_mtime_ns)
        journal.claimed(job)
        journal.done(job, str(tmp_path / "out" / (p.stem + ".md")), p.name)
    asked_one: list[str] = []
    asked_many: list[tuple[str, int]] = []

    async def scenario() -> dict:
        loop_thread = threading.current_thread().name
        outcomes = Outcomes(journal, Metrics(), resubmit=print)

        def is_kept(inbox: object, entry: Entry) -> bool:
            asked_one.append(threading.current_thread().name)
            return outcomes.is_kept(inbox, entry)  # type: ignore[arg-type]

        def kept_among(inbox: object, entries: list[Entry]) -> set:
            asked_many.append((threading.current_thread().name, len(entries)))
            return outcomes.kept_among(inbox, entries)  # type: ignore[arg-type]

        inboxes = Inboxes("c" * 32, is_kept=is_kept, kept_among=kept_among)
        box = inboxes.add(cfg.inboxes[0])
        try:
            await inboxes.scan(box, lambda: None)
            return {"loop": loop_thread, "candidates": set(box.tracker.candidates)}
        finally:
            inboxes.stop()

    got = asyncio.run(scenario())
    journal.close()
    assert got["candidates"] == {p.name for p in paths[10:]}
    assert asked_one == []  # nothing asked file by file on the loop
    assert len(asked_many) == 1 and asked_many[0][1] == 3000
    assert asked_many[0][0] != got["loop"]


def test_a_huge_inbox_is_taken_in_while_the_loop_turns(tmp_path: Path) -> None:
    cfg = config(tmp_path, on_success="delete")
    paths = fill(tmp_path / "inbox", 3 * OBSERVE_SLICE + 7)

    async def scenario() -> tuple[Counter, Counter, float]:
        inboxes = Inboxes("d" * 32, is_kept=lambda *_: False)
        box = inboxes.add(cfg.inboxes[0])
        turns = 0

        async def turning() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        turner = asyncio.create_task(turning())
        observed: Counter = Counter()  # observe() calls per turn of the loop
        real_observe = box.tracker.observe

        def observe(entry: Entry, closed: bool = False):  # noqa: ANN202
            observed[turns] += 1
            return real_observe(entry, closed)

        box.tracker.observe = observe  # type: ignore[method-assign]
        try:
            await inboxes.scan(box, lambda: None)
            first = Counter(observed)
            before = box.tracker.candidates[paths[5].name].last_change
            with open(paths[5], "ab") as f:  # one file grows
                f.write(b" more")
            os.utime(paths[5], ns=(1, 10**18))
            observed.clear()
            await inboxes.scan(box, lambda: None)
            again = Counter(observed)
            changed = box.tracker.candidates[paths[5].name].last_change > before
            return first, again, changed
        finally:
            turner.cancel()
            inboxes.stop()

    first, again, changed = asyncio.run(scenario())
    assert sum(first.values()) == len(paths)
    assert max(first.values()) <= OBSERVE_SLICE, first  # the loop turned in between
    assert len(first) >= 4
    # a rescan hands over what changed only: the rest is known as it is
    assert sum(again.values()) == 1 and changed


@contextlib.asynccontextmanager
async def intake_of(cfg: Config) -> AsyncIterator[tuple[Inboxes, Any, Intake]]:
    """The inboxes (the first configured one added), the intake loop on a real journal
    and render pool, the engine open; all stopped and closed after."""
    journal = Journal(cfg.state_dir / "journal.sqlite3")
    inboxes = Inboxes("e" * 32, is_kept=lambda *_: False)
    box = inboxes.add(cfg.inboxes[0])
    pool = RenderPool(1)
    await pool.start()
    engine_open = asyncio.Event()
    engine_open.set()
    metrics = Metrics()
    intake = Intake(cfg, inboxes, Claims(journal, metrics), pool, lambda item: None,
                    engine_open, metrics, lambda: None)
    try:
        yield inboxes, box, intake
    finally:
        inboxes.stop()
        await pool.close()
        journal.close()


def test_a_backlog_of_due_files_starts_a_bounded_number_of_checks(tmp_path: Path) -> None:
    cfg = config(tmp_path, on_success="delete", quiet_seconds=0)
    fill(tmp_path / "inbox", 1000)

    async def scenario() -> int:
        async with intake_of(cfg) as (inboxes, box, intake):
            await inboxes.scan(box, lambda: None)
            assert len(box.tracker) == 1000
            box.next_scan = float("inf")  # no scan in the way: the checks alone
            running = asyncio.create_task(intake.run(lambda: 0, lambda: 0))
            await asyncio.sleep(0)  # the first turn of the intake loop
            await asyncio.sleep(0)
            started = sum(1 for t in asyncio.all_tasks() if t.get_name() == "check")
            await intake.stop()
            await running
            return started

    started = asyncio.run(scenario())
    assert 0 < started <= CHECKS_STARTED, started


def test_no_file_is_claimed_while_enough_wait_queued_for_the_engine(tmp_path: Path) -> None:
    """With CLAIMED_AHEAD files claimed and queued, ready files stay in their inbox
    (another daemon on the share may take them; this one's loop makes no claims meanwhile)
    and say why; as the queue drains, the checks start again."""
    cfg = config(tmp_path, on_success="delete", quiet_seconds=0)
    fill(tmp_path / "inbox", 20)
    queued = [CLAIMED_AHEAD]

    async def scenario() -> tuple[int, list[str], int]:
        async with intake_of(cfg) as (inboxes, box, intake):
            await inboxes.scan(box, lambda: None)
            box.next_scan = float("inf")
            running = asyncio.create_task(intake.run(lambda: queued[0], lambda: 0))
            for _ in range(5):  # turns of the loop
                await asyncio.sleep(0)
            held = sum(1 for t in asyncio.all_tasks() if t.get_name() == "check")
            reasons = [w.reason for w in waiting_files(
                box, True, time.monotonic(), time.time(), queued_ahead=intake.queued_ahead)]
            queued[0] = 0  # the queue drained
            inboxes.wake.set()
            for _ in range(5):
                await asyncio.sleep(0)
            started = sum(1 for t in asyncio.all_tasks() if t.get_name() == "check")
            await intake.stop()
            await running
            return held, reasons, started

    held, reasons, started = asyncio.run(scenario())
    assert held == 0 and set(reasons) == {"queued"}, reasons
    assert started > 0
