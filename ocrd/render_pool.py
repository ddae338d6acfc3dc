"""The render workers: `RenderPool` runs ocrd/pages.py's probing and rendering in
worker processes (PDFium is not thread-safe, and decoding is CPU work that must stay
off the event loop), and survives a worker that crashes or hangs on a hostile file.

Every file gets workers of its own (`RenderPool.document()`), forked from a server
process that has imported the renderers and opened no document: no library state
(PDFium's last error, its caches and fonts, a heap a hostile file left damaged) goes
from one file to the next, and a worker that crashes takes down only its own file's
pages. The workers of all files together run at most `workers` calls at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from . import errors
from .pagepixels import SHARED_PREFIX, _init_worker, _remove_shared, _shared_dir_usable

# What the fork server imports once, so that a file's workers start in milliseconds.
PRELOAD = ["ocrd.pages", "ocrd.previews", "ocrd.textpdf"]


def _warm() -> int:
    """Import the heavy modules once so the first real page is not slowed down."""
    import pypdfium2  # noqa: F401

    return os.getpid()


def _context() -> multiprocessing.context.BaseContext:
    """Workers forked from a fork server (one per ocrd process, started on first use)
    where the platform has one; spawned where it has not."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


# ---------------------------------------------------------------------------------------
# Main-process side


class RenderPool:
    """Worker processes for probing and rendering, made fresh for every file.

    `document()` gives one file its workers; `call()` runs one call in workers of its own
    (a probe of a file in an inbox). A worker that crashes (a segfault in a decoder)
    breaks only that file's workers: they are made anew, and the call is tried once
    more, alone in a worker of its own, before the file (or the page) is blamed.
    """

    def __init__(self, workers: int, timeout: float = 300.0) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.timeout = timeout
        self._shared = _shared_dir_usable()
        # unique per pool object too: the daemon runs two pools (render and probe)
        self._tag = f"{os.getpid()}-{id(self):x}"
        self._seq = itertools.count(1)
        self._running: asyncio.Semaphore | None = None
        self._open: set[DocumentWorkers] = set()

    def _shared_prefix(self) -> str:
        return f"{SHARED_PREFIX}{self._tag}-"

    def running(self) -> asyncio.Semaphore:
        """Calls running now, all files together: at most `workers`."""
        if self._running is None:
            self._running = asyncio.Semaphore(self.workers)
        return self._running

    def document(self) -> DocumentWorkers:
        """Workers for one file, used as `async with pool.document() as workers:`."""
        tag = f"{self._tag}-{next(self._seq)}" if self._shared else None
        return DocumentWorkers(self, tag)

    async def start(self) -> None:
        if self._shared:  # page files a crashed daemon left behind
            await asyncio.to_thread(_remove_shared, SHARED_PREFIX, True)
        await self.call(_warm)  # starts the fork server, which imports the renderers

    async def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        """`fn(*args)` in a worker of its own."""
        async with self.document() as workers:
            return await workers.call(fn, *args, timeout=timeout)

    async def close(self) -> None:
        for workers in list(self._open):
            await workers.close()
        if self._shared:
            _remove_shared(self._shared_prefix())


class DocumentWorkers:
    """The worker processes of one file: started as its calls need them (up to the
    pool's `workers`), gone when the file is done."""

    def __init__(self, pool: RenderPool, tag: str | None) -> None:
        self.pool = pool
        self.tag = tag
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._generation = 0

    async def __aenter__(self) -> DocumentWorkers:
        self.pool._open.add(self)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _new(self, workers: int) -> concurrent.futures.ProcessPoolExecutor:
        tag = f"{self.tag}-{self._generation}" if self.tag else None
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=workers, mp_context=_context(),
            initializer=_init_worker, initargs=(tag, os.getpid()))

    def _ensure(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._executor is None:
            self._generation += 1
            self._executor = self._new(self.pool.workers)
        return self._executor

    async def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        """`fn(*args)` in one of this file's workers. Raises what `fn` raises (an
        unexpected exception as `errors.InternalError`), or RenderFailed when the worker
        crashed twice or took longer than the timeout."""
        limit = timeout or self.pool.timeout
        async with self.pool.running():
            executor = self._ensure()
            try:
                return await _run(executor, fn, args, limit)
            except BrokenProcessPool:
                self._discard(executor)
            except TimeoutError:
                self._discard(executor)
                raise _too_long(limit) from None
            # Tried once more in a worker of its own: the crash may have been another
            # call's (a worker that dies breaks every call of its executor).
            alone = self._new(1)
            try:
                return await _run(alone, fn, args, limit)
            except BrokenProcessPool:
                raise errors.RenderFailed(
                    "the renderer crashed on this file twice (a damaged or hostile "
                    "file?)") from None
            except TimeoutError:
                raise _too_long(limit) from None
            finally:
                _kill(alone)

    def _discard(self, executor: concurrent.futures.ProcessPoolExecutor) -> None:
        if self._executor is executor:
            self._executor = None
        _kill(executor)
        if self.tag:  # pages the killed workers wrote that nobody will read
            _remove_shared(f"{SHARED_PREFIX}{self.tag}-{self._generation}-")

    async def close(self) -> None:
        """Let the workers go and wait for them to exit: none is left behind."""
        executor, self._executor = self._executor, None
        try:
            if executor is not None:
                procs = _processes(executor)
                executor.shutdown(wait=False, cancel_futures=True)
                await asyncio.to_thread(_join, procs)
        finally:
            self.pool._open.discard(self)
            if self.tag:
                _remove_shared(f"{SHARED_PREFIX}{self.tag}-")


async def _run(executor: concurrent.futures.ProcessPoolExecutor, fn: Callable[..., Any],
               args: tuple, limit: float) -> Any:
    """The call's result; its OcrdError; BrokenProcessPool or TimeoutError for the
    caller to handle; any other exception as InternalError."""
    loop = asyncio.get_running_loop()
    try:
        fut = loop.run_in_executor(executor, fn, *args)
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
        # that races with the result
        async with asyncio.timeout(limit):
            return await fut
    except (errors.OcrdError, BrokenProcessPool, TimeoutError, asyncio.CancelledError):
        raise
    except Exception as e:  # noqa: BLE001 - a worker's surprise is its file's failure
        raise errors.internal(e, "reading the file in a render worker") from None


def _too_long(limit: float) -> errors.RenderFailed:
    return errors.RenderFailed(f"rendering took longer than {limit:.0f} s and was stopped")


def _processes(executor: concurrent.futures.ProcessPoolExecutor) -> list[Any]:
    return list((getattr(executor, "_processes", None) or {}).values())


def _kill(executor: concurrent.futures.ProcessPoolExecutor) -> None:
    """A hung worker never returns: kill the processes, do not wait for them."""
    for proc in _processes(executor):
        with contextlib.suppress(Exception):
            proc.kill()
    executor.shutdown(wait=False, cancel_futures=True)


def _join(procs: list[Any], grace: float = 10.0) -> None:
    """Wait for workers told to stop; kill one that does not within `grace` seconds."""
    for proc in procs:
        proc.join(grace)
        if proc.exitcode is None:
            proc.kill()
            proc.join(5)
