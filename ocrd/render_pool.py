"""The render workers: `RenderPool` runs ocrd/pages.py's probing and rendering in
worker processes (PDFium is not thread-safe, and decoding is CPU work that must stay
off the event loop), and survives a worker that crashes or hangs on a hostile file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from . import errors
from .pagepixels import SHARED_PREFIX, _init_worker, _remove_shared, _shared_dir_usable


def _warm() -> int:
    """Import the heavy modules once so the first real page is not slowed down."""
    import pypdfium2  # noqa: F401

    return os.getpid()


# ---------------------------------------------------------------------------------------
# Main-process side


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT held back in this thread while it may start worker processes: they start
    with it blocked (the signal mask survives fork and exec), so that Ctrl-C in a
    terminal, which reaches the whole process group, cannot kill a worker still starting
    up; the daemon stops its workers itself. A SIGINT meanwhile comes after."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class RenderPool:
    """Worker processes for probing and rendering.

    A worker that crashes (a segfault in a decoder) or hangs breaks the whole
    ProcessPoolExecutor; the pool is then rebuilt, and the call is tried once more on
    fresh workers before the file is blamed — the crash may have been another file's.
    """

    def __init__(self, workers: int, timeout: float = 300.0) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.timeout = timeout
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._generation = 0
        self._shared = _shared_dir_usable()
        # unique per pool object too: the daemon runs two pools (render and probe)
        self._tag = f"{os.getpid()}-{id(self):x}"

    def _shared_prefix(self, generation: int | None = None) -> str:
        gen = "" if generation is None else f"{generation}-"
        return f"{SHARED_PREFIX}{self._tag}-{gen}"

    def _ensure(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            generation = self._generation + 1
            tag = f"{self._tag}-{generation}" if self._shared else None
            with _sigint_blocked():  # its queues may start multiprocessing's tracker
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_worker, initargs=(tag, os.getpid()))
            self._generation = generation
        return self._pool

    async def start(self) -> None:
        if self._shared:  # page files a crashed daemon left behind
            await asyncio.to_thread(_remove_shared, SHARED_PREFIX, True)
        pool = self._ensure()
        loop = asyncio.get_running_loop()
        with _sigint_blocked():  # submitting starts the workers
            warming = [loop.run_in_executor(pool, _warm) for _ in range(self.workers)]
        await asyncio.gather(*warming)

    def _discard(self, generation: int) -> None:
        pool = self._pool
        if pool is None or generation != self._generation:
            return  # already rebuilt by someone else
        self._pool = None
        # A hung worker never returns: kill the processes, do not wait for them.
        for proc in list(getattr(pool, "_processes", {}).values()):
            with contextlib.suppress(Exception):
                proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        if self._shared:  # pages the killed workers wrote that nobody will read
            _remove_shared(self._shared_prefix(generation))

    async def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        loop = asyncio.get_running_loop()
        for attempt in (1, 2):
            pool = self._ensure()
            generation = self._generation
            try:
                with _sigint_blocked():  # submitting may start workers
                    fut = loop.run_in_executor(pool, fn, *args)
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancellation that races with the result
                async with asyncio.timeout(timeout or self.timeout):
                    return await fut
            except BrokenProcessPool:
                self._discard(generation)
                if attempt == 2:
                    raise errors.RenderFailed(
                        "the renderer crashed on this file twice (a damaged or hostile "
                        "file?)") from None
            except TimeoutError:
                self._discard(generation)
                raise errors.RenderFailed(
                    f"rendering took longer than {timeout or self.timeout:.0f} s and was "
                    "stopped") from None
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._shared:
            _remove_shared(self._shared_prefix())
