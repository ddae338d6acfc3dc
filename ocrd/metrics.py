"""Prometheus metrics and the /healthz and /readyz endpoints, served from a thread.

No file names in labels: they are unbounded and may be private. File-level detail lives
in the logs and the journal.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)

from . import __version__


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.files = Counter("ocrd_files", "Files finished, by result", ["result"], registry=r)
        self.pages = Counter("ocrd_pages", "Pages finished, by result", ["result"], registry=r)
        self.queue_depth = Gauge("ocrd_queue_depth", "Claimed files waiting to start",
                                 registry=r)
        self.candidates = Gauge("ocrd_candidates", "Inbox files not yet ready", registry=r)
        self.active_files = Gauge("ocrd_active_files", "Files being converted", registry=r)
        self.pages_in_flight = Gauge("ocrd_pages_in_flight", "Pages in the engine",
                                     registry=r)
        self.file_seconds = Histogram(
            "ocrd_file_seconds", "Seconds from claim to result, per file", registry=r,
            buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600))
        self.page_seconds = Histogram(
            "ocrd_page_seconds", "Seconds the engine took per page", registry=r,
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
        self.engine_ready = Gauge("ocrd_engine_ready", "1 when the engine takes work",
                                  registry=r)
        self.last_success = Gauge("ocrd_last_success_timestamp_seconds",
                                  "Time of the last converted file", registry=r)
        self.rescans = Counter("ocrd_rescans", "Full scans of inboxes", registry=r)
        self.claims = Counter("ocrd_claims", "Files claimed from inboxes", registry=r)
        self.build = Info("ocrd_build", "Version and engine", registry=r)
        self.build.info({"version": __version__})

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HealthServer:
    """/metrics, /healthz (the main loop is alive) and /readyz (engine loaded, inboxes
    watched)."""

    def __init__(self, metrics: Metrics, listen: str, live: Callable[[], bool],
                 ready: Callable[[], bool]) -> None:
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                path = self.path.split("?")[0]
                if path == "/metrics":
                    self._send(200, metrics.render(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    ok = live()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"stalled\n")
                elif path == "/readyz":
                    ok = ready()
                    self._send(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
                else:
                    self._send(404, b"not found\n")

            def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
        self.server.daemon_threads = True
        self.address = f"{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
