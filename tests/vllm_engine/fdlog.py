"""This process's stdout and stderr into a file for a while: where an engine core that
vLLM spawns writes its log (the child inherits the descriptors), so a test can read it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def output_into(log: Path) -> Iterator[None]:
    """Descriptors 1 and 2 point at `log` (appended to) inside the block, and back after."""
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(log, "ab") as f:
            for fd in (1, 2):
                os.dup2(f.fileno(), fd)
            try:
                yield
            finally:
                for fd, old in zip((1, 2), saved, strict=True):
                    os.dup2(old, fd)
    finally:
        for old in saved:
            os.close(old)
