"""The journal's native protocol as ocrd writes it (ocrd/service/log.py): field names, the binary
form for values with newlines, large entries as a sealed memfd, and the fallback to
stderr. A datagram socket the test binds stands in for /run/systemd/journal/socket;
tests/systemd/test_nspawn.py checks the same entries in a real journald."""

from __future__ import annotations

import array
import io
import json
import logging
import os
import socket
import struct
import sys
from pathlib import Path

import pytest
import structlog

from ocrd.service import log


def decode_entry(data: bytes) -> dict[str, str]:
    """journald's side of the protocol, enough to read back what was sent."""
    fields: dict[str, str] = {}
    i = 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            key, value = line.split(b"=", 1)
            i = nl + 1
        else:
            key = line
            (size,) = struct.unpack("<Q", data[nl + 1:nl + 9])
            value = data[nl + 9:nl + 9 + size]
            assert data[nl + 9 + size:nl + 10 + size] == b"\n"
            i = nl + 10 + size
        fields[key.decode()] = value.decode()
    return fields


def test_field_names_are_what_journald_keeps() -> None:
    assert log.field_name("file") == "OCRD_FILE"
    assert log.field_name("moved-to") == "OCRD_MOVED_TO"
    assert log.field_name("Seconds") == "OCRD_SECONDS"
    assert log.field_name("größe") == "OCRD_GR__E"
    long = log.field_name("x" * 100)
    assert len(long) == 64 and long.startswith("OCRD_X")


def test_encoder_uses_the_binary_form_only_for_newlines() -> None:
    data = log.encode_entry([("MESSAGE", "two\nlines"), ("OCRD_FILE", "a b=c.pdf"),
                             ("OCRD_NAME", "ünïcode")])
    assert data.startswith(b"MESSAGE\n" + struct.pack("<Q", 9) + b"two\nlines\n")
    assert b"OCRD_FILE=a b=c.pdf\n" in data
    assert decode_entry(data) == {"MESSAGE": "two\nlines", "OCRD_FILE": "a b=c.pdf",
                                  "OCRD_NAME": "ünïcode"}


def test_event_becomes_message_priority_event_and_ocrd_fields() -> None:
    fields = dict(log.journal_fields({
        "event": "file_converted", "level": "info", "logger": "ocrd.pipeline.document",
        "timestamp": "2026-01-01T00:00:00Z", "file": "sub/x y.pdf", "page": 3,
        "seconds": 1.25, "degraded": [], "ok": True, "pages": None}))
    assert fields["EVENT"] == "file_converted"
    assert fields["PRIORITY"] == "6"
    assert fields["SYSLOG_IDENTIFIER"] == "ocrd"
    assert fields["OCRD_FILE"] == "sub/x y.pdf"
    assert fields["OCRD_PAGE"] == "3" and fields["OCRD_SECONDS"] == "1.25"
    assert fields["OCRD_DEGRADED"] == "[]" and fields["OCRD_OK"] == "true"
    assert fields["OCRD_LOGGER"] == "ocrd.pipeline.document"
    assert "OCRD_PAGES" not in fields and "OCRD_TIMESTAMP" not in fields
    assert fields["MESSAGE"] == ('file_converted file="sub/x y.pdf" page=3 seconds=1.25 '
                                 "degraded=[] ok=true")


def _bound(tmp_path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "journal.sock"))
    sock.settimeout(5)
    return sock


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """log.setup() as under systemd: JOURNAL_STREAM names our stderr, and the journal
    socket is one the test reads."""
    st = os.fstat(sys.stderr.fileno())
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    sock = _bound(tmp_path)
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    log.setup("info", "auto", journal_socket=str(tmp_path / "journal.sock"))
    yield sock
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in saved[0]:
        root.addHandler(h)
    root.setLevel(saved[1])
    structlog.reset_defaults()
    sock.close()


def test_structlog_and_stdlib_records_reach_the_journal(journal: socket.socket) -> None:
    structlog.get_logger("ocrd.test").warning("file_failed", file="a.pdf",
                                             reason="encrypted")
    got = decode_entry(journal.recv(65536))
    assert got["EVENT"] == "file_failed" and got["PRIORITY"] == "4"
    assert got["OCRD_FILE"] == "a.pdf" and got["OCRD_REASON"] == "encrypted"
    assert got["MESSAGE"].startswith("file_failed file=a.pdf reason=encrypted")

    # A library's record (vLLM logs through the stdlib): its text is the MESSAGE.
    logging.getLogger("vllm.engine").info("Loading weights took %.2f seconds", 3.5)
    got = decode_entry(journal.recv(65536))
    assert got["MESSAGE"].startswith("Loading weights took 3.50 seconds")
    assert got["OCRD_LOGGER"] == "vllm.engine" and "EVENT" not in got


def test_traceback_is_in_message(journal: socket.socket) -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        structlog.get_logger("ocrd.test").exception("internal_error", file="b.pdf")
    got = decode_entry(journal.recv(65536))
    assert got["PRIORITY"] == "3" and got["EVENT"] == "internal_error"
    assert "Traceback" in got["MESSAGE"] and "ValueError: bad\nthing" in got["MESSAGE"]


def test_large_entry_travels_as_sealed_memfd(tmp_path: Path) -> None:
    sock = _bound(tmp_path)
    handler = log.JournalHandler(str(tmp_path / "journal.sock"))
    payload = log.encode_entry([("MESSAGE", "x" * 4_000_000)])
    handler.send(payload)
    fds = array.array("i")
    _data, anc, _flags, _addr = sock.recvmsg(1024, socket.CMSG_SPACE(fds.itemsize))
    level, kind, raw = anc[0]
    assert (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
    fds.frombytes(raw[:fds.itemsize])
    with os.fdopen(fds[0], "rb") as f:
        f.seek(0)  # journald maps it; the offset is the one our write left
        assert f.read() == payload
    handler.close()
    sock.close()


def test_socket_gone_falls_back_to_prefixed_stderr(tmp_path: Path) -> None:
    stream = io.StringIO()
    fallback = logging.StreamHandler(stream)
    fallback.setFormatter(logging.Formatter("<%(levelno)s>%(message)s"))
    handler = log.JournalHandler(str(tmp_path / "missing.sock"), fallback=fallback)
    handler.setFormatter(logging.Formatter('{"event": "%(message)s", "level": "info"}'))
    record = logging.LogRecord("ocrd", logging.INFO, __file__, 1, "hello", None, None)
    handler.handle(record)
    assert stream.getvalue() == "<20>hello\n"
    handler.close()


def test_no_journal_socket_means_prefixed_json_on_stderr(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture) -> None:
    st = os.fstat(sys.stderr.fileno())
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    root = logging.getLogger()
    saved = list(root.handlers)
    try:
        log.setup("info", "json", journal_socket=str(tmp_path / "none.sock"))
        structlog.get_logger("ocrd.test").error("engine_dead", error="x")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        structlog.reset_defaults()
    line = capfd.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("<3>{")
    assert json.loads(line[3:])["event"] == "engine_dead"
