"""structlog setup: one pipeline for ocrd's events and every library's log records.

Console renderer on a terminal, JSON lines otherwise. Under journald (JOURNAL_STREAM
names our stderr) records go to the journal's native socket instead, one entry per
record with queryable fields: `journalctl -u ocrd EVENT=file_converted OCRD_FILE=a.pdf`.
Should the socket be missing or refuse a record, that record goes to stderr prefixed
with its syslog priority (`<3>` …), which journald stores as PRIORITY.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import socket
import struct
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from ocrd import names

PRIORITY = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}

JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "ocrd"
# Keys of the event dict that become the entry's own fields rather than OCRD_* fields.
_OWN_KEYS = ("event", "level", "timestamp", "exception", "_foreign")


class _JournalPrefix(logging.Formatter):
    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        prio = PRIORITY.get(record.levelname.lower(), 6)
        return f"<{prio}>" + self.inner.format(record)


def printable_names(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    """File names that are not UTF-8 (str with escaped bytes) in their readable form
    (`bad\\xff.pdf`): no renderer or stream can encode them as they are."""
    for key, value in event.items():
        if isinstance(value, str) and not names.utf8(value):
            event[key] = names.shown(value)
    return event


def under_journald() -> bool:
    stream = os.environ.get("JOURNAL_STREAM")
    if not stream:
        return False
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
        return (st.st_dev, st.st_ino) == (dev, ino)
    except (ValueError, OSError):
        return False


# -- the journal's native protocol ------------------------------------------------------
# One datagram per entry: `KEY=value\n` lines; a value containing a newline is sent as
# `KEY\n`, its length as 64-bit little-endian, the bytes, `\n`. journald keeps only
# field names of A–Z, 0–9 and `_`, not starting with `_` (those are its own), at most
# 64 characters. See systemd's "Native Journal Protocol" document.


def field_name(key: str) -> str:
    """An event dict key as a journal field: `file` → `OCRD_FILE`, `moved-to` →
    `OCRD_MOVED_TO`."""
    return ("OCRD_" + re.sub(r"[^A-Za-z0-9]", "_", key).upper())[:64]


def field_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False, default=repr)


def encode_entry(fields: Iterable[tuple[str, str | bytes]]) -> bytes:
    out = bytearray()
    for key, value in fields:
        data = value.encode("utf-8", "replace") if isinstance(value, str) else value
        name = key.encode("ascii")
        if b"\n" in data:
            out += name + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name + b"=" + data + b"\n"
    return bytes(out)


def _shown(value: Any) -> str:
    text = field_value(value) or ""
    if not text or any(c.isspace() or c in "\"=" for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


def journal_fields(event: Mapping[str, Any],
                   identifier: str = IDENTIFIER) -> list[tuple[str, str]]:
    """An event dict (after the shared processors) as journal fields: MESSAGE (a line a
    person reads in `journalctl`), PRIORITY, SYSLOG_IDENTIFIER, EVENT (ocrd's own events
    only; a library record's text is its MESSAGE) and one OCRD_<KEY> per other key."""
    name = str(event.get("event", ""))
    level = str(event.get("level", "info")).lower()
    foreign = bool(event.get("_foreign"))
    extra = {k: v for k, v in event.items() if k not in _OWN_KEYS and v is not None}
    shown = {k: v for k, v in extra.items() if k != "logger" or foreign}
    message = " ".join([name, *(f"{k}={_shown(v)}" for k, v in shown.items())])
    if event.get("exception"):
        message += "\n" + str(event["exception"]).rstrip("\n")
    fields = [("MESSAGE", message), ("PRIORITY", str(PRIORITY.get(level, 6))),
              ("SYSLOG_IDENTIFIER", identifier)]
    if not foreign and name:
        fields.append(("EVENT", name))
    for key, value in extra.items():
        text = field_value(value)
        if text is not None:
            fields.append((field_name(key), text))
    return fields


def _journal_json(_logger: Any, _name: str, event: dict[str, Any]) -> str:
    """Last processor of the journal's formatter: the event dict as JSON, marked when it
    came from a library's stdlib record rather than from ocrd's structlog events."""
    event.pop("_record", None)
    if not event.pop("_from_structlog", False):
        event["_foreign"] = True
    return json.dumps(event, ensure_ascii=False, default=repr)


class JournalHandler(logging.Handler):
    """Writes each record as one native journal entry. A record the journal does not
    take (socket gone while journald restarts, …) goes to `fallback` instead."""

    def __init__(self, path: str = JOURNAL_SOCKET, identifier: str = IDENTIFIER,
                 fallback: logging.Handler | None = None) -> None:
        super().__init__()
        self.path = path
        self.identifier = identifier
        self.fallback = fallback
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event = json.loads(self.format(record))
            payload = encode_entry(journal_fields(event, self.identifier))
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)
            return
        try:
            self.send(payload)
        except OSError:
            if self.fallback is not None:
                self.fallback.handle(record)

    def send(self, payload: bytes) -> None:
        try:
            self._sock.sendto(payload, self.path)
        except OSError as e:
            if e.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                raise
            self._send_memfd(payload)

    def _send_memfd(self, payload: bytes) -> None:
        """Entries larger than a datagram (a long traceback) travel as a sealed memfd,
        the way sd_journal_send() does it."""
        fd = os.memfd_create("ocrd-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                        | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
            self._sock.sendmsg([], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                     struct.pack("i", fd))], 0, self.path)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._sock.close()
        super().close()


def setup(level: str = "info", fmt: str = "auto", stream: Any = None,
          journal_socket: str = JOURNAL_SOCKET) -> None:
    to_journal = stream is None and under_journald() and os.path.exists(journal_socket)
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if hasattr(stream, "isatty") and stream.isatty() else "json"
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        printable_names,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler: logging.Handler
    if to_journal:
        # The journal gets readable tracebacks in MESSAGE; stderr (the fallback) the
        # same JSON lines as without journald.
        fallback = logging.StreamHandler(stream)
        fallback.setFormatter(_JournalPrefix(structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                        structlog.processors.format_exc_info,
                        structlog.processors.JSONRenderer()])))
        handler = JournalHandler(journal_socket, fallback=fallback)
        handler.setFormatter(structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.processors.format_exc_info, _journal_json]))
    else:
        if fmt == "json":
            renderer: Any = structlog.processors.JSONRenderer()
            shared.append(structlog.processors.dict_tracebacks)
        else:
            renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty())
        formatter: logging.Formatter = structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
        if under_journald():
            formatter = _JournalPrefix(formatter)
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Noisy libraries stay at warning unless debugging.
    for name in ("watchdog", "PIL", "urllib3", "asyncio"):
        logging.getLogger(name).setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
    logging.captureWarnings(True)
    # vLLM's own logger reaches the root handler instead of configuring its own.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
