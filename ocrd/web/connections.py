"""The console's connections, bounded: it shares the daemon's descriptors, and a crowd
of connections that send nothing must not take them.

- At most `max_connections` at a time: one more is closed as soon as it is accepted,
  so it never holds a descriptor (a browser retries; a flood gets nothing).
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
import resource
from typing import Any

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..conditions import Conditions

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


class BoundedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a connection cap and a header timeout."""

    most = MOST_CONNECTIONS
    header_timeout = HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.server_state.connections) >= self.most:
            conditions.met("full", "console_full", most=self.most,
                           hint="connections beyond this are closed at once; many "
                           "clients that hold connections open?")
            self.transport = transport
            transport.abort()  # never seen by the server: nothing to clean up
            return
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
        if self.flow is None:  # closed in connection_made: uvicorn never saw it
            return
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


def protocol_class(most: int) -> type[BoundedH11Protocol]:
    return type("ConsoleProtocol", (BoundedH11Protocol,), {"most": most})


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
