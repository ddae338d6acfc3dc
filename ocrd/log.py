"""structlog setup: one pipeline for ocrd's events and every library's log records.

Console renderer on a terminal, JSON lines otherwise. Under journald (JOURNAL_STREAM
set) each line is prefixed with its syslog priority (`<3>` …) so the journal stores
PRIORITY and strips the prefix.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog

PRIORITY = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}


class _JournalPrefix(logging.Formatter):
    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        prio = PRIORITY.get(record.levelname.lower(), 6)
        return f"<{prio}>" + self.inner.format(record)


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


def setup(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if hasattr(stream, "isatty") and stream.isatty() else "json"
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
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
    # Noisy libraries stay at warning: watchdog logs every inotify event at debug.
    for name in ("watchdog", "PIL", "urllib3", "asyncio"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.captureWarnings(True)
    # vLLM's own logger reaches the root handler instead of configuring its own.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
