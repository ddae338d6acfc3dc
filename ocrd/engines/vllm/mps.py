"""CUDA MPS for managed `vllm serve` processes that share a GPU.

Without MPS a GPU runs one process's kernels at a time: the driver gives each process's
context its own time slices, so two engine cores on one GPU take turns even where the
kernels of one (a decode step's small kernels, at most a few of the 132 SMs busy) would
leave room for the other's. Under MPS (NVIDIA's Multi-Process Service: one
`nvidia-cuda-mps-server` per user and GPU, through which every client's kernels run)
their kernels share the SMs: two processes that each run kernels filling few SMs wait
for each other less than time-sliced (measured on an H200 with a probe and with ocrd's
servers, both ways).

ocrd runs one `nvidia-cuda-mps-control -f` per group of GPUs whose servers share it,
as its own child in its own session (with "die with my parent" set, like the servers),
in a private folder (0700) for its pipes and logs; the group's servers get
CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY, and no CUDA_VISIBLE_DEVICES: the
control daemon is started with the group's devices, and MPS numbers a client's devices
from those. The control daemon starts the MPS server when the first engine core asks
for one, as the user ocrd runs as (no root needed). A control daemon that exits is
started again in the same folder, for the servers that start after it. stop() asks it
to quit ("quit" through its pipe; it ends the MPS server) once the servers are gone,
then ends its process group and removes the folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import deque

import structlog

from ocrd.engines.vllm.supervised import DIE_WITH_PARENT, end_group, exited, kill_group

log = structlog.get_logger("ocrd.engines.vllm.managed")

CONTROL = "nvidia-cuda-mps-control"
# The control daemon's socket in its pipe folder: it listens once this exists.
SOCKET = "control"
START_TIMEOUT_SECONDS = 15.0
QUIT_TIMEOUT_SECONDS = 10.0
RESTART_BACKOFF_SECONDS = 1.0
RESTART_BACKOFF_MAX_SECONDS = 30.0
TAIL_LINES = 40

# As the servers' launcher (ocrd/engines/vllm/supervised.py): "die with my parent", then the
# control daemon in place of this Python (the setting survives exec).
_LAUNCHER = DIE_WITH_PARENT + """\
os.execvp(sys.argv[2], sys.argv[2:])
"""

# Variables a client (an engine core) needs, and the one it must not have.
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"


class MpsUnavailable(RuntimeError):
    """The control daemon could not be started (not installed, or it exited)."""


def find_control() -> list[str] | None:
    """The control program on PATH, or None."""
    path = shutil.which(CONTROL)
    return [path] if path else None


class MpsControl:
    """One `nvidia-cuda-mps-control -f` for the GPUs `devices` (CUDA_VISIBLE_DEVICES;
    None: ocrd's own environment's), kept running until stop()."""

    def __init__(self, devices: str | None, env: dict[str, str],
                 program: list[str] | None = None) -> None:
        self.devices = devices
        self.program = program
        self.name = "gpu" + (devices.replace(",", "+") if devices is not None else "")
        self.folder: str | None = None
        self.env = dict(env)
        self.proc: asyncio.subprocess.Process | None = None
        self.pgids: list[int] = []
        self.restarts = 0
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._reader: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._closing = False

    @property
    def pipe(self) -> str:
        assert self.folder is not None
        return os.path.join(self.folder, "pipe")

    @property
    def client_env(self) -> dict[str, str]:
        """What the group's servers add to their environment."""
        assert self.folder is not None
        return {PIPE_ENV: self.pipe, LOG_ENV: os.path.join(self.folder, "log")}

    async def start(self) -> None:
        """Start the control daemon and wait until it listens; MpsUnavailable if it
        cannot."""
        program = self.program or find_control()
        if program is None:
            raise MpsUnavailable(f"{CONTROL} not found on PATH")
        self.program = program
        self.folder = tempfile.mkdtemp(prefix="ocrd-mps-")  # 0700: nobody else's pipes
        os.mkdir(self.pipe, 0o700)
        os.mkdir(self.client_env[LOG_ENV], 0o700)
        self.env.update(self.client_env)
        if self.devices is not None:
            self.env["CUDA_VISIBLE_DEVICES"] = self.devices
        try:
            await self._launch()
        except BaseException:
            await self.stop()
            raise
        self._watcher = asyncio.create_task(self._watch(), name=f"mps-control-{self.name}")

    async def _launch(self) -> None:
        t0 = time.monotonic()
        self._tail.clear()
        with contextlib.suppress(FileNotFoundError):  # a dead daemon's socket
            os.unlink(os.path.join(self.pipe, SOCKET))
        assert self.program is not None
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _LAUNCHER, str(os.getpid()), *self.program, "-f",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env=self.env, start_new_session=True)
        except OSError as e:
            raise MpsUnavailable(f"{self.program[0]}: {e}") from e
        self.pgids.append(self.proc.pid)
        self._reader = asyncio.create_task(self._read_output(self.proc),
                                           name=f"mps-control-output-{self.name}")
        socket = os.path.join(self.pipe, SOCKET)
        while not os.path.exists(socket):
            if self.proc.returncode is not None or time.monotonic() - t0 > START_TIMEOUT_SECONDS:
                await asyncio.sleep(0.2)  # the last lines
                why = (f"exited with code {self.proc.returncode}"
                       if self.proc.returncode is not None
                       else f"did not listen within {START_TIMEOUT_SECONDS:g} s")
                raise MpsUnavailable(f"{self.program[0]} -f {why}: " + self.output_tail())
            await asyncio.sleep(0.05)
        log.info("vllm_mps_ready", gpus=self.devices, pid=self.proc.pid,
                 seconds=round(time.monotonic() - t0, 2), folder=self.folder,
                 restarts=self.restarts)

    def output_tail(self) -> str:
        lines = list(self._tail)
        control_log = os.path.join(self.folder or "", "log", "control.log")
        with contextlib.suppress(OSError), open(control_log, "rb") as f:
            lines += f.read().decode("utf-8", "replace").splitlines()[-10:]
        return "\n".join(lines) or "(no output)"

    async def _read_output(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                self._tail.append(text)
                log.info("vllm_mps", gpus=self.devices, pid=proc.pid, line=text)

    async def _watch(self) -> None:
        """Start the control daemon again whenever it exits, until stop()."""
        failed = 0
        while not self._closing:
            proc = self.proc
            assert proc is not None
            # (not proc.wait(): that also waits for the MPS server it started, which may
            # hold its output pipe)
            while not await exited(proc, 1.0):
                pass
            if self._closing:
                return
            log.error("vllm_mps_exited", gpus=self.devices, pid=proc.pid,
                      code=proc.returncode, output=self.output_tail())
            await self._end(proc, grace=2.0)
            await asyncio.sleep(min(RESTART_BACKOFF_MAX_SECONDS,
                                    RESTART_BACKOFF_SECONDS * 2 ** failed))
            if self._closing:
                return
            self.restarts += 1
            try:
                await self._launch()
                failed = 0
            except MpsUnavailable as e:
                failed += 1
                log.error("vllm_mps_restart_failed", gpus=self.devices, attempt=failed,
                          error=str(e)[:2000])

    async def _quit(self) -> None:
        """Ask the daemon to quit through its pipe, as `echo quit | CONTROL` does."""
        assert self.program is not None
        with contextlib.suppress(OSError):
            ui = await asyncio.create_subprocess_exec(
                *self.program, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                env=self.env, start_new_session=True)
            try:
                async with asyncio.timeout(QUIT_TIMEOUT_SECONDS):
                    await ui.communicate(b"quit\n")
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    ui.kill()
                await ui.wait()

    async def _end(self, proc: asyncio.subprocess.Process, grace: float) -> None:
        if proc.returncode is None:
            kill_group(proc.pid, signal.SIGTERM)
        await end_group(proc.pid, grace)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await proc.wait()

    async def stop(self) -> None:
        """Quit the daemon (after the servers have gone), end its process group and
        remove its folder."""
        self._closing = True
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher
        proc = self.proc
        if proc is not None:
            if proc.returncode is None:
                await self._quit()
                await exited(proc, QUIT_TIMEOUT_SECONDS)
            await self._end(proc, grace=QUIT_TIMEOUT_SECONDS)
            log.info("vllm_mps_stopped", gpus=self.devices, pid=proc.pid,
                     code=proc.returncode)
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                async with asyncio.timeout(5):
                    await self._reader
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
