"""What a file seen in an inbox and not yet claimed is waiting for, in words a person
reads ("empty — fails at 15:46 unless it changes"), for the console, its API and
`ocrd status`. Built on the daemon's loop from the inbox's readiness tracker."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ocrd.intake.inboxes import Inbox
from ocrd.intake.readiness import Candidate
from ocrd.names import shown
from ocrd.web.live import ConvertingFile, WaitingFile

if TYPE_CHECKING:
    from ocrd.pipeline.source import DocProgress

# readiness reasons that end in failed/ once the file stays unchanged long enough
_FAILS_LATER = {"empty": "empty", "truncated": "truncated (incomplete)"}


def waiting_files(inbox: Inbox, engine_open: bool, now: float, wall: float,
                  limit: int = 200) -> tuple[WaitingFile, ...]:
    """The inbox's candidates, oldest first, at most `limit`."""
    return tuple(_one(inbox, c, engine_open, now, wall) for c in inbox.tracker.oldest(limit))


def _one(inbox: Inbox, cand: Candidate, engine_open: bool, now: float,
         wall: float) -> WaitingFile:
    cfg = inbox.cfg

    def at(mono: float) -> float:
        return wall + (mono - now)

    base = dict(name=shown(cand.entry.relpath), size=cand.entry.size,
                seen=at(cand.last_change))
    if not cand.entry.regular:
        return WaitingFile(**base, why="not a regular file (a link, FIFO or device): it "
                           "goes to failed/ once unchanged", reason="not_regular",
                           until=at(cand.last_change + cfg.quiet_seconds), fails_then=True)
    if not inbox.available:
        return WaitingFile(**base, why="the inbox folder is missing", reason="inbox_missing")
    if inbox.paused_until > now:
        return WaitingFile(**base, why="the inbox is paused (a destination failed)",
                           reason="paused", until=at(inbox.paused_until))
    if not engine_open:
        return WaitingFile(**base, why="the engine is unavailable", reason="engine_down")
    why = cand.why
    if why in _FAILS_LATER:
        until = at(cand.last_change + cfg.incomplete_seconds)
        return WaitingFile(**base, why=f"{_FAILS_LATER[why]} — fails at "
                           f"{time.strftime('%H:%M', time.localtime(until))} unless it "
                           "changes", reason=why, until=until, fails_then=True)
    if cand.busy:
        return WaitingFile(**base, why="being checked", reason="checking")
    quiet_at = cand.last_change + cfg.quiet_seconds
    if now < quiet_at and not cand.closed:
        return WaitingFile(**base, why=f"changed recently: waits until it is unchanged "
                           f"for {cfg.quiet_seconds:g} s", reason="changing", until=at(quiet_at))
    return WaitingFile(**base, why="ready to be checked", reason="due",
                       until=at(max(now, cand.next_check)))


def converting_files(docs: Iterable[DocProgress], wall: float) -> tuple[ConvertingFile, ...]:
    """Documents being converted: page k of n, and the rest at this document's pace."""
    out = []
    for doc in docs:
        eta = None
        if 0 < doc.done < doc.pages:
            eta = round((wall - doc.started) / doc.done * (doc.pages - doc.done), 1)
        out.append(ConvertingFile(doc.src.job_id, shown(doc.src.name), shown(doc.src.inbox or ""),
                                  doc.done, doc.pages, doc.started, eta))
    return tuple(sorted(out, key=lambda f: f.started))
