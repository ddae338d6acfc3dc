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
class InboxLive:
    path: str  # as shown (valid UTF-8: ocrd/names.py)
    watch: str  # inotify | polling
    available: bool  # the folder is there (a share may be unmounted)
    waiting: int  # files seen in the inbox, not yet ready
    paused: bool = False  # no new claims for now (a folder replaced, a destination failing)
    why: str | None = None  # why, in one line for people


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
