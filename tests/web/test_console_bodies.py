"""Request bodies against the real console (uvicorn on 127.0.0.1, raw sockets): a body
is counted as it arrives, whatever its headers claim; a body sent with Transfer-Encoding
is refused before it is read; an upload's file is taken only after the CSRF token and
only up to the limit; nothing is spooled past the limit; a client that goes away
mid-upload is one info line in the log, never a traceback."""

from __future__ import annotations

import logging
import os
import select
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from console_site import Site, build
from helpers import wait_for

LIMIT = 1024 * 1024  # web.upload_max_bytes in these tests
BOUNDARY = "ocrdtestboundary"


@pytest.fixture
def spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where a form's files are spooled (Python's temporary folder), watched by the test."""
    folder = tmp_path / "spool"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    s = build(tmp_path / "site", web={"upload_max_bytes": LIMIT})
    yield s
    s.stop()


def spooled_bytes(folder: Path) -> int:
    """Bytes of the files this process holds open in `folder` (unlinked ones too)."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(folder)):
                total += os.stat(f"/proc/self/fd/{fd}").st_size
        except OSError:
            continue
    return total


def part(name: str, value: bytes, filename: str | None = None) -> bytes:
    disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return f"--{BOUNDARY}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + value + b"\r\n"


def file_head(filename: str = "big.pdf") -> bytes:
    return (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{filename}"\r\nContent-Type: application/pdf\r\n\r\n').encode()


def head(site: Site, path: str, headers: dict[str, str]) -> bytes:
    _, port = site.address
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}",
             f"Content-Type: multipart/form-data; boundary={BOUNDARY}",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Sender:
    """A raw connection that sends while the server lets it, and notices an answer."""

    def __init__(self, site: Site) -> None:
        self.sock = socket.create_connection(site.address, timeout=10)
        self.sock.setblocking(False)
        self.answer = b""
        self.closed = False
        self.sent = 0

    def poll(self, timeout: float = 0.0) -> None:
        readable, _, _ = select.select([self.sock], [], [], timeout)
        if readable:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            self.answer += chunk
            self.closed = self.closed or not chunk

    def send(self, data: bytes, deadline: float) -> bool:
        """Send it all; False when the server answered or stopped reading first."""
        view = memoryview(data)
        while view:
            self.poll()
            if self.answer or self.closed or time.monotonic() > deadline:
                return False
            _, writable, _ = select.select([], [self.sock], [], 0.2)
            if writable:
                try:
                    n = self.sock.send(view[:65536])
                except OSError:
                    return False
                view = view[n:]
                self.sent += n
        return True

    def status(self, timeout: float) -> int:
        """The answer's status code (0: none within the timeout)."""
        end = time.monotonic() + timeout
        while b"\r\n" not in self.answer and not self.closed and time.monotonic() < end:
            self.poll(0.1)
        line = self.answer.split(b"\r\n", 1)[0].split()
        return int(line[1]) if len(line) >= 2 and line[1].isdigit() else 0

    def close(self) -> None:
        self.sock.close()


def test_a_chunked_upload_claiming_a_small_length_is_refused_before_its_body(
        site: Site, spool: Path) -> None:
    """Content-Length: 1000 and Transfer-Encoding: chunked, then a body without end:
    refused as it begins, whether or not the CSRF token comes with it."""
    csrf = site.json("/api/status")["csrf"]
    for fields in (b"", part("csrf", csrf.encode())):
        sender = Sender(site)
        sender.sock.sendall(head(site, "/upload", {"Content-Length": "1000",
                                                   "Transfer-Encoding": "chunked"}))
        start = fields + file_head()
        chunk = b"x" * 65536
        body = f"{len(start):x}\r\n".encode() + start + b"\r\n"
        deadline = time.monotonic() + 20
        most = 0
        # an endless body: at most 64 MiB, unless the server answers or stops reading
        while sender.sent < 64 * LIMIT and \
                sender.send(body + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n", deadline):
            body = b""
            most = max(most, spooled_bytes(spool))
        status = sender.status(10)
        sender.close()
        assert status in (411, 413), (status, sender.sent, sender.answer[:200])
        assert most <= LIMIT, most
        wait_for(lambda: spooled_bytes(spool) == 0, 10, "nothing spooled left")
        assert not any((site.cfg.inboxes[0].path).iterdir())


def test_an_upload_without_the_csrf_token_first_is_refused_before_its_file_is_read(
        site: Site, spool: Path) -> None:
    inbox = site.cfg.inboxes[0].path
    length = LIMIT  # within the limit: only the token can refuse it
    sender = Sender(site)
    sender.sock.sendall(head(site, "/upload", {"Content-Length": str(length)}))
    start = part("inbox", str(inbox).encode()) + file_head()
    assert sender.send(start + b"x" * 65536, time.monotonic() + 10)
    # the rest of the body is never sent: the answer must come without it
    status = sender.status(10)
    sender.close()
    assert status == 403, (status, sender.answer[:200])
    wait_for(lambda: spooled_bytes(spool) == 0, 10, "nothing spooled left")
    assert not any(inbox.iterdir())


def test_a_large_body_to_any_other_form_is_cut_off_unread(site: Site, spool: Path) -> None:
    """The sign-in form (open to anyone) and a retry form take a few fields: a body of
    megabytes is refused once it passes the small limit, not spooled to its end."""
    failed = site.ids["failed"]
    for path in ("/login", f"/files/{failed}/retry"):
        sender = Sender(site)
        sender.sock.sendall(head(site, path, {"Content-Length": str(64 * LIMIT)}))
        sender.send(file_head() + b"x" * (2 * LIMIT), time.monotonic() + 10)
        status = sender.status(10)
        sender.close()
        assert status == 413, (path, status, sender.answer[:200])
        assert sender.sent < 64 * LIMIT
        wait_for(lambda: spooled_bytes(spool) == 0, 10, "nothing spooled left")


def test_an_abandoned_upload_is_one_info_line_and_leaves_nothing(
        site: Site, spool: Path, caplog: pytest.LogCaptureFixture) -> None:
    csrf = site.json("/api/status")["csrf"]
    inbox = site.cfg.inboxes[0].path
    caplog.set_level(logging.INFO)
    with structlog.testing.capture_logs() as events:
        sender = Sender(site)
        sender.sock.sendall(head(site, "/upload", {"Content-Length": str(LIMIT)}))
        sender.send(part("csrf", csrf.encode()) + part("inbox", str(inbox).encode()) +
                    file_head() + b"%PDF-1.4 " + b"x" * 100_000, time.monotonic() + 10)
        sender.close()  # the tab is closed, 100 kB into the file
        wait_for(lambda: any(e["event"] == "upload_abandoned" for e in events), 10,
                 "the abandoned upload logged")
        assert site.get("/healthz")[0] == 200  # the console goes on
    abandoned = [e for e in events if e["event"] == "upload_abandoned"]
    assert len(abandoned) == 1 and abandoned[0]["log_level"] == "info", abandoned
    assert not [e for e in events if e["log_level"] in ("error", "critical")], events
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert loud == [], [r.getMessage() for r in loud]
    wait_for(lambda: spooled_bytes(spool) == 0, 10, "nothing spooled left")
    assert not any(inbox.iterdir())


def test_an_upload_within_the_limit_still_arrives(site: Site, spool: Path) -> None:
    """The form as the browser sends it (token, inbox, file): taken whole."""
    csrf = site.json("/api/status")["csrf"]
    inbox = site.cfg.inboxes[0].path
    data = b"%PDF-1.4 " + b"y" * (LIMIT - 9)
    body = (part("csrf", csrf.encode()) + part("inbox", str(inbox).encode()) +
            part("file", data, "whole.pdf") + f"--{BOUNDARY}--\r\n".encode())
    sender = Sender(site)
    sender.sock.sendall(head(site, "/upload", {"Content-Length": str(len(body))}))
    assert sender.send(body, time.monotonic() + 10)
    status = sender.status(10)
    sender.close()
    assert status == 303 and b"location: /files?state=waiting" in sender.answer.lower()
    assert (inbox / "whole.pdf").read_bytes() == data
