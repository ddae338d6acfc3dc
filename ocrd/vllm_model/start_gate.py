"""One engine core at a time through vLLM's memory sizing, for servers sharing a GPU.

vLLM sizes an engine's KV cache from what its worker sees of the GPU's memory: a
snapshot when the device is set up, then the growth while it loads the weights, profiles
a forward pass and captures CUDA graphs. Another process allocating on the same GPU
meanwhile is counted as this engine's own use. Starting the
servers of a GPU one after another avoids that but takes each server's whole start time
in turn, most of it importing vLLM.

With this gate the servers start at once and only that section runs one at a time: the
engine core takes an exclusive lock (flock) on the file named by OCRD_VLLM_START_LOCK
before its executor sets up the device, and gives it back when its KV cache is
allocated and the model is compiled and warmed up (vLLM's `_initialize_kv_caches`).
The kernel drops the lock of a process that dies, so a crashed start never blocks the
others. The managed engine (ocrd/engines/vllm/managed.py) sets the variable, one file per
group of GPUs, only where its servers share a group and start together; the plugin
(plugin.py) installs the gate in every vLLM process that sees it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from typing import Any

WAITING_MARK = "ocrd start gate: waiting"
TAKEN_MARK = "ocrd start gate: taken"
RELEASED_MARK = "ocrd start gate: released"

# vLLM's logging routes "vllm.*" loggers to its handler (the server's output ocrd reads)
logger = logging.getLogger("vllm.ocrd.start_gate")

_lock = threading.Lock()
_held: dict[str, Any] = {}  # "fd", "since": the gate this process holds


def take(path: str) -> None:
    """Block until this process holds the gate at `path` (no-op if it already does)."""
    with _lock:
        if "fd" in _held:
            return
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        t0 = time.monotonic()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                logger.info("%s for another engine on these GPUs to size its memory (%s)",
                            WAITING_MARK, path)
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        _held.update(fd=fd, since=time.monotonic())
        logger.info("%s after %.1f s (pid %d)", TAKEN_MARK, time.monotonic() - t0,
                    os.getpid())


def release() -> None:
    """Give the gate back (no-op if this process does not hold it)."""
    with _lock:
        fd = _held.pop("fd", None)
        since = _held.pop("since", None)
        if fd is None:
            return
        # logged before the unlock: another engine's "taken" line comes after this one
        logger.info("%s after %.1f s (pid %d)", RELEASED_MARK,
                    time.monotonic() - (since or 0.0), os.getpid())
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def install(path: str) -> None:
    """Wrap vLLM's engine core so that its device setup, memory profiling, KV cache
    allocation and warm-up run inside the gate at `path`. Idempotent."""
    from vllm.v1.engine import core
    from vllm.v1.executor import abstract

    executor_init = abstract.Executor.__init__
    if getattr(executor_init, "_ocrd_start_gate", False):
        return
    initialize_kv_caches = core.EngineCore._initialize_kv_caches

    def gated_executor_init(self: Any, *args: Any, **kwargs: Any) -> None:
        take(path)
        try:
            executor_init(self, *args, **kwargs)
        except BaseException:
            release()
            raise

    def gated_initialize_kv_caches(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return initialize_kv_caches(self, *args, **kwargs)
        finally:
            release()

    gated_executor_init._ocrd_start_gate = True  # type: ignore[attr-defined]
    abstract.Executor.__init__ = gated_executor_init  # type: ignore[method-assign]
    core.EngineCore._initialize_kv_caches = gated_initialize_kv_caches  # type: ignore[method-assign]
