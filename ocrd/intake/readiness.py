"""Readiness: when is a file in an inbox complete enough to claim? The one place that
decides it.

A file is a candidate from the moment a scan or an event shows it (`Tracker`). It becomes
due for a completeness check once its size and mtime have been quiet for the inbox's
quiet period, or at once after a close-after-write or a moved-in event on a local
filesystem. The check (`pages.probe`, in a worker process, on the file ocrd opened) then
feeds `decide`, a pure function of the candidate, the probe's result and the clock:
claim it (to convert, or to fail it with a reason), wait and look again, reject an entry
that is not a regular file, or forget an entry that is gone.

Whether a file is whole is judged from whether it has stopped changing, never from its
parse alone: a file that looks cut short (a PDF without its trailer, an image that does
not decode to its end, an empty file) waits until it has not changed for
`incomplete_seconds`, whether or not its writer closed it — SMB clients and some
scanners close the file between chunks and pause (seconds, a minute) before they open
it again to append, and what they closed may even read (a PDF's first pages, an image's
first rows), so a close says nothing about the end. Then it is read as it is: converted
if it reads (a PDF without %%EOF, with a warning), failed if not. A file that looks
complete goes at once after its close (or its quiet period).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ocrd import errors
from ocrd.intake.watch import Entry
from ocrd.render.pages import DocInfo

# Waiting between checks of a file that looked incomplete: grows to this.
MAX_RECHECK_SECONDS = 30.0


@dataclass
class Candidate:
    entry: Entry
    last_change: float  # monotonic time of the last size/mtime/inode change
    closed: bool = False  # closed after writing, or moved in: due at once (fast path)
    next_check: float = 0.0
    checks: int = 0
    busy: bool = False  # a check or a claim is running
    seen: float = 0.0  # monotonic time a scan or an event last showed it
    reported: set[str] = field(default_factory=set)  # warnings already logged
    # checks that failed with an unexpected exception (a bug), as internal errors
    failures: list[errors.OcrdError] = field(default_factory=list)
    why: str | None = None  # the last check's reason for waiting (empty, truncated ...)
    # when the wait the last check decided ends (monotonic; None: not known), and whether
    # the file then fails (True) or is read as it is (False)
    until: float | None = None
    fails_then: bool = False

    def key(self) -> tuple[int, int, int]:
        return (self.entry.size, self.entry.mtime_ns, self.entry.ino)


# -- the decision -------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """Claim the file: to convert it (info), or to move it to failed/ (error)."""

    info: DocInfo | None = None
    error: errors.OcrdError | None = None


@dataclass(frozen=True)
class Wait:
    """Not yet: look again later (at `until`, when it is known: the end of the wait for
    a file that looks cut short). `report`: a first notice worth logging (with the
    probe's reason); `fails_then`: unchanged until `until`, the file fails (it does not
    read), else it is read as it is."""

    report: str | None = None
    reason: str | None = None
    until: float | None = None
    fails_then: bool = False


@dataclass(frozen=True)
class Reject:
    """Not a regular file (link, FIFO, socket, device): its entry goes to failed/."""


@dataclass(frozen=True)
class Forget:
    """Gone: stop tracking it."""


@dataclass(frozen=True)
class Changed:
    """It changed while being checked: observe it anew."""

    entry: Entry


Decision = Claim | Wait | Reject | Forget | Changed
Probe = DocInfo | errors.OcrdError


def decide(cand: Candidate, probe: Probe | None, now_entry: Entry | None,
           quiet_seconds: float, incomplete_seconds: float, now: float) -> Decision:
    """What to do with a due candidate.

    probe: the completeness check's result (None when there was nothing to probe: the
    entry is not a regular file, or no longer one when it was opened); now_entry: the
    entry as it is after the check (None: gone)."""
    quiet = now - cand.last_change >= quiet_seconds
    if not cand.entry.regular:
        return Reject() if quiet else Wait()
    if probe is None:  # a link or FIFO took its place: look at what is there now
        return Changed(now_entry) if now_entry is not None else Forget()
    if isinstance(probe, errors.OcrdError) and probe.reason == "vanished":
        return Forget()
    if now_entry is None:
        return Forget()
    if (now_entry.size, now_entry.mtime_ns, now_entry.ino) != cand.key():
        return Changed(now_entry)
    if looks_cut_short(probe):
        # Maybe still being written (a close proves nothing: writers close between
        # chunks and pause, and what they closed may even read, as a PDF's first pages
        # or an image's first rows do): read as it is once it has stopped changing for
        # incomplete_seconds.
        reads = isinstance(probe, DocInfo)
        if settled(cand, incomplete_seconds, now):
            return Claim(info=probe) if reads else Claim(error=probe)
        first = "incomplete" not in cand.reported
        return Wait(report="incomplete" if first else None,
                    reason="no_trailer" if reads else probe.reason,
                    until=cand.last_change + incomplete_seconds, fails_then=not reads)
    if isinstance(probe, errors.OcrdError):
        return Claim(error=probe) if quiet else Wait()
    return Claim(info=probe)


def looks_cut_short(probe: Probe) -> bool:
    """The probe found the file's end missing, or failed as a file still being written
    would: it may still be being written."""
    if isinstance(probe, DocInfo):
        return not probe.complete
    return probe.cut_short


def settled(cand: Candidate, incomplete_seconds: float, now: float) -> bool:
    """The file has stopped changing: not for `incomplete_seconds`, closed or not."""
    return now - cand.last_change >= incomplete_seconds


# -- the candidates of one inbox ----------------------------------------------------------


class Tracker:
    """Candidates of one inbox, by path relative to the inbox."""

    def __init__(self, quiet_seconds: float, fast_close: bool, clock=time.monotonic) -> None:
        self.quiet = quiet_seconds
        self.fast_close = fast_close
        self.clock = clock
        self.candidates: dict[str, Candidate] = {}

    def __len__(self) -> int:
        return len(self.candidates)

    def observe(self, entry: Entry, closed: bool = False) -> Candidate:
        """A scan or an event saw the entry; `closed`: a close-after-write or moved-in
        event (the writer is done with it)."""
        now = self.clock()
        cand = self.candidates.get(entry.relpath)
        if cand is None:
            cand = Candidate(entry, now)
            self.candidates[entry.relpath] = cand
        elif (entry.size, entry.mtime_ns, entry.ino) != cand.key():
            cand.entry = entry
            cand.last_change = now
            cand.why = cand.until = None
            cand.fails_then = False
            cand.closed = False
            cand.next_check = 0.0
        if closed:
            cand.closed = True
            cand.next_check = 0.0
        cand.seen = now
        return cand

    def forget(self, relpath: str) -> None:
        self.candidates.pop(relpath, None)

    def keep_only(self, relpaths: set[str], since: float | None = None) -> list[str]:
        """After a full scan: drop candidates that are gone. `since`: when the scan
        began — a candidate an event showed after that is kept (the scan may have
        listed its folder before it came). Returns the dropped."""
        gone = [r for r, c in self.candidates.items() if r not in relpaths and not c.busy
                and (since is None or c.seen < since)]
        for r in gone:
            del self.candidates[r]
        return gone

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

    def recheck_later(self, cand: Candidate, at: float | None = None) -> None:
        """The file looked incomplete: look again later, less often each time (or `at`,
        when it is known when the answer can change)."""
        cand.checks += 1
        cand.closed = False
        delay = min(MAX_RECHECK_SECONDS, max(self.quiet, 0.5) * (2 ** min(cand.checks, 6)))
        now = self.clock()
        cand.next_check = now + delay if at is None else max(at, now)

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
