"""The console's connections, bounded: it shares the daemon's descriptors, and a crowd
of connections that send nothing must not take them.

- At most `max_connections` at a time: while that many are open the console accepts
  no more (`ConsoleServer`): the others wait in the kernel's listen backlog, costing
  the daemon neither a descriptor nor a moment of its time.
- A connection must send a request's headers within HEADER_TIMEOUT seconds (its first
  request, and every later one once it has begun to arrive); an idle keep-alive
  connection goes after uvicorn's keep-alive timeout. Off loopback the token is checked
  only after the headers: these limits come first.
- A failing accept (no descriptor to spare) and a full console are logged when first
  met and then at most every few minutes with a count (conditions.py), never once per
  connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import resource
import socket
import sys
from collections.abc import Callable
from typing import Any

import h11
import structlog
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ocrd.conditions import Conditions

log = structlog.get_logger("ocrd.web")

# seconds a connection has to send a request's headers
HEADER_TIMEOUT = 10.0
# seconds an idle keep-alive connection is kept (uvicorn's timeout_keep_alive)
KEEP_ALIVE = 5.0
# the most connections at once, whatever the descriptor limit
MOST_CONNECTIONS = 256

conditions = Conditions(log)


def max_connections() -> int:
    """Connections the console may hold: an eighth of the descriptors this process may
    open (the rest are the daemon's), at least 16 and at most MOST_CONNECTIONS."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MOST_CONNECTIONS
    return max(16, min(MOST_CONNECTIONS, soft // 8))


class HeaderTimeoutH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with a time limit on a request's headers."""

    header_timeout = HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._await_headers()  # a request has begun to arrive (or may now)
        else:
            self._headers_came()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_came()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._headers_came()  # idle now: uvicorn's keep-alive timeout applies

    def _await_headers(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout,
                                                      self._headers_too_slow)

    def _headers_came(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE:  # still no complete request
            self.transport.close()


class ConsoleServer(uvicorn.Server):
    """uvicorn's server, taking its connections itself (`AcceptLoop`) instead of through
    asyncio's server, which accepts as long as the system lets it."""

    def __init__(self, config: uvicorn.Config, most: int) -> None:
        super().__init__(config)
        self.most = most

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(3)
        config, loop = self.config, asyncio.get_running_loop()

        def create_protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state,
                app_state=self.lifespan.state, _loop=loop)

        self.servers = [AcceptLoop(sock, create_protocol, self.server_state.connections,
                                   self.most) for sock in sockets or ()]  # type: ignore
        self.started = True


class AcceptLoop:
    """Accepts connections on `sock` while fewer than `most` are open; a failing
    accept (no descriptor to spare) waits a second and is logged once per condition.
    Has what uvicorn asks of a server: close() and wait_closed()."""

    PAUSE = 0.1  # seconds between looks at a full console
    RETRY = 1.0  # seconds after an accept that failed for want of resources

    def __init__(self, sock: socket.socket, protocol: Callable[[], asyncio.Protocol],
                 connections: set, most: int) -> None:
        self.sock, self.protocol, self.connections, self.most = sock, protocol, \
            connections, most
        sock.setblocking(False)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="accept")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if len(self.connections) >= self.most:
                conditions.met("full", "console_full", most=self.most,
                               hint="more connections wait until one closes; many "
                               "clients holding connections open?")
                await asyncio.sleep(self.PAUSE)
                continue
            try:
                conn, _addr = await loop.sock_accept(self.sock)
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    conditions.met("accept", "console_accept_failed", level="error",
                                   error=e.strerror, hint="no file descriptor to spare; "
                                   "the console takes connections again when there is")
                    await asyncio.sleep(self.RETRY)
                continue  # ECONNABORTED and the like: that client gave up
            try:
                await loop.connect_accepted_socket(self.protocol, conn)
            except OSError:
                conn.close()

    def close(self) -> None:
        self._task.cancel()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The console loop's: a failing accept (EMFILE …) is one line per condition, not
    one per attempt (asyncio's own handler logged tens of thousands)."""
    message = str(context.get("message", ""))
    if message.startswith("socket.accept() out of system resource"):
        error = context.get("exception")
        conditions.met("accept", "console_accept_failed", level="error",
                       error=str(error), hint="no file descriptor to spare; the console "
                       "takes connections again when there is")
        return
    loop.default_exception_handler(context)
