"""What a file seen in an inbox and not yet claimed is waiting for, in words a person
reads ("empty — fails at 15:46:09 unless it changes"), for the console, its API and
`ocrd status`. Built on the daemon's loop from the inbox's readiness tracker: the time
a file fails is the one its last check decided (readiness.Wait.until), when the daemon
looks at it again, never a time worked out anew here."""

from __future__ import annotations

import time

from ocrd.intake.inboxes import Inbox
from ocrd.intake.readiness import Candidate
from ocrd.live import WaitingFile
from ocrd.names import shown

# readiness reasons of a file that looks cut short, in words
_CUT_SHORT = {"empty": "empty", "truncated": "truncated (incomplete)",
              "no_trailer": "no end of file (%%EOF) yet"}


def waiting_files(inbox: Inbox, engine_open: bool, now: float, wall: float,
                  limit: int = 200, queued_ahead: int = 0) -> tuple[WaitingFile, ...]:
    """The inbox's candidates, oldest first, at most `limit`; `queued_ahead`: files
    claimed and queued for the engine, for which the intake holds back its claims."""
    return tuple(_one(inbox, c, engine_open, now, wall, queued_ahead)
                 for c in inbox.tracker.oldest(limit))


def _one(inbox: Inbox, cand: Candidate, engine_open: bool, now: float,
         wall: float, queued_ahead: int = 0) -> WaitingFile:
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
    if inbox.blocked:
        return WaitingFile(**base, why=f"the inbox is paused: {inbox.blocked}",
                           reason="paused")
    if inbox.paused_until > now:
        return WaitingFile(**base, why="the inbox is paused (a destination failed)",
                           reason="paused", until=at(inbox.paused_until))
    if not engine_open:
        return WaitingFile(**base, why="the engine is unavailable", reason="engine_down")
    why = cand.why
    if why is not None and cand.until is not None:
        until = at(cand.until)
        clock = time.strftime("%H:%M:%S", time.localtime(until))
        then = f"fails at {clock}" if cand.fails_then else f"read as it is at {clock}"
        return WaitingFile(**base, why=f"{_CUT_SHORT.get(why, f'looks cut short ({why})')} "
                           f"— {then} unless it changes", reason=why, until=until,
                           fails_then=cand.fails_then)
    if cand.busy:
        return WaitingFile(**base, why="being checked", reason="checking")
    quiet_at = cand.last_change + cfg.quiet_seconds
    if now < quiet_at and not cand.closed:
        return WaitingFile(**base, why=f"changed recently: waits until it is unchanged "
                           f"for {cfg.quiet_seconds:g} s", reason="changing", until=at(quiet_at))
    if queued_ahead:
        return WaitingFile(**base, why=f"waits its turn: {queued_ahead} claimed files are "
                           "queued for the engine ahead of it", reason="queued")
    return WaitingFile(**base, why="ready to be checked", reason="due",
                       until=at(max(now, cand.next_check)))
