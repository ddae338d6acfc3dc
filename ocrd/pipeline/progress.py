"""What `ocrd convert` tells the person at the terminal, on stderr: one line per finished
file and, on a terminal, a counter line redrawn in place. Log events go to the same
stream through `lines()`, each a whole line of its own: the counter line is cleared
before one is written and drawn again after, so the two never run into each other.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TextIO

CLEAR = "\r\x1b[K"  # back to the line's start, erase to its end


class Progress:
    def __init__(self, total: int, enabled: bool, stream: TextIO | None = None) -> None:
        self.total = total
        self.count = 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.lock = threading.Lock()  # engine and library threads log too
        self._bar_shown = False

    def _bar(self) -> str:
        width = 20
        filled = int(width * self.count / max(1, self.total))
        return f"[{'#' * filled}{'.' * (width - filled)}] {self.count}/{self.total} files"

    def write_line(self, text: str) -> None:
        """A whole line (or lines) above the counter line; the caller holds the lock."""
        if self.tty and self._bar_shown:
            text = CLEAR + text
        self.stream.write(text if text.endswith("\n") else text + "\n")
        self._bar_shown = False
        if self.tty and self.enabled and self.count < self.total:
            self.stream.write(self._bar())
            self._bar_shown = True
        self.stream.flush()

    def start(self) -> None:
        if self.tty and self.enabled:
            with self.lock:
                self.stream.write(self._bar())
                self._bar_shown = True
                self.stream.flush()

    def done(self, path: Path, text: str) -> None:
        with self.lock:
            self.count += 1
            if self.enabled:
                self.write_line(f"{self.count}/{self.total} {path}: {text}")
            elif text.startswith("FAILED"):
                self.write_line(f"{path}: {text}")

    def finish(self) -> None:
        with self.lock:
            if self._bar_shown:
                self.stream.write(CLEAR)
                self.stream.flush()
                self._bar_shown = False

    def lines(self) -> LogLines:
        """A stream for the log handler that writes through this progress display."""
        return LogLines(self)


class LogLines:
    """A text stream whose writes come out as whole lines above the counter line (the
    logging handler writes a record and its newline in one call; a partial line is held
    until its end arrives)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self._partial = ""

    def write(self, text: str) -> int:
        with self.progress.lock:
            self._partial += text
            whole, sep, self._partial = self._partial.rpartition("\n")
            if sep:
                self.progress.write_line(whole + "\n")
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self.progress.tty
