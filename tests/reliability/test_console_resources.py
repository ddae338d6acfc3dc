"""The console lives in the daemon and shares its file descriptors: connections that
send nothing — a crowd of them, or one that sends half a request and waits — must not
take them from the work (anyone who reaches the port can open them: off loopback the
token is checked only after the headers). Real sockets against a real daemon, its
descriptor limit set with prlimit."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest
from helpers import Daemon, drop, free_port, make_pdf, sentence_lines, wait_for
from test_shortage import nofile

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]

IDLE = 300  # more than the daemon's descriptors (256) in the first test


def console_daemon(root: Path, limit: str) -> tuple[Daemon, int]:
    port = free_port()
    d = Daemon(root, web={"listen": f"127.0.0.1:{port}"},
               prefix=["prlimit", f"--nofile={limit}"])
    d.config["inboxes"][0].update(quiet_seconds=0.3)
    return d, port


def connect(port: int) -> socket.socket | None:
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    return s


def closed_by_server(s: socket.socket, within: float) -> bool:
    """The server closed the connection (EOF or reset) within `within` seconds."""
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_idle_connections_to_the_console_do_not_starve_the_daemon(tmp_path: Path) -> None:
    """300 connections that send nothing, against a daemon that may hold 256 descriptors
    (soft = hard: raising the limit cannot help here): files keep converting, and the
    log gets a line or two, not one per refused connection."""
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(1, 3)])
    d, port = console_daemon(tmp_path / "d", "256:256")
    held: list[socket.socket] = []
    with d:
        d.start()
        try:
            for _ in range(IDLE):
                s = connect(port)
                if s is not None:
                    held.append(s)
            drop(src, d.inbox / "a.pdf")
            wait_for((d.outbox / "a.md").exists, 90, "a.md while the connections wait")
            drop(src, d.inbox / "b.pdf")
            wait_for((d.outbox / "b.md").exists, 90, "b.md too")
            assert d.proc.poll() is None
        finally:
            for s in held:
                s.close()
        text = d.log_text()
    assert text.count("socket.accept() out of system resource") <= 1
    assert len(d.events("console_full")) <= 2
    assert d.events("scan_error") == [] and d.events("resources_short") == []


def test_a_connection_that_does_not_send_its_headers_is_closed(tmp_path: Path) -> None:
    d, port = console_daemon(tmp_path / "d", "1024:1024")
    with d:
        d.start()
        silent, slow = connect(port), connect(port)
        assert silent is not None and slow is not None
        with silent, slow:
            slow.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
            assert closed_by_server(silent, 60), "a silent connection was kept"
            assert closed_by_server(slow, 60), "a half-sent request was kept"
        # a real request still works
        with contextlib.closing(connect(port)) as ok:
            assert ok is not None
            ok.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            ok.settimeout(10)
            assert ok.recv(64).startswith(b"HTTP/1.1 ")


def test_the_descriptor_limit_is_raised_to_the_hard_limit(tmp_path: Path) -> None:
    d, _port = console_daemon(tmp_path / "d", "256:8192")
    with d:
        d.start()
        assert nofile(d.pid) == (8192, 8192)
        assert d.event("descriptor_limit")["soft"] == 8192
