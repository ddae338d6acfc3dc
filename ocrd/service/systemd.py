"""Telling systemd the truth: sd_notify messages, and the liveness that decides whether
WATCHDOG=1 may be sent.

Alive means two things. The main loop turns (it marks each turn), and pages given to the
engine come back: a page that is sent while nothing else is in the engine starts the
clock, every page that comes back (with text or with an error, a timeout included)
restarts it. Idle time never counts — a quiet night followed by a long document is not a
stall — and neither does time a page waits for a slot, a renderer or an engine that is
away (those pages are not in the engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable

import structlog

log = structlog.get_logger("ocrd.service.systemd")

# The main loop turns at least once a second; this much silence means it is stuck.
LOOP_STALL_SECONDS = 30.0
# On top of the page timeout: a page's timeout fires, its call ends, and that counts as
# progress; no page back for page_timeout + this long means the engine call is stuck.
PAGE_GRACE_SECONDS = 15.0


class Notifier:
    """sd_notify over the socket systemd passes in NOTIFY_SOCKET. The variable is read
    once and removed from the environment, so engine subprocesses cannot inherit it."""

    def __init__(self) -> None:
        self.address = os.environ.pop("NOTIFY_SOCKET", None)
        usec = os.environ.pop("WATCHDOG_USEC", None)
        pid = os.environ.pop("WATCHDOG_PID", None)
        self.watchdog_seconds: float | None = None
        if usec and (pid is None or pid == str(os.getpid())):
            with contextlib.suppress(ValueError):
                self.watchdog_seconds = int(usec) / 1e6
        self._sock: socket.socket | None = None
        # The last STATUS= sent (or that would have been, without systemd): /readyz
        # tells it as the reason it is not ready.
        self.status = "starting"

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> None:
        for f in fields:
            if f.startswith("STATUS="):
                self.status = f.removeprefix("STATUS=")
        if not self.address:
            return
        addr = self.address
        if addr.startswith("@"):
            addr = "\0" + addr[1:]
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(fields).encode(), addr)
        except OSError as e:
            log.warning("sd_notify_failed", error=str(e), message=fields[0])


class Liveness:
    """The main loop's turns and the engine's pages, against a clock."""

    def __init__(self, page_timeout_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.page_timeout = page_timeout_seconds
        self.clock = clock
        now = clock()
        self.loop_at = now
        self.progress_at = now
        self.in_engine = 0
        self.loop_watched = True

    def loop_turned(self) -> None:
        self.loop_at = self.clock()

    def loop_stopped(self) -> None:
        """The main loop was stopped on purpose (draining before exit): its turns no
        longer say anything. The heartbeat still runs, so the event loop does; pages
        still in the engine must still come back."""
        self.loop_watched = False

    def page_sent(self) -> None:
        """A page goes into the engine. From idle, the clock starts now."""
        if self.in_engine == 0:
            self.progress_at = self.clock()
        self.in_engine += 1

    def page_back(self) -> None:
        """A page's engine call ended (text, error, timeout or cancellation)."""
        self.in_engine = max(0, self.in_engine - 1)
        self.progress_at = self.clock()

    def problem(self) -> str | None:
        """Why the daemon is not live, or None when it is."""
        now = self.clock()
        if self.loop_watched and now - self.loop_at > LOOP_STALL_SECONDS:
            return f"the main loop has not turned for {now - self.loop_at:.0f} s"
        waited = now - self.progress_at
        if self.in_engine and waited > self.page_timeout + PAGE_GRACE_SECONDS:
            return (f"{self.in_engine} page(s) in the engine and none came back for "
                    f"{waited:.0f} s")
        return None

    def live(self) -> bool:
        return self.problem() is None

    def seconds_since_loop(self) -> float:
        return self.clock() - self.loop_at


class Heartbeat:
    """Every few seconds: WATCHDOG=1 while live (else a `stalled` line saying why), and
    a STATUS= line with the queue, pages in flight and pages/s over the last minute."""

    def __init__(self, notifier: Notifier, liveness: Liveness,
                 pages_done: Callable[[], int], status: Callable[[float], str]) -> None:
        self.notifier = notifier
        self.liveness = liveness
        self.pages_done = pages_done
        self.status = status
        self._rate: list[tuple[float, int]] = []

    def rate(self, now: float) -> float:
        """Pages per second over the last minute."""
        self._rate.append((now, self.pages_done()))
        self._rate = [(t, n) for t, n in self._rate if now - t <= 60]
        t0, n0 = self._rate[0]
        return (self._rate[-1][1] - n0) / (now - t0) if now > t0 else 0.0

    async def run(self) -> None:
        interval = min((self.notifier.watchdog_seconds or 10.0) / 2, 5.0)
        last_status = 0.0
        while True:
            await asyncio.sleep(interval)
            problem = self.liveness.problem()
            if problem is None:
                if self.notifier.watchdog_seconds:
                    self.notifier.send("WATCHDOG=1")
            else:
                log.error("stalled", why=problem, in_engine=self.liveness.in_engine,
                          seconds_since_loop=round(self.liveness.seconds_since_loop(), 1))
            now = time.monotonic()
            rate = self.rate(now)
            if now - last_status >= 5:
                last_status = now
                self.notifier.send(f"STATUS={self.status(rate)}")
