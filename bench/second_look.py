"""The tesseract engine's second look, its process's CPU counted: the benchmarks replace
the `subprocess.run` that the engine's look calls with one that runs the same command the
same way (its input on stdin, its output read whole) and adds the process's CPU seconds
(from its rusage) to the calling thread's count."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from types import SimpleNamespace
from typing import Any

from ocrd.engines import tesseract as tesseract_engine

_counts = threading.local()


def _run(args: list[str], input: bytes | None = None, timeout: float | None = None,  # noqa: A002
         env: dict[str, str] | None = None, **_: Any) -> subprocess.CompletedProcess:
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout:
        stdin.write(input or b"")
        stdin.seek(0)
        proc = subprocess.Popen(args, stdin=stdin, stdout=stdout, stderr=subprocess.DEVNULL,
                                env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        _counts.cpu = cpu() + usage.ru_utime + usage.ru_stime
        stdout.seek(0)
        return subprocess.CompletedProcess(args, os.waitstatus_to_exitcode(status),
                                           stdout.read(), b"")


def cpu() -> float:
    """CPU seconds of this thread's second looks so far."""
    return getattr(_counts, "cpu", 0.0)


def count() -> None:
    """From now on, count the second look's processes."""
    tesseract_engine.subprocess = SimpleNamespace(  # type: ignore[assignment]
        run=_run, SubprocessError=subprocess.SubprocessError)
