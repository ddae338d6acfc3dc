"""Readiness: when is a file in an inbox complete enough to claim?

A file is a candidate from the moment a scan or an event shows it. It becomes due for a
completeness check once its size and mtime have been quiet for the inbox's quiet period,
or at once after a close-after-write event on a local filesystem. The check itself
(`pages.probe`, in a worker process) decides: ready, maybe still being written (wait,
and give up after `incomplete_seconds` without change), or never convertible.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .watch import Entry

# Waiting between checks of a file that looked incomplete: grows to this.
MAX_RECHECK_SECONDS = 30.0


@dataclass
class Candidate:
    entry: Entry
    last_change: float  # monotonic time of the last size/mtime/inode change
    closed: bool = False  # a close-after-write event came after the last change
    next_check: float = 0.0
    checks: int = 0
    busy: bool = False  # a check or a claim is running
    reported: set[str] = field(default_factory=set)  # warnings already logged

    def key(self) -> tuple[int, int, int]:
        return (self.entry.size, self.entry.mtime_ns, self.entry.ino)


class Tracker:
    """Candidates of one inbox, by path relative to the inbox."""

    def __init__(self, quiet_seconds: float, incomplete_seconds: float,
                 fast_close: bool, clock=time.monotonic) -> None:
        self.quiet = quiet_seconds
        self.incomplete = incomplete_seconds
        self.fast_close = fast_close
        self.clock = clock
        self.candidates: dict[str, Candidate] = {}

    def __len__(self) -> int:
        return len(self.candidates)

    def observe(self, entry: Entry, closed: bool = False) -> Candidate:
        now = self.clock()
        cand = self.candidates.get(entry.relpath)
        if cand is None:
            cand = Candidate(entry, now)
            self.candidates[entry.relpath] = cand
        elif (entry.size, entry.mtime_ns, entry.ino) != cand.key():
            cand.entry = entry
            cand.last_change = now
            cand.closed = False
            cand.next_check = 0.0
        if closed:
            cand.closed = True
            cand.next_check = 0.0
        return cand

    def forget(self, relpath: str) -> None:
        self.candidates.pop(relpath, None)

    def keep_only(self, relpaths: set[str]) -> list[str]:
        """After a full scan: drop candidates that are gone. Returns the dropped."""
        gone = [r for r, c in self.candidates.items() if r not in relpaths and not c.busy]
        for r in gone:
            del self.candidates[r]
        return gone

    def quiet_for(self, cand: Candidate) -> float:
        return self.clock() - cand.last_change

    def due(self) -> list[Candidate]:
        """Candidates to check now: quiet long enough, or closed on a local filesystem."""
        now = self.clock()
        out = []
        for cand in self.candidates.values():
            if cand.busy or now < cand.next_check:
                continue
            quiet = now - cand.last_change >= self.quiet
            if quiet or (self.fast_close and cand.closed and cand.entry.regular):
                out.append(cand)
        return out

    def recheck_later(self, cand: Candidate) -> None:
        """The file looked incomplete: look again later, less often each time."""
        cand.checks += 1
        cand.closed = False
        delay = min(MAX_RECHECK_SECONDS, max(self.quiet, 0.5) * (2 ** min(cand.checks, 6)))
        cand.next_check = self.clock() + delay

    def given_up(self, cand: Candidate) -> bool:
        """Incomplete and unchanged for longer than incomplete_seconds."""
        return self.clock() - cand.last_change >= self.incomplete

    def next_wakeup(self) -> float | None:
        """Seconds until some candidate may become due (for the intake loop's sleep)."""
        now = self.clock()
        best = None
        for cand in self.candidates.values():
            if cand.busy:
                continue
            at = max(cand.next_check, cand.last_change + self.quiet)
            if cand.next_check and cand.next_check > now:
                at = cand.next_check
            wait = max(0.0, at - now)
            best = wait if best is None else min(best, wait)
        return best
