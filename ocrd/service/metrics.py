"""Prometheus metrics and the /healthz and /readyz endpoints, served from a thread.

No file names in labels: they are unbounded and may be private. File-level detail lives
in the logs and the journal. /metrics is prometheus_client's own WSGI exposition (text or
OpenMetrics by the Accept header, gzip when asked for); the server around it takes a
long listen backlog, a bounded number of worker threads and a timeout per connection, so
that neither a burst of scrapers nor slow clients can starve it.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import structlog
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    make_wsgi_app,
)

from ocrd import __version__
from ocrd.config import listen
from ocrd.config.settings import WRITERS, ConfigError

log = structlog.get_logger("ocrd.service.metrics")

# Connections waiting to be served (listen(2)); Linux caps it at net.core.somaxconn.
BACKLOG = 1024
# Connections served at once; the others wait in the backlog.
WORKERS = 8
# Seconds a connection may take for each read or write before it is dropped.
CONNECTION_TIMEOUT = 10.0

class Metrics:
    def __init__(self) -> None:
        # `_created` series double every counter and histogram and tell a scraper
        # nothing the process start time does not (prometheus_client's switch is global).
        disable_created_metrics()
        r = self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)  # process_resident_memory_bytes, _cpu_seconds_total …
        PlatformCollector(registry=r)  # python_info
        GCCollector(registry=r)
        self.files = Counter("ocrd_files", "Files finished, by result", ["result"], registry=r)
        self.pages = Counter("ocrd_pages", "Pages finished, by result", ["result"], registry=r)
        self.queue_depth = Gauge("ocrd_queue_depth", "Claimed files waiting to start",
                                 registry=r)
        self.candidates = Gauge("ocrd_candidates", "Inbox files not yet ready", registry=r)
        self.active_files = Gauge("ocrd_active_files", "Files being converted", registry=r)
        self.pages_in_flight = Gauge("ocrd_pages_in_flight", "Pages in the engine",
                                     registry=r)
        self.file_seconds = Histogram(
            "ocrd_file_duration_seconds", "Seconds from claim to result, per file",
            registry=r, buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600))
        self.page_seconds = Histogram(
            "ocrd_page_duration_seconds", "Seconds the engine took per page", registry=r,
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
        self.engine_ready = Gauge("ocrd_engine_ready", "1 when the engine takes work",
                                  registry=r)
        self.last_success = Gauge("ocrd_last_success_timestamp_seconds",
                                  "Time of the last converted file", registry=r)
        self.rescans = Counter("ocrd_rescans", "Full scans of inboxes", registry=r)
        self.claims = Counter("ocrd_claims", "Files claimed from inboxes", registry=r)
        self.output_failures = Counter("ocrd_output_failures", "Outputs besides the Markdown "
                                       "(the searchable PDF, hOCR) that could not be "
                                       "written; the Markdown was", ["output"], registry=r)
        for name in WRITERS:  # each built-in output's series, at 0 from the start
            self.output_failures.labels(name)
        self.build = Info("ocrd_build", "Version and engine", registry=r)
        self.build.info({"version": __version__})
        self.inbox_paused = Gauge("ocrd_inbox_paused", "1 for an inbox that takes no files "
                                  "now, with why (one line for people)", ["inbox", "why"],
                                  registry=r)
        self._paused: dict[str, str] = {}
        self.inbox_unread = Gauge("ocrd_inbox_unread_files", "Files in the subfolders of an "
                                  "inbox that does not read them (not recursive), at its "
                                  "last scan", ["inbox"], registry=r)
        self._unread: dict[str, int] = {}

    def set_paused(self, paused: dict[str, str]) -> None:
        """The inboxes that take no files now ({inbox path: why})."""
        if paused == self._paused:
            return
        self.inbox_paused.clear()
        for inbox, why in paused.items():
            self.inbox_paused.labels(inbox, why).set(1)
        self._paused = dict(paused)

    def set_unread(self, unread: dict[str, int]) -> None:
        """The files in subfolders each non-recursive inbox leaves unread ({path: n})."""
        if unread == self._unread:
            return
        self.inbox_unread.clear()
        for inbox, n in unread.items():
            self.inbox_unread.labels(inbox).set(n)
        self._unread = dict(unread)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ListenError(ConfigError):
    """The configured address cannot be listened on: the daemon does not start."""


class _Handler(WSGIRequestHandler):
    timeout = CONNECTION_TIMEOUT  # socketserver applies it to the connection

    def log_message(self, *args: object) -> None:
        pass


class _Server(WSGIServer):
    """wsgiref's server with a pool of `workers` threads. The accept loop waits for a free
    worker before it accepts the next connection, so the rest wait in the kernel's
    backlog instead of each costing a thread."""

    request_queue_size = BACKLOG
    allow_reuse_address = True

    def __init__(self, addr: listen.Address, workers: int, timeout: float) -> None:
        self.address_family = addr.family
        self.slots = threading.BoundedSemaphore(workers)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="metrics-conn")
        self.closing = False
        self.active: set[Any] = set()  # connections being served, cut short by close()
        handler = type("Handler", (_Handler,), {"timeout": timeout})
        super().__init__((addr.host, addr.port), handler)

    def server_bind(self) -> None:
        # HTTPServer's would look up the host's FQDN (DNS, on a host without it: seconds)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
        self.setup_environ()

    def process_request(self, request: Any, client_address: Any) -> None:
        while not self.slots.acquire(timeout=0.5):
            if self.closing:
                self.shutdown_request(request)
                return
        self.pool.submit(self._serve, request, client_address)

    def _serve(self, request: Any, client_address: Any) -> None:
        self.active.add(request)
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - one connection's trouble is its own
            self.handle_error(request, client_address)
        finally:
            self.active.discard(request)
            self.shutdown_request(request)
            self.slots.release()

    def close(self) -> None:
        """Stop accepting, and end the connections in progress: a slow client must not
        hold the daemon's exit for its timeout (the pool's threads are joined at exit)."""
        self.closing = True
        self.shutdown()
        self.server_close()
        for request in list(self.active):
            with contextlib.suppress(OSError):
                request.shutdown(socket.SHUT_RDWR)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out or hung up: not worth a traceback on stderr.
        log.debug("metrics_connection_dropped", client=str(client_address))


class HealthServer:
    """/metrics, /healthz (the main loop is alive) and /readyz (engine loaded, inboxes
    watched; when not, the body says what the daemon is doing instead)."""

    def __init__(self, metrics: Metrics, address: str, live: Callable[[], bool],
                 ready: Callable[[], bool], why: Callable[[], str] = lambda: "starting",
                 workers: int = WORKERS, timeout: float = CONNECTION_TIMEOUT) -> None:
        self.live, self.ready, self.why = live, ready, why
        self._metrics_app = make_wsgi_app(metrics.registry)
        addr = listen.parse(address)
        try:
            self.server = _Server(addr, workers, timeout)
        except OSError as e:
            log.error("metrics_listen_failed", listen=address, error=e.strerror)
            raise ListenError(f"metrics.listen = {address!r}: cannot listen on {addr}: "
                              f"{e.strerror} (another program on that port? change "
                              "metrics.listen, or set it to null to go without /metrics, "
                              "/healthz and /readyz)") from None
        self.server.set_app(self._app)
        port = self.server.socket.getsockname()[1]
        self.address = str(listen.Address(addr.host, port, addr.family))
        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics",
                                        daemon=True)

    def _app(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        if method not in ("GET", "HEAD"):
            return _plain(start_response, "405 Method Not Allowed", b"use GET or HEAD\n",
                          method, [("Allow", "GET, HEAD")])
        if path == "/metrics":
            if method == "GET":
                return self._metrics_app(environ, start_response)
            # prometheus_client answers GET only: a HEAD gets the GET's headers, no body
            got: list[tuple[str, list]] = []
            body = b"".join(self._metrics_app({**environ, "REQUEST_METHOD": "GET"},
                                              lambda s, h, *_: got.append((s, h))))
            start_response(got[0][0], [*got[0][1], ("Content-Length", str(len(body)))])
            return [b""]
        if path == "/healthz":
            ok = self.live()
            return _plain(start_response, "200 OK" if ok else "503 Service Unavailable",
                          b"ok\n" if ok else b"stalled\n", method)
        if path == "/readyz":
            if self.ready():
                return _plain(start_response, "200 OK", b"ready\n", method)
            return _plain(start_response, "503 Service Unavailable",
                          f"not ready: {self.why()}\n".encode(), method)
        return _plain(start_response, "404 Not Found", b"not found\n", method)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.close()


def _plain(start_response: Callable, status: str, body: bytes, method: str,
           extra: list[tuple[str, str]] | None = None) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body))), *(extra or [])])
    return [b"" if method == "HEAD" else body]

