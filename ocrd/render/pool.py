"""The render workers: `RenderPool` runs ocrd/render/pages.py's probing and rendering in
worker processes (PDFium is not thread-safe, and decoding is CPU work that must stay
off the event loop), and survives a worker that crashes or hangs on a hostile file.

The workers serve every file, and start clean for each: a call names its file (its
`DocumentWorkers`), and a worker that moves to another file first drops what the last
one left in it — its open documents and PDFium's whole state (errors, caches, fonts:
`pages.begin_document`). A worker that crashes fails only the call that crashed it:
the calls it took down with it are tried again, each alone in a worker of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ocrd import errors
from ocrd.render.pixels import SHARED_PREFIX, _init_worker, _remove_shared, _shared_dir_usable


def _warm() -> int:
    """Import the heavy modules once so the first real page is not slowed down."""
    import pypdfium2  # noqa: F401

    return os.getpid()


def _in_document(document: int, fn: Callable[..., Any], *args: Any) -> Any:
    """Worker side: `fn(*args)` for `document`, in a worker cleaned of any other's."""
    from ocrd.render.pages import begin_document

    begin_document(document)
    return fn(*args)


# ---------------------------------------------------------------------------------------
# Main-process side


def descriptors_short() -> OSError | None:
    """The OSError (EMFILE, ENFILE) an open would meet right now, or None."""
    try:
        os.close(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
    except OSError as e:
        if e.errno in errors.DAEMON_SHORTAGE:
            return e
    return None


def _raise_if_short() -> None:
    """A page that came back could not be taken in (its file not opened): the daemon's
    shortage broke the pool, not the file."""
    short = descriptors_short()
    if short is not None:
        raise short from None
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
    ProcessPoolExecutor; the pool is then rebuilt, and each call it broke is tried once
    more, alone in a worker of its own, before its file (or page) is blamed — the crash
    may have been another file's.
    """

    def __init__(self, workers: int, timeout: float = 300.0) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.timeout = timeout
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._generation = 0
        self._shared = _shared_dir_usable()
        # unique per pool object too: the daemon runs two pools (render and probe)
        self._tag = f"{os.getpid()}-{id(self):x}"
        self._documents = itertools.count(1)

    def _shared_prefix(self, generation: int | None = None) -> str:
        gen = "" if generation is None else f"{generation}-"
        return f"{SHARED_PREFIX}{self._tag}-{gen}"

    def _executor(self, workers: int, tag: str | None) -> concurrent.futures.ProcessPoolExecutor:
        with _sigint_blocked():  # its queues may start multiprocessing's tracker
            return concurrent.futures.ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker, initargs=(tag, os.getpid()))

    def _ensure(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            generation = self._generation + 1
            self._pool = self._executor(
                self.workers, f"{self._tag}-{generation}" if self._shared else None)
            self._generation = generation
        return self._pool

    def document(self) -> DocumentWorkers:
        """The workers as one file uses them: `async with pool.document() as workers`."""
        return DocumentWorkers(self, next(self._documents))

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
        _kill(pool)
        if self._shared:  # pages the killed workers wrote that nobody will read
            _remove_shared(self._shared_prefix(generation))

    async def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        """`fn(*args)` for a file of its own (one call: a probe of an inbox file)."""
        return await self.document().call(fn, *args, timeout=timeout)

    async def _call(self, document: int, fn: Callable[..., Any], args: tuple,
                    timeout: float | None) -> Any:
        limit = timeout or self.timeout
        pool = self._ensure()
        generation = self._generation
        try:
            return await _run(pool, document, fn, args, limit)
        except BrokenProcessPool:
            self._discard(generation)
            _raise_if_short()
        except TimeoutError:
            self._discard(generation)
            raise _too_long(limit) from None
        # Once more, alone: a worker that dies breaks every call of its pool, and the
        # crash may have been another call's; alone, a call that crashes again is
        # that call's own failure.
        alone = self._executor(1, f"{self._tag}-alone{document}" if self._shared else None)
        try:
            return await _run(alone, document, fn, args, limit)
        except BrokenProcessPool:
            _raise_if_short()
            raise errors.RenderFailed(
                "the renderer crashed on this file twice (a damaged or hostile "
                "file?)") from None
        except TimeoutError:
            raise _too_long(limit) from None
        finally:
            _kill(alone)
            if self._shared:
                _remove_shared(f"{SHARED_PREFIX}{self._tag}-alone{document}-")

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._shared:
            _remove_shared(self._shared_prefix())


class DocumentWorkers:
    """The pool as one file uses it: every call names the file, so that a worker that
    last served another file starts clean for this one."""

    def __init__(self, pool: RenderPool, document: int) -> None:
        self.pool = pool
        self.document = document

    async def __aenter__(self) -> DocumentWorkers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        """`fn(*args)` in a worker. Raises what `fn` raises (an unexpected exception as
        `errors.InternalError`), or RenderFailed when the worker crashed twice or took
        longer than the timeout."""
        return await self.pool._call(self.document, fn, args, timeout)


async def _run(executor: concurrent.futures.ProcessPoolExecutor, document: int,
               fn: Callable[..., Any], args: tuple, limit: float) -> Any:
    """The call's result; its OcrdError; BrokenProcessPool or TimeoutError for the
    caller to handle; any other exception as InternalError."""
    loop = asyncio.get_running_loop()
    try:
        with _sigint_blocked():  # submitting may start workers
            fut = loop.run_in_executor(executor, _in_document, document, fn, *args)
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


def _kill(executor: concurrent.futures.ProcessPoolExecutor) -> None:
    """A hung worker never returns: kill the processes, do not wait for them."""
    for proc in list((getattr(executor, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            proc.kill()
    executor.shutdown(wait=False, cancel_futures=True)
