"""The daemon's life: start the engine, watch the inboxes, convert, and stop cleanly —
telling systemd the truth at every step.

    serve():  install signal handlers → startup() → main_loop() → shutdown()

SIGTERM/SIGINT ask for a graceful stop (no new claims, pages in flight finish within
the drain timeout, the rest stay claimed for the next start); a second one forces it.
SIGHUP reloads the inbox settings without touching the engine.

The parts that do the work are made once, in `Parts.build` (wiring.py), and each lives in
its own module, in the order a file meets them: intake/loop.py (scans, hints, the readiness
check) → intake/claims.py → pipeline/schedule.py → pipeline/jobs.py → pipeline/document.py →
work/outcomes.py; work/recovery.py at start; service/systemd.py for systemd.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import signal
import sys
import time
from pathlib import Path

import structlog

from ocrd import __version__, errors, names
from ocrd.config.folders import layout_problems
from ocrd.config.load import load_config
from ocrd.config.roots import Roots, configured
from ocrd.config.settings import Config, ConfigError
from ocrd.engines import create_engine
from ocrd.engines import preflight as engine_preflight
from ocrd.engines.base import Engine
from ocrd.intake.inboxes import Inbox
from ocrd.intake.waiting import waiting_files
from ocrd.live import InboxLive, Live, LiveStatus
from ocrd.pipeline.source import converting_files
from ocrd.render.pool import RenderPool
from ocrd.service.metrics import HealthServer, Metrics
from ocrd.service.systemd import Heartbeat, Liveness, Notifier
from ocrd.service.wiring import Parts
from ocrd.web import Console
from ocrd.work.recovery import Recovery, prepare_inbox
from ocrd.work.state import StateError, StateFolder

log = structlog.get_logger("ocrd.service")


class Daemon:
    def __init__(self, cfg: Config, config_path: Path | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.notifier = Notifier()
        self.liveness = Liveness(cfg.schedule.page_timeout_seconds)
        self.metrics = Metrics()
        self.should_exit = False
        self.force_exit = False
        self.exit_code = 0
        self.ready = False
        self.engine: Engine | None = None
        self.health: HealthServer | None = None
        self.console: Console | None = None  # the web console (ocrd/web/)
        self.heartbeat: Heartbeat | None = None
        self.state_folder: StateFolder | None = None
        self.pools: tuple[RenderPool, RenderPool] | None = None
        self.parts: Parts | None = None
        # every configured folder, pinned at start and at each reload (config/roots.py)
        self.roots = Roots()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    # -- the life ----------------------------------------------------------------------

    async def serve(self) -> int:
        self._install_signals()
        try:
            await self.startup()
            if not self.should_exit:
                await self.main_loop()
        except errors.EngineDead as e:
            log.error("engine_dead", error=str(e))
            self.exit_code = 1
        finally:
            await self.shutdown()
        return self.exit_code

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_exit_signal, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, self._on_exit_signal, "SIGINT")
        loop.add_signal_handler(signal.SIGHUP, self._on_reload_signal)

    def _on_exit_signal(self, name: str) -> None:
        if self.should_exit:
            log.warning("forced_exit", signal=name)
            self.force_exit = True
        else:
            log.info("stop_requested", signal=name)
            self.should_exit = True
            # At once, not after the engine has loaded: systemd shows "deactivating".
            self.notifier.send("STOPPING=1", "STATUS=stopping")
        self._stop.set()

    def _on_reload_signal(self) -> None:
        # Only a running daemon reloads: before READY=1 there is nothing to reload yet,
        # and a READY=1 after STOPPING=1 would tell systemd we are running again.
        if not self.ready or self.should_exit:
            log.warning("reload_ignored", why="stopping" if self.should_exit else "starting")
            return
        self._tasks.append(asyncio.create_task(self._reload_reporting(), name="reload"))

    def engine_dead(self, e: errors.EngineDead) -> None:
        """The engine is gone for good: stop, leaving its files claimed; exit 1 so
        that systemd restarts the daemon."""
        log.error("engine_dead", error=str(e))
        self.exit_code = 1
        self.should_exit = True
        self._stop.set()

    async def startup(self) -> None:
        cfg = self.cfg
        self.state_folder = state_folder = StateFolder.open(cfg.state_dir)
        self._pin(cfg)
        self._start_health()
        self.console = Console.start(cfg, LiveStatus(asyncio.get_running_loop(), self._live),
                                     self.roots)
        self.notifier.send("STATUS=starting the render workers")
        self.pools = (RenderPool(cfg.render.workers), RenderPool(1, timeout=120))
        await asyncio.gather(*(pool.start() for pool in self.pools))
        self.engine = create_engine(cfg.engine)
        if self.engine.kind != "vllm":
            _keep_rss_near_live_memory()
        self.metrics.build.info({"version": __version__, "engine": self.engine.kind,
                                 "model": self.engine.model})
        await self._start_engine()
        if self.should_exit:
            return
        self.metrics.engine_ready.set(1)
        self.parts = parts = Parts.build(
            self.cfg, state_folder, self.engine, self.pools, metrics=self.metrics,
            liveness=self.liveness, roots=self.roots, engine_dead=self.engine_dead)
        for box in cfg.inboxes:
            await self._prepare(parts.inboxes.add(box))
        recovery = Recovery(state_folder.journal, parts.inboxes.by_path, parts.outcomes,
                            state_folder.path, state_folder.fresh)
        for resume in await recovery.run():
            parts.submit(resume.item, resume.exclusive)
        if self.should_exit:
            return
        # What start made (modules, settings, the engine) lives as long as the daemon:
        # out of the collector's way, a full collection walks only what pages make, and
        # does not hold up the event loop for the whole heap.
        gc.collect()
        gc.freeze()
        self.liveness.loop_turned()
        self.ready = True
        self.notifier.send("READY=1", f"STATUS=ready; watching {len(parts.inboxes)} inbox(es)")
        log.info("ready", inboxes=[str(i.path) for i in parts.inboxes], engine=self.engine.kind,
                 pages_in_flight=parts.slots.n, memory_budget_bytes=parts.converter.memory.total)

    def _pin(self, cfg: Config) -> None:
        """Pin every configured folder as it is now (config/roots.py)."""
        for path, (old, new) in self.roots.pin(configured(cfg), cfg.required_mounts).items():
            if new.real != path or not new.pinned:
                log.info("folder_pinned", path=str(path), resolved=str(new.real),
                         there=new.pinned, mount=str(new.mount) if new.mount else None)
            if old is not None and old.pinned and new.pinned and old.ident != new.ident:
                log.warning("folder_pinned_anew", path=str(path), resolved=str(new.real),
                            why="the folder there now is not the one pinned before; this "
                            "reload accepts it")

    def _start_health(self) -> None:
        if not self.cfg.metrics.listen:
            return
        # ListenError (a ConfigError) when it cannot bind: the daemon does not start
        self.health = HealthServer(self.metrics, self.cfg.metrics.listen, live=self._is_live,
                                   ready=lambda: self.ready, why=lambda: self.notifier.status)
        self.health.start()
        log.info("metrics_listening", address=self.health.address)

    async def _prepare(self, inbox: Inbox) -> None:
        """A new inbox: its work area marked as this daemon's, and what a crash of this
        daemon left in its destinations swept away (work/recovery.py)."""
        assert self.state_folder is not None
        self._tasks.append(asyncio.create_task(asyncio.to_thread(
            prepare_inbox, inbox, self.state_folder.path), name="prepare-inbox"))

    async def _start_engine(self) -> None:
        """Load the engine; while it loads (minutes for a real model) keep extending
        systemd's start timeout and say so in STATUS."""
        assert self.engine is not None
        self.notifier.send(f"STATUS=loading the {self.engine.kind} engine ({self.engine.model})")
        t0 = time.monotonic()
        start = asyncio.create_task(self.engine.start(), name="engine-start")
        while True:
            done, _ = await asyncio.wait({start}, timeout=10)
            if done:
                start.result()
                break
            if self.force_exit:
                start.cancel()
                raise errors.EngineDead("stopped while the engine was loading")
            self.notifier.send("EXTEND_TIMEOUT_USEC=30000000",
                               f"STATUS=loading the {self.engine.kind} engine "
                               f"({time.monotonic() - t0:.0f} s)")
        log.info("engine_started", engine=self.engine.kind, model=self.engine.model,
                 seconds=round(time.monotonic() - t0, 2))

    async def main_loop(self) -> None:
        parts = self.parts
        assert parts is not None
        self.heartbeat = heartbeat = Heartbeat(
            self.notifier, self.liveness, lambda: parts.outcomes.done_pages, parts.status_line)
        watched = [
            asyncio.create_task(parts.scheduler.run(), name="scheduler"),
            asyncio.create_task(parts.intake.run(lambda: parts.scheduler.queued,
                                                 lambda: len(parts.scheduler.active)),
                                name="intake"),
        ]
        self._tasks += [*watched, asyncio.create_task(heartbeat.run(), name="heartbeat")]
        stop = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait([stop, *watched], return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not stop and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        stop.cancel()

    async def shutdown(self) -> None:
        self.ready = False
        self.notifier.send("STOPPING=1", "STATUS=draining")
        if self.parts is not None:
            await self._drain(self.parts)
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            _, stuck = await asyncio.wait(list(self._tasks), timeout=10)
            for task in stuck:
                log.error("task_did_not_stop", task=task.get_name())
        if self.engine is not None:
            self.notifier.send("STATUS=closing the engine")
            try:
                async with asyncio.timeout(60):
                    await self.engine.close()
            except Exception as e:  # noqa: BLE001 - shutting down regardless
                log.warning("engine_close_failed", error=str(e))
        for pool in self.pools or ():
            await pool.close()
        if self.health is not None:
            self.health.stop()
        if self.console is not None:
            self.console.stop()
        self.roots.close()
        if self.state_folder is not None:
            with contextlib.suppress(Exception):
                left = self.state_folder.journal.counts()
                log.info("stopped", left_claimed=sum(left.get(s, 0) for s in
                                                     ("claimed", "converting", "finishing")))
            self.state_folder.journal.close()

    async def _drain(self, parts: Parts) -> None:
        """No new claims; pages in flight finish within drain_timeout_seconds (0: stop
        now), unless the engine is unavailable (then none can: stop now); what is left
        stays claimed for the next start."""
        scheduler = parts.scheduler
        log.info("draining", active=len(scheduler.active), queued=scheduler.queued)
        await parts.intake.stop()
        # a drain longer than the loop's stall threshold must not cost the watchdog's pings
        self.liveness.loop_stopped()
        parts.inboxes.stop()
        parts.outcomes.cancel_pending()
        scheduler.accepting = False
        timeout = self.cfg.drain_timeout_seconds
        if not self.force_exit and scheduler.active and timeout > 0:
            drain = asyncio.create_task(scheduler.drain(timeout))
            forced = asyncio.create_task(self._wait_forced())
            outage = asyncio.create_task(parts.converter.gate.closed.wait())
            done, _ = await asyncio.wait({drain, forced, outage},
                                         return_when=asyncio.FIRST_COMPLETED)
            if outage in done and drain not in done:
                log.info("drain_cut", why="the engine is unavailable: no page can finish",
                         active=len(scheduler.active))
            for task in (drain, forced, outage):
                task.cancel()
        for task in list(scheduler.active):
            task.cancel()
        if scheduler.active:
            await asyncio.wait(list(scheduler.active), timeout=10)

    async def _wait_forced(self) -> None:
        while not self.force_exit:
            self._stop.clear()
            await self._stop.wait()

    # -- reload -------------------------------------------------------------------------

    async def _reload_reporting(self) -> None:
        """reload(), and READY=1 even when it fails half-way: after RELOADING=1 systemd
        shows the unit as reloading until READY=1 comes."""
        try:
            await self.reload()
        except Exception as e:  # noqa: BLE001 - the daemon keeps running
            log.exception("reload_failed", error=repr(e))
            self.notifier.send("READY=1", "STATUS=reload failed; see the log")

    async def reload(self) -> None:
        parts = self.parts
        assert parts is not None and self.state_folder is not None
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            if self.config_path is None:
                raise ConfigError("no config file to reload")
            new = await asyncio.to_thread(load_config, self.config_path)
            problems = await asyncio.to_thread(layout_problems, new)
            if problems:
                raise ConfigError("; ".join(problems))
        except ConfigError as e:
            log.error("reload_failed", error=str(e), kept="the running configuration")
            self.notifier.send("READY=1", "STATUS=reload failed; running configuration kept")
            return
        if new.engine != self.cfg.engine or new.render != self.cfg.render or \
                new.state_dir != self.cfg.state_dir:
            log.warning("restart_needed", reason="engine, render or state_dir settings "
                        "changed; they apply at the next start")
        self.cfg = new.model_copy(update={"engine": self.cfg.engine,
                                          "render": self.cfg.render,
                                          "state_dir": self.cfg.state_dir})
        self._pin(self.cfg)
        for inbox in parts.inboxes.reload(self.cfg.inboxes):
            await self._prepare(inbox)
        parts.apply(self.cfg)
        if self.console is not None:
            self.console.update_config(self.cfg)
        parts.inboxes.wake.set()
        log.info("reloaded", inboxes=[str(i.path) for i in parts.inboxes])
        self.notifier.send("READY=1",
                           f"STATUS=reloaded; watching {len(parts.inboxes)} inbox(es)")

    # -- liveness -----------------------------------------------------------------------

    def _is_live(self) -> bool:
        """The main loop turns, and pages given to the engine come back (service/systemd.py).
        Before the main loop runs (engine loading) and while stopping: live."""
        return not self.ready or self.liveness.live()

    def _live(self) -> Live:
        """The console's view of what only the daemon knows (ocrd/live.py); runs on
        this loop, called through LiveStatus from the console's thread."""
        parts, engine, now = self.parts, self.engine, time.monotonic()
        life = "stopping" if self.should_exit else "ready" if self.ready else "starting"
        kind, model = (engine.kind, engine.model) if engine else \
            (self.cfg.engine.kind, self.cfg.engine.model)
        if parts is None:  # the engine is still loading
            return Live(life, kind, model, False, 0, 0.0, 0, 0, 0, version=__version__)
        engine_open = parts.converter.gate.open.is_set()
        wall = time.time()
        return Live(
            state=life, engine_kind=kind, engine_model=model,
            engine_ready=life == "ready" and engine_open,
            pages_done=parts.outcomes.done_pages,
            pages_per_second=self.heartbeat.rate(now) if self.heartbeat else 0.0,
            pages_in_flight=parts.slots.used, queued=parts.scheduler.queued,
            converting=len(parts.scheduler.active),
            inboxes=tuple(_inbox_live(i, engine_open, now, wall, parts.intake.queued_ahead)
                          for i in parts.inboxes),
            converting_files=converting_files(parts.converter.documents.values(), wall),
            version=__version__)


def _inbox_live(inbox: Inbox, engine_open: bool, now: float, wall: float,
                queued_ahead: int = 0) -> InboxLive:
    """One inbox as the console and `ocrd status` show it."""
    unread = inbox.unread
    return InboxLive(names.shown(str(inbox.path)), inbox.watch, inbox.available,
                     len(inbox.tracker), inbox.paused_why is not None,
                     names.printable(inbox.paused_why or "") or None,
                     waiting_files(inbox, engine_open, now, wall, queued_ahead=queued_ahead),
                     unread=unread.files if unread else 0,
                     unread_first=names.shown(unread.first) if unread and unread.first
                     else None,
                     unread_complete=unread.complete if unread else True)


def _keep_rss_near_live_memory() -> None:
    """Page images (megabytes each) are allocated and freed all the time. After the
    first such free glibc raises its mmap threshold and serves them from its heaps, which
    keep freed memory: the daemon's RSS then sat well above what was live on a long PDF
    (the suite's memory cases). A fixed threshold keeps large buffers
    mmapped, returned to the system when freed. Not with the in-process vLLM engine: its
    image processing is the bottleneck there, and would pay page faults for every tensor."""
    import ctypes

    m_mmap_threshold = -3
    try:
        ctypes.CDLL(None).mallopt(m_mmap_threshold, 1 << 20)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


# the soft descriptor limit is raised at most this far (a container's hard limit may be
# "infinity", or a billion)
MOST_DESCRIPTORS = 1 << 20


def raise_descriptor_limit() -> tuple[int, int]:
    """The soft RLIMIT_NOFILE raised to the hard one (systemd's default soft limit,
    1,024, is for programs that use select(); ocrd does not). Returns (soft, hard)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MOST_DESCRIPTORS if hard == resource.RLIM_INFINITY else \
        min(hard, MOST_DESCRIPTORS)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as e:
            log.warning("descriptor_limit_not_raised", soft=soft, hard=hard, error=str(e))
    return soft, hard


def run(config_path: Path) -> int:
    # A watchdog timeout ends in SIGABRT: print every thread's stack first, so the
    # journal shows where the daemon hung.
    faulthandler.enable()
    soft, hard = raise_descriptor_limit()
    log.info("descriptor_limit", soft=soft, hard=hard)
    cfg = load_config(config_path)
    # what check-config finds too: overlapping folders, an engine that cannot start here
    # (a tesseract language without its data); a restart would not mend them
    problems = layout_problems(cfg) + engine_preflight(cfg.engine)
    if problems:
        log.error("config_unusable", problems=problems,
                  hint="`ocrd check-config` lists every problem; fix them, then start again")
        for problem in problems:
            print(f"ocrd: configuration error: {problem}", file=sys.stderr)
        return 2
    daemon = Daemon(cfg, config_path)
    try:
        return asyncio.run(daemon.serve())
    except StateError as e:
        print(f"ocrd: {e}", file=sys.stderr)
        log.error("state_unusable", error=str(e))
        return 1
