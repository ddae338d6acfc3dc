"""What the daemon knows right now and the journal does not (engine, inboxes, queue,
pages in flight): the one interface between the daemon and its console.

The daemon passes a `LiveStatus` with a function that builds a `Live` snapshot; the
console, on its own thread, asks for one and the function runs on the daemon's loop
(so it reads the daemon's state without locks). A loop that does not answer within a
second is itself news: the console then says so instead of waiting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class WaitingFile:
    """A file seen in an inbox and not claimed yet."""

    name: str  # relative to its inbox, as shown
    size: int
    seen: float  # wall time it was first seen, or last changed
    why: str  # for a person: "still changing", "empty", "truncated" ...
    reason: str  # a stable code: changing | quiet | checking | empty | truncated | paused ...
    until: float | None = None  # wall time the wait ends (checked again, or failed)
    fails_then: bool = False  # at `until` it fails (unless it changes)


@dataclass(frozen=True)
class ConvertingFile:
    """A file being converted now."""

    job_id: int | None
    name: str
    inbox: str
    pages_done: int
    pages: int
    started: float  # wall time
    eta_seconds: float | None = None  # the rest, at this document's pace so far


@dataclass(frozen=True)
class InboxLive:
    path: str  # as shown (valid UTF-8: ocrd/names.py)
    watch: str  # inotify | polling
    available: bool  # the folder is there (a share may be unmounted)
    waiting: int  # files seen in the inbox, not yet ready
    paused: bool = False  # no new claims for now (a folder replaced, a destination failing)
    why: str | None = None  # why, in one line for people
    files: tuple[WaitingFile, ...] = ()  # the waiting files, by name
    # files in its subfolders that it does not read (not recursive): how many (at least,
    # when `unread_complete` is False: the count stopped), and one of them
    unread: int = 0
    unread_first: str | None = None
    unread_complete: bool = True


@dataclass(frozen=True)
class Live:
    state: str  # starting | ready | stopping
    engine_kind: str
    engine_model: str
    engine_ready: bool
    pages_done: int  # pages of files finished since start
    pages_per_second: float  # over the last minute
    pages_in_flight: int
    queued: int  # claimed files waiting to start
    converting: int  # files being converted
    inboxes: tuple[InboxLive, ...] = ()
    converting_files: tuple[ConvertingFile, ...] = ()
    version: str = ""
    at: float = field(default_factory=time.time)

    def as_dict(self) -> dict:
        return asdict(self)


class LiveStatus:
    """Snapshots of the daemon, built on its loop, for another thread. Answers at most
    twice a second from the daemon (a cached one in between), whatever the number of
    browsers polling."""

    def __init__(self, loop: asyncio.AbstractEventLoop, build: Callable[[], Live],
                 timeout: float = 1.0, max_age: float = 0.5) -> None:
        self._loop = loop
        self._build = build
        self._timeout = timeout
        self._max_age = max_age
        self._lock = threading.Lock()
        self._last: Live | None = None
        self._last_at = 0.0

    def get(self) -> Live | None:
        """The daemon's state, or None when its loop did not answer (stalled, or gone)."""
        with self._lock:
            if self._last is not None and time.monotonic() - self._last_at < self._max_age:
                return self._last
            result: concurrent.futures.Future[Live] = concurrent.futures.Future()

            def build() -> None:
                try:
                    result.set_result(self._build())
                except Exception as e:  # noqa: BLE001 - handed to the waiting thread
                    result.set_exception(e)

            try:
                self._loop.call_soon_threadsafe(build)
                live = result.result(timeout=self._timeout)
            except (RuntimeError, TimeoutError):
                return None  # the loop closed, or did not turn within the timeout
            self._last, self._last_at = live, time.monotonic()
            return live
