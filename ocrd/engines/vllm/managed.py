"""Local `vllm serve` processes, started and supervised by ocrd, fed over HTTP.

One vLLM front end prepares every page image on one CPU thread (resize, tiles,
normalisation), and inside ocrd that thread is the daemon's own. `vllm serve
--api-server-count N` runs N front-end processes around one engine core, so N pages are
prepared at once, outside ocrd (measured faster than the in-process engine on an H200). One
engine core's thread in turn cannot keep a big GPU busy (two servers on one H200 convert
more pages per second than one), so ocrd can run several: `servers_per_gpu` on each GPU (or
group of GPUs) of `engine.vllm.gpus`, each with its share of the GPU's memory and of the
front ends, its own port on 127.0.0.1 and CUDA_VISIBLE_DEVICES
(ocrd/engines/vllm/serve_args.py). The remote engine's client balances the pages across them
(the fewest in flight first).

start() returns as soon as one server answers /health: pages flow from then on, and
each other server joins as it comes to answer (a restart is a minute or more without
OCR otherwise, most of it spent waiting for the last server). A server that fails before
any answers fails the start; one that fails after is started again, as one that died
is. Every server starts at once: vLLM
sizes its KV cache from the memory free while it starts, so servers that share a GPU pass
that section one at a time through ocrd's start gate (a lock file per group of GPUs that
their engine cores take through ocrd's vLLM plugin: ocrd/vllm_model/start_gate.py), and
import vLLM meanwhile. Without the plugin (or with data parallelism, whose engine cores
set up their devices together) they start one after another. Each server is
supervised on its own (ocrd/engines/vllm/supervised.py): one that dies is started again while
the others keep converting (a restart takes its turn at the gate too); its pages in
flight are retried on the others by the client, and pages wait (EngineUnavailable) only
while no server is up. close() ends every server's process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections import Counter
from typing import Any

import structlog

from ocrd.config.engine import VllmConfig
from ocrd.config.settings import EngineConfig
from ocrd.engines import deepseek_ocr2
from ocrd.engines.base import Engine, PageRequest
from ocrd.engines.remote import RemoteEngine
from ocrd.engines.vllm.args import fast_encoder_usable
from ocrd.engines.vllm.mps import MpsControl, MpsUnavailable
from ocrd.engines.vllm.serve_args import (  # noqa: F401 - the tests' and bench's names
    ServerSpec,
    cli_args,
    head_dim_overrides,
    plan_servers,
    read_model_config,
    server_args,
)
from ocrd.engines.vllm.supervised import START_TIMEOUT_SECONDS, SupervisedServer, group_alive  # noqa: F401
from ocrd.errors import EngineDead, EngineUnavailable
from ocrd.outputs.page import PageOutput
from ocrd.vllm_model import plugin

log = structlog.get_logger(__name__)

# Pages in flight beyond max_num_seqs, per front end: pages being prepared while the
# engine's batch is full, so that a finished page is replaced at once.
QUEUE_PER_API_SERVER = 4


def priority_scheduling(cfg: EngineConfig) -> bool:
    """Whether the managed servers order their queues by the pages' priorities (vLLM's
    priority policy: ocrd's default, unless engine_args name another)."""
    return cfg.vllm.engine_args.get("scheduling_policy", "priority") == "priority"


def queue_per_server(v: VllmConfig, api_servers: int) -> int:
    """Pages each managed server holds beyond its batch: the config's, or 4 per front
    end."""
    return v.queue_per_server if v.queue_per_server is not None else (
        QUEUE_PER_API_SERVER * api_servers)


class ManagedServerEngine(Engine):
    """DeepSeek-OCR-2 on local `vllm serve` processes that this engine owns."""

    kind = "vllm"
    output_format = deepseek_ocr2.OUTPUT_FORMAT

    def __init__(self, cfg: EngineConfig, *, api_servers: int | None = None,
                 env: dict[str, str] | None = None,
                 program: list[str] | None = None,
                 start_gate: bool | None = None,
                 mps_program: list[str] | None = None) -> None:
        """`api_servers` overrides the config's; `env` adds to the servers' environment;
        `program` replaces the launcher of `vllm` (tests: a fake vLLM); `start_gate`:
        whether servers sharing GPUs start at once through the gate (default: where
        vLLM finds ocrd's plugin and each server has one engine core); `mps_program`
        replaces nvidia-cuda-mps-control (tests: a fake)."""
        if api_servers:
            cfg = cfg.model_copy(update={"vllm": cfg.vllm.model_copy(
                update={"api_servers": api_servers})})
        self.cfg = cfg
        self.model = cfg.model
        self.specs = plan_servers(cfg)
        self.api_servers = self.specs[0].api_servers  # per server
        self.url = self.specs[0].url
        self.env = env
        self.program = program
        self._client = RemoteEngine(cfg.model_copy(update={
            "kind": "remote", "remote": cfg.remote.model_copy(update={
                "urls": [s.url for s in self.specs],
                "concurrency_per_url": cfg.vllm.max_num_seqs,
                "queue_per_url": queue_per_server(cfg.vllm, self.api_servers)})}),
            recipe=deepseek_ocr2.DeepSeekOcr2(cfg),
            use_proxy=False,  # 127.0.0.1: never through a proxy
            send_priority=priority_scheduling(cfg))
        self.max_concurrency = self._client.max_concurrency
        self.servers: list[SupervisedServer] = []
        self._supervisors: list[asyncio.Task] = []
        self._supervised: set[SupervisedServer] = set()
        self._starting: asyncio.Future | None = None  # the first starts, while they run
        self._first_up = asyncio.Event()
        self._ready_once = False  # a server has answered: the engine is started
        self._closing = False
        self._hf_overrides: dict[str, Any] | None = None
        if start_gate is None:
            start_gate = plugin.installed() and cfg.vllm.data_parallel_size == 1
        self.start_gate = start_gate
        self._gate_dir: str | None = None
        self.mps_program = mps_program
        self.mps: dict[str | None, MpsControl] = {}  # per group of GPUs that has one

    # ---- what the tests and the benchmarks read ---------------------------------------

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self.servers)

    @property
    def pgids(self) -> list[int]:
        """Every process group any server had (in start order per server)."""
        return [pgid for s in self.servers for pgid in s.pgids]

    @property
    def start_seconds(self) -> list[float]:
        return [t for s in self.servers for t in s.start_seconds]

    @property
    def fast_encoder_loaded(self) -> bool:
        return any(s.fast_encoder_loaded for s in self.servers)

    # ---- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Start every server and return once one answers (a minute or more on a GPU);
        the others join as they come up. Each is supervised from its first answer."""
        model_config = await asyncio.to_thread(read_model_config, self.model)
        self._hf_overrides = head_dim_overrides(model_config)
        if model_config is None:
            log.warning("vllm_server_model_config_unread", model=self.model,
                        note="no head_dim guard: vLLM 0.24 on a GPU may crash, 0.32 is fine")
        fast_encoder_usable(self.cfg)  # warns if asked for but not installed
        # The server sets up vLLM's logging itself (ocrd's own process turns that off to
        # route vLLM through its handler): its lines reach ocrd's log as vllm_server.
        env = {**os.environ, "VLLM_CONFIGURE_LOGGING": "1",
               **plugin.environment(self.cfg.vllm.fast_encoder,
                                    self.cfg.vllm.batch_encoder,
                                    self.cfg.vllm.uint8_pixels),
               **(self.env or {})}
        # the front ends wait this long for their engine core, which may first wait for
        # the others' at the gate (vLLM's default, 600 s, is one cold start on a GPU)
        env.setdefault("VLLM_ENGINE_READY_TIMEOUT_S", str(int(START_TIMEOUT_SECONDS)))
        sharing = Counter(spec.devices for spec in self.specs)  # servers per GPU group
        gated = self.start_gate and max(sharing.values()) > 1
        if gated:  # private: a lock file elsewhere could be another user's link
            self._gate_dir = tempfile.mkdtemp(prefix="ocrd-vllm-start-")
        try:
            await self._start_mps(sharing, env)
        except BaseException:
            await self._stop_all()
            await self._client.close()
            raise
        self.servers = [
            SupervisedServer(spec, self.command(spec)[1:],
                             {**env, **self._gate_env(spec, sharing[spec.devices])},
                             self._client.probe_status, self.program,
                             mps=self.mps[spec.devices].client_env
                             if spec.devices in self.mps else None,
                             ready=self._server_ready)
            for spec in self.specs]
        groups: dict[str | None, list[SupervisedServer]] = {}
        for server in self.servers:
            groups.setdefault(server.spec.devices, []).append(server)
        log.info("vllm_servers_planned", servers=len(self.servers),
                 urls=[s.url for s in self.specs],
                 devices=[s.devices for s in self.specs],
                 api_servers_each=self.api_servers,
                 gpu_memory_utilization_each=self.specs[0].gpu_memory_utilization,
                 mps=sorted(str(d) for d in self.mps),
                 start="at once, through the start gate" if gated
                 else "one after another per GPU" if len(self.specs) > len(groups)
                 else "at once", ready="with the first server; the others join")
        self._starting = asyncio.ensure_future(asyncio.gather(
            *(self._start_group(group, at_once=gated) for group in groups.values())))
        try:
            while not any(s.up for s in self.servers) and not self._starting.done():
                self._first_up.clear()
                up = asyncio.ensure_future(self._first_up.wait())
                try:
                    await asyncio.wait([self._starting, up],
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    up.cancel()
            if self._starting.done():
                self._starting.result()  # a server that failed before any answered
            for server in self.servers:  # (mark before the probe: one may come up meanwhile)
                if not server.up:
                    self._client.server_starting(server.url)
            await self._client.start()  # checks that the servers serve cfg.model
        except BaseException:
            await self._stop_all()
            await self._stop_starting()
            await self._client.close()
            raise
        if not self._starting.done():
            log.info("vllm_servers_joining", up=sum(s.up for s in self.servers),
                     servers=len(self.servers))

    def _server_ready(self, server: SupervisedServer) -> None:
        """A server answers (its first start or a restart): pages go to it at once; from
        its first answer on, its supervisor keeps it running."""
        self._ready_once = True
        self._first_up.set()
        self._client.server_up(server.url)
        if server not in self._supervised:
            self._supervise(server)

    def _supervise(self, server: SupervisedServer) -> None:
        self._supervised.add(server)
        self._supervisors.append(asyncio.create_task(
            server.supervise(), name=f"vllm-server-supervisor-{server.spec.name}"))

    async def _stop_starting(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
            with contextlib.suppress(BaseException):
                await self._starting

    async def _start_mps(self, sharing: Counter, env: dict[str, str]) -> None:
        """An MPS control daemon for each group of GPUs that servers share (mps null) or
        for every group (mps true); none with mps false. Where it cannot start: an
        error with mps true, a warning and time-sliced servers with mps null."""
        wanted = self.cfg.vllm.mps
        for devices, servers in sharing.items():
            if wanted is False or (wanted is None and servers < 2):
                continue
            control = MpsControl(devices, env, self.mps_program)
            try:
                await control.start()
            except MpsUnavailable as e:
                if wanted:
                    raise EngineDead(f"engine.vllm.mps is true, but CUDA MPS did not "
                                     f"start for GPUs {devices or '(all)'}: {e}") from e
                log.warning("vllm_mps_unavailable", gpus=devices, error=str(e)[:2000],
                            note="the servers sharing these GPUs take turns on them "
                                 "(time-sliced); engine.vllm.mps: false silences this")
                continue
            self.mps[devices] = control

    def _gate_env(self, spec: ServerSpec, sharing: int) -> dict[str, str]:
        """The start gate's variable for a server whose GPUs `sharing` servers share."""
        if self._gate_dir is None or sharing < 2:
            return {}
        name = "gpus-" + (spec.devices or "all").replace(",", "+") + ".lock"
        return {plugin.START_LOCK_ENV: os.path.join(self._gate_dir, name)}

    async def _start_group(self, servers: list[SupervisedServer], at_once: bool) -> None:
        if at_once:  # their engine cores take turns at the gate
            await asyncio.gather(*(self._first_start(server) for server in servers))
            return
        for server in servers:  # one after another on the same GPUs
            await self._first_start(server)

    async def _first_start(self, server: SupervisedServer) -> None:
        """A server's first start. One that fails before any server answers fails the
        engine's start; one that fails after is started again (and, failing every time,
        is dead, as a server that dies and never comes back)."""
        try:
            await server.start()
        except EngineDead as e:
            if not self._ready_once or self._closing or server.closing:
                raise
            log.error("vllm_server_start_failed", server=server.spec.name, error=str(e)[:2000])
            # (the next of a group starts once this one answers, or is given up)
            await server.start_again(failed_starts=1)

    def command(self, spec: ServerSpec | None = None) -> list[str]:
        """What runs for a server (the first by default): `vllm serve MODEL FLAGS...`."""
        spec = spec or self.specs[0]
        return ["vllm", *server_args(self.cfg, spec.port, spec.api_servers,
                                     self._hf_overrides, spec.gpu_memory_utilization)]

    async def close(self) -> None:
        """Stop taking pages, cut the requests in flight, and end every server's process
        group (SIGTERM, then SIGKILL)."""
        self._closing = True
        await self._client.close()
        for server in self.servers:  # a server still starting stops waiting
            server.closing = True
        await self._stop_starting()
        supervisors, self._supervisors = self._supervisors, []
        for task in supervisors:
            task.cancel()
        for task in supervisors:
            with contextlib.suppress(BaseException):
                await task
        await self._stop_all()

    async def _stop_all(self) -> None:
        for server in self.servers:
            server.closing = True
        await asyncio.gather(*(s.stop_process() for s in self.servers))
        controls, self.mps = list(self.mps.values()), {}
        await asyncio.gather(*(c.stop() for c in controls))  # after their clients
        if self._gate_dir is not None:
            shutil.rmtree(self._gate_dir, ignore_errors=True)
            self._gate_dir = None

    def _dead(self) -> str | None:
        return next((s.dead for s in self.servers if s.dead is not None), None)

    async def health(self) -> bool:
        """A server runs, and the client has one that is not sick (hung: see
        RemoteEngine.sick_server_or_hard_page)."""
        return (not self._closing and self._dead() is None
                and any(s.up for s in self.servers) and self._client.has_well_server())

    def describe(self) -> dict:
        info = super().describe()
        info.update(api_servers=self.api_servers, server=self.url,
                    servers=[s.url for s in self.specs],
                    dtype=self.cfg.vllm.dtype, max_model_len=self.cfg.vllm.max_model_len,
                    max_num_seqs=self.cfg.vllm.max_num_seqs,
                    fast_encoder=self.fast_encoder_loaded, mps=bool(self.mps))
        if self._hf_overrides:
            info["hf_overrides"] = self._hf_overrides
        return info

    # ---- pages ----------------------------------------------------------------------

    async def ocr(self, page: PageRequest) -> PageOutput:
        dead = self._dead()
        if dead is not None:
            raise EngineDead(dead)
        if self._closing:
            raise EngineUnavailable("the local vLLM servers are shutting down")
        if not any(s.up for s in self.servers):
            raise EngineUnavailable("the local vLLM servers are (re)starting")
        # a server that is down refuses the connection: the client tries another one
        out = await self._client.ocr(page)
        out.extra["engine"] = self.kind
        out.extra["api_servers"] = self.api_servers
        return out
