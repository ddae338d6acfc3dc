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

import heapq
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass

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
    # warnings already logged; and checks that failed with an unexpected exception (a
    # bug), as internal errors. Immutable, shared while empty: a candidate is one object
    # for the garbage collector to look at, however many there are
    reported: frozenset[str] = frozenset()
    failures: tuple[errors.OcrdError, ...] = ()
    why: str | None = None  # the last check's reason for waiting (empty, truncated ...)
    # when the wait the last check decided ends (monotonic; None: not known), and whether
    # the file then fails (True) or is read as it is (False)
    until: float | None = None
    fails_then: bool = False
    # its entry in the tracker's heap of due times (0: none, while a check runs)
    stamp: int = 0

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
    """Candidates of one inbox, by path relative to the inbox, in the order they last
    changed (oldest first), and when each may next be due, in a heap: which are due,
    when the next one is, and the oldest few cost the same whatever the number of
    candidates (the intake loop asks at every turn).

    A candidate being checked (`busy`) leaves the heap; `checked` puts it back when its
    check ends, as it is then."""

    def __init__(self, quiet_seconds: float, fast_close: bool, clock=time.monotonic) -> None:
        self._quiet = quiet_seconds
        self._fast_close = fast_close
        self.clock = clock
        self.candidates: dict[str, Candidate] = {}
        self._heap: list[tuple[float, int, str]] = []  # (due at, stamp, relpath)
        self._stamps = itertools.count(1)

    def __len__(self) -> int:
        return len(self.candidates)

    @property
    def quiet(self) -> float:
        return self._quiet

    @quiet.setter
    def quiet(self, seconds: float) -> None:
        self._quiet = seconds
        self._reschedule_all()

    @property
    def fast_close(self) -> bool:
        return self._fast_close

    @fast_close.setter
    def fast_close(self, on: bool) -> None:
        self._fast_close = on
        self._reschedule_all()

    # -- the heap of due times ---------------------------------------------------------

    def _due_at(self, cand: Candidate) -> float:
        if self._fast_close and cand.closed and cand.entry.regular:
            return cand.next_check
        return max(cand.next_check, cand.last_change + self._quiet)

    def _schedule(self, cand: Candidate) -> None:
        """(Re)enter the candidate in the heap; its earlier entry is stale from now."""
        cand.stamp = next(self._stamps)
        heapq.heappush(self._heap, (self._due_at(cand), cand.stamp, cand.entry.relpath))
        if len(self._heap) > 2 * len(self.candidates) + 1024:
            self._reschedule_all()  # mostly stale entries: start afresh

    def _reschedule_all(self) -> None:
        self._heap = []
        for cand in self.candidates.values():
            cand.stamp = 0
            if not cand.busy:
                cand.stamp = next(self._stamps)
                self._heap.append((self._due_at(cand), cand.stamp, cand.entry.relpath))
        heapq.heapify(self._heap)

    def _top(self) -> tuple[float, Candidate] | None:
        """The heap's first live entry (stale ones and those of busy candidates dropped)."""
        heap = self._heap
        while heap:
            at, stamp, relpath = heap[0]
            cand = self.candidates.get(relpath)
            if cand is not None and cand.stamp == stamp:
                if not cand.busy:
                    return at, cand
                cand.stamp = 0  # back in when its check ends (`checked`)
            heapq.heappop(heap)
        return None

    # -- what scans, events and checks tell ----------------------------------------------

    def observe(self, entry: Entry, closed: bool = False) -> Candidate:
        """A scan or an event saw the entry; `closed`: a close-after-write or moved-in
        event (the writer is done with it)."""
        now = self.clock()
        cand = self.candidates.get(entry.relpath)
        changed = True
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
            del self.candidates[entry.relpath]  # to the end: the order of last changes
            self.candidates[entry.relpath] = cand
        else:
            changed = False
        if closed:
            cand.closed = True
            cand.next_check = 0.0
            changed = True
        cand.seen = now
        if not cand.busy and (changed or cand.stamp == 0):
            self._schedule(cand)
        return cand

    def forget(self, relpath: str) -> None:
        self.candidates.pop(relpath, None)

    def keep_only(self, relpaths: set[str], since: float | None = None,
                  among: Iterable[str] | None = None) -> list[str]:
        """After a full scan: drop candidates that are gone. `since`: when the scan
        began — a candidate an event showed after that is kept (the scan may have
        listed its folder before it came). `among`: look at these candidates only (a
        part of them, so that a huge inbox is gone through in parts). Returns the
        dropped."""
        gone = []
        for r in self.candidates if among is None else among:
            c = self.candidates.get(r)
            if c is not None and r not in relpaths and not c.busy and \
                    (since is None or c.seen < since):
                gone.append(r)
        for r in gone:
            del self.candidates[r]
        return gone

    def due(self, limit: int | None = None) -> list[Candidate]:
        """Candidates to check now (at most `limit`, soonest due first): quiet long
        enough, or closed on a local filesystem."""
        now = self.clock()
        out: list[Candidate] = []
        taken: list[tuple[float, int, str]] = []
        while limit is None or len(out) < limit:
            top = self._top()
            if top is None or top[0] > now:
                break
            taken.append(heapq.heappop(self._heap))
            out.append(top[1])
        for item in taken:  # still due until their check begins (`busy`)
            heapq.heappush(self._heap, item)
        return out

    def checked(self, cand: Candidate) -> None:
        """Its check has ended: due again as it is now, unless it was forgotten."""
        cand.busy = False
        if self.candidates.get(cand.entry.relpath) is cand:
            self._schedule(cand)

    def recheck_later(self, cand: Candidate, at: float | None = None) -> None:
        """The file looked incomplete: look again later, less often each time (or `at`,
        when it is known when the answer can change)."""
        cand.checks += 1
        cand.closed = False
        delay = min(MAX_RECHECK_SECONDS, max(self.quiet, 0.5) * (2 ** min(cand.checks, 6)))
        now = self.clock()
        cand.next_check = now + delay if at is None else max(at, now)
        if not cand.busy and self.candidates.get(cand.entry.relpath) is cand:
            self._schedule(cand)

    def next_wakeup(self) -> float | None:
        """Seconds until some candidate may become due (for the intake loop's sleep)."""
        top = self._top()
        return None if top is None else max(0.0, top[0] - self.clock())

    def oldest(self, limit: int) -> list[Candidate]:
        """The `limit` candidates that last changed longest ago, oldest first."""
        return list(itertools.islice(self.candidates.values(), limit))
