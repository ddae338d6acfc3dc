"""The daemon's life: start the engine, watch the inboxes, claim ready files, convert
them, and stop cleanly — telling systemd the truth at every step.

    serve():  install signal handlers → startup() → main_loop() → shutdown()

SIGTERM/SIGINT ask for a graceful stop (no new claims, pages in flight finish within
the drain timeout, the rest stay claimed for the next start); a second one forces it.
SIGHUP reloads the inbox settings without touching the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import structlog

from . import __version__, errors, names, outbox, pages
from .config import Config, ConfigError, InboxConfig, load_config
from .engines import create_engine
from .engines.base import Engine
from .gate import Candidate, Tracker
from .journal import Job, Journal
from .metrics import HealthServer, Metrics
from .notify import Liveness, Notifier
from .pipeline import Converter, Source
from .schedule import FairSlots, Scheduler
from .watch import WORK_DIR_NAME, Entry, Ignore, Observers, entry_for, scan, watch_mode
from .web import Console, InboxLive, Live, LiveStatus

log = structlog.get_logger("ocrd.service")


@dataclass
class InboxState:
    cfg: InboxConfig
    ignore: Ignore
    tracker: Tracker
    mode: str  # inotify | polling
    work_dir: Path
    perms: outbox.Perms
    next_scan: float = 0.0
    available: bool = True
    paused_until: float = 0.0  # a destination failed: no new claims until then
    kept: set[tuple[str, int, int]] = field(default_factory=set)


@dataclass
class Item:
    """A claimed file in the scheduler."""

    job_id: int
    inbox: InboxState
    source: Source
    relpath: str
    retries: int = 0  # destination failures so far (backoff)


class Daemon:
    def __init__(self, cfg: Config, config_path: Path | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.notifier = Notifier()
        self.should_exit = False
        self.force_exit = False
        self.exit_code = 0
        self.ready = False
        self.metrics = Metrics()
        self.inboxes: dict[Path, InboxState] = {}
        self._hints: list[tuple[str, bool, bool]] = []
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self.liveness = Liveness(cfg.schedule.page_timeout_seconds)
        self._tasks: list[asyncio.Task] = []
        self._check_slots = asyncio.Semaphore(8)
        self._retry_later: list[asyncio.TimerHandle] = []
        self.engine: Engine | None = None
        self.health: HealthServer | None = None
        self.console: Console | None = None
        self.observers: Observers | None = None
        self.done_pages = 0
        self._rate: list[tuple[float, int]] = []

    # -- the life ----------------------------------------------------------------------

    async def serve(self) -> int:
        self._loop = asyncio.get_running_loop()
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
        self._wake.set()

    def _on_reload_signal(self) -> None:
        # Only a running daemon reloads: before READY=1 there is nothing to reload yet,
        # and a READY=1 after STOPPING=1 would tell systemd we are running again.
        if not self.ready or self.should_exit:
            log.warning("reload_ignored", why="stopping" if self.should_exit else "starting")
            return
        task = asyncio.create_task(self._reload_reporting(), name="reload")
        self._tasks.append(task)

    async def _reload_reporting(self) -> None:
        """reload(), and READY=1 even when it fails half-way: after RELOADING=1 systemd
        shows the unit as reloading until READY=1 comes."""
        try:
            await self.reload()
        except Exception as e:  # noqa: BLE001 - the daemon keeps running
            log.exception("reload_failed", error=repr(e))
            self.notifier.send("READY=1", "STATUS=reload failed; see the log")

    async def startup(self) -> None:
        cfg = self.cfg
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self.instance = _instance_id(cfg.state_dir)
        self.journal = Journal(cfg.state_dir / "journal.sqlite3")
        if cfg.metrics.listen:
            try:
                self.health = HealthServer(self.metrics, cfg.metrics.listen,
                                           live=self._is_live, ready=lambda: self.ready)
                self.health.start()
                log.info("metrics_listening", address=self.health.address)
            except OSError as e:
                log.error("metrics_unavailable", listen=cfg.metrics.listen, error=str(e))
        self.console = Console.start(cfg, LiveStatus(self._loop, self._live))
        self.notifier.send("STATUS=starting the render workers")
        self.pool = pages.RenderPool(cfg.render.workers)
        self.probe_pool = pages.RenderPool(1, timeout=120)
        await asyncio.gather(self.pool.start(), self.probe_pool.start())

        self.engine = create_engine(cfg.engine)
        if self.engine.kind != "vllm":
            _keep_rss_near_live_memory()
        self.metrics.build.info({"version": __version__, "engine": self.engine.kind,
                                 "model": self.engine.model})
        await self._start_engine()
        if self.should_exit:
            return
        self.metrics.engine_ready.set(1)
        in_flight = cfg.schedule.pages_in_flight or max(2, self.engine.max_concurrency)
        self.slots = FairSlots(in_flight)
        self.converter = Converter(cfg, self.engine, self.pool, self.slots,
                                   metrics=self.metrics, liveness=self.liveness,
                                   previews=self.console.previews)
        # Beyond max_active_documents, documents start while the engine has room (see
        # schedule.py), at most one per page slot more.
        self.scheduler = Scheduler(self._run_item, cfg.schedule.max_active_documents,
                                   cfg.schedule.batch_window_seconds,
                                   room=self.converter.has_room,
                                   room_limit=cfg.schedule.max_active_documents + in_flight)
        self.converter.on_progress = self.scheduler.poke
        self.observers = Observers(self._hint_from_thread)
        for box in cfg.inboxes:
            self._add_inbox(box)
        await self._recover()
        if self.should_exit:
            return
        self.liveness.loop_turned()
        self.ready = True
        self.notifier.send("READY=1", "STATUS=ready; watching "
                           f"{len(self.inboxes)} inbox(es)")
        log.info("ready", inboxes=[str(p) for p in self.inboxes], engine=self.engine.kind,
                 pages_in_flight=in_flight)

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
        self._tasks += [
            asyncio.create_task(self.scheduler.run(), name="scheduler"),
            asyncio.create_task(self._intake(), name="intake"),
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
        ]
        stop = asyncio.create_task(self._stop.wait())
        watched = [t for t in self._tasks if t.get_name() in ("scheduler", "intake")]
        done, _ = await asyncio.wait([stop, *watched], return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not stop and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        stop.cancel()

    async def shutdown(self) -> None:
        self.ready = False
        self.notifier.send("STOPPING=1", "STATUS=draining")
        scheduler = getattr(self, "scheduler", None)
        log.info("draining", active=len(scheduler.active) if scheduler else 0,
                 queued=scheduler.queued if scheduler else 0)
        if self.observers is not None:
            self.observers.stop()
        for handle in self._retry_later:
            handle.cancel()
        if hasattr(self, "scheduler"):
            self.scheduler.accepting = False
            if not self.force_exit and self.scheduler.active:
                drain = asyncio.create_task(self.scheduler.drain(
                    self.cfg.drain_timeout_seconds))
                forced = asyncio.create_task(self._wait_forced())
                await asyncio.wait({drain, forced}, return_when=asyncio.FIRST_COMPLETED)
                forced.cancel()
            for task in list(self.scheduler.active):
                task.cancel()
            if self.scheduler.active:
                await asyncio.wait(list(self.scheduler.active), timeout=10)
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
        for pool in (getattr(self, "pool", None), getattr(self, "probe_pool", None)):
            if pool is not None:
                await pool.close()
        if self.health is not None:
            self.health.stop()
        if self.console is not None:
            self.console.stop()
        if hasattr(self, "journal"):
            left = self.journal.counts()
            log.info("stopped", left_claimed=sum(left.get(s, 0) for s in
                                                  ("claimed", "converting", "finishing")))
            self.journal.close()

    async def _wait_forced(self) -> None:
        while not self.force_exit:
            self._stop.clear()
            await self._stop.wait()

    # -- inboxes ----------------------------------------------------------------------

    def _add_inbox(self, box: InboxConfig) -> None:
        mode = watch_mode(box)
        perms = outbox.Perms(box.mode, box.dmode, box.gid, self.instance[:8])
        state = InboxState(
            box, Ignore(box), Tracker(box.quiet_seconds, box.incomplete_seconds,
                                      fast_close=mode == "inotify"),
            mode, box.path / WORK_DIR_NAME / self.instance, perms)
        self.inboxes[box.path] = state
        self._start_watch(state)
        for root in box.destinations().values():
            task = asyncio.create_task(asyncio.to_thread(
                outbox.sweep_temporaries, root, perms.tag), name="sweep")
            self._tasks.append(task)
        log.info("inbox_added", inbox=str(box.path), watch=state.mode,
                 recursive=box.recursive, outbox=str(box.outbox))

    def _start_watch(self, state: InboxState) -> None:
        if state.mode == "inotify" and self.observers is not None and \
                state.cfg.path.is_dir() and not self.observers.watch(state.cfg):
                state.mode = "polling"
                state.tracker.fast_close = False

    def _remove_inbox(self, path: Path) -> None:
        state = self.inboxes.pop(path)
        if self.observers is not None:
            self.observers.unwatch(path)
        self.scheduler.remove(lambda item: item.inbox is state)
        log.info("inbox_removed", inbox=str(path))

    async def reload(self) -> None:
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            if self.config_path is None:
                raise ConfigError("no config file to reload")
            new = await asyncio.to_thread(load_config, self.config_path)
        except ConfigError as e:
            log.error("reload_failed", error=str(e), kept="the running configuration")
            self.notifier.send("READY=1", "STATUS=reload failed; running configuration kept")
            return
        if new.engine != self.cfg.engine or new.render != self.cfg.render:
            log.warning("restart_needed", reason="engine or render settings changed; "
                        "they apply at the next start")
        old = {b.path: b for b in self.cfg.inboxes}
        fresh = {b.path: b for b in new.inboxes}
        for path in old.keys() - fresh.keys():
            self._remove_inbox(path)
        for path, box in fresh.items():
            if path not in old:
                self._add_inbox(box)
            elif box != old[path]:
                self._remove_inbox(path)
                self._add_inbox(box)
        self.slots.resize(new.schedule.pages_in_flight or self.slots.n)
        self.scheduler.max_active = new.schedule.max_active_documents
        self.scheduler.room_limit = new.schedule.max_active_documents + self.slots.n
        self.scheduler.poke()  # a larger max_active may let queued documents start now
        keep_engine, keep_render = self.cfg.engine, self.cfg.render
        self.cfg = new.model_copy(update={"engine": keep_engine, "render": keep_render})
        self.converter.cfg = self.cfg
        if self.console is not None:
            self.console.update_config(self.cfg)
        self._wake.set()
        log.info("reloaded", inboxes=[str(p) for p in self.inboxes])
        self.notifier.send("READY=1", f"STATUS=reloaded; watching {len(self.inboxes)} inbox(es)")

    # -- intake -----------------------------------------------------------------------

    def _hint_from_thread(self, path: str, closed: bool, is_dir: bool) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self._loop.call_soon_threadsafe(self._hint, path, closed, is_dir)

    def _hint(self, path: str, closed: bool, is_dir: bool) -> None:
        self._hints.append((path, closed, is_dir))
        self._wake.set()

    async def _intake(self) -> None:
        stall_file = os.environ.get("OCRD_TEST_STALL_FILE")
        while not self.should_exit:
            # TEST ONLY (tests/systemd): while this file exists the event loop is blocked
            # on purpose, as a real hang would block it, so WATCHDOG=1 stops and systemd
            # kills the daemon. Never set OCRD_TEST_STALL_FILE in production.
            while stall_file and os.path.exists(stall_file):
                time.sleep(0.2)
            now = time.monotonic()
            self.liveness.loop_turned()
            for state in list(self.inboxes.values()):
                if now >= state.next_scan:
                    interval = self.cfg.poll_seconds if state.mode == "polling" \
                        else self.cfg.rescan_seconds
                    state.next_scan = now + interval
                    await self._scan(state)
            hints, self._hints = self._hints, []
            for path, closed, is_dir in hints:
                self._apply_hint(path, closed, is_dir)
            if self.converter.gate.open.is_set():
                for state in list(self.inboxes.values()):
                    if state.paused_until > now:
                        continue
                    for cand in state.tracker.due():
                        cand.busy = True
                        self._spawn(self._check(state, cand))
            waits = [1.0] + [s.next_scan - time.monotonic() for s in self.inboxes.values()]
            waits += [w for s in self.inboxes.values()
                      if (w := s.tracker.next_wakeup()) is not None]
            self.metrics.candidates.set(sum(len(s.tracker) for s in self.inboxes.values()))
            self.metrics.queue_depth.set(self.scheduler.queued)
            self.metrics.active_files.set(len(self.scheduler.active))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.02, min(waits))):
                    await self._wake.wait()
            self._wake.clear()

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task_failed", task=task.get_name(),
                      error=repr(task.exception()))

    async def _scan(self, state: InboxState) -> None:
        root = state.cfg.path
        if not root.is_dir():
            if state.available:
                log.error("inbox_missing", inbox=str(root),
                          hint="is the share mounted? ocrd keeps looking")
            state.available = False
            if self.observers is not None:
                self.observers.unwatch(root)
            return
        if not state.available:
            log.info("inbox_back", inbox=str(root))
            state.available = True
        if state.mode == "inotify" and self.observers is not None and \
                not self.observers.alive(root):
            self._start_watch(state)
        self.metrics.rescans.inc()

        def on_error(folder: Path, e: OSError) -> None:
            log.warning("scan_error", folder=str(folder), error=e.strerror)

        entries = await asyncio.to_thread(
            lambda: list(scan(root, state.cfg.recursive, state.ignore, on_error)))
        seen = set()
        for entry in entries:
            seen.add(entry.relpath)
            self._observe(state, entry)
        state.tracker.keep_only(seen)

    def _observe(self, state: InboxState, entry: Entry, closed: bool = False) -> None:
        if entry.regular and (entry.relpath, entry.size, entry.mtime_ns) in state.kept:
            return
        if entry.regular and self.journal.is_kept(str(state.cfg.path), entry.relpath,
                                                  entry.size, entry.mtime_ns):
            state.kept.add((entry.relpath, entry.size, entry.mtime_ns))
            return
        state.tracker.observe(entry, closed)

    def _apply_hint(self, path: str, closed: bool, is_dir: bool) -> None:
        p = Path(path)
        for root, state in self.inboxes.items():
            try:
                rel = p.relative_to(root)
            except ValueError:
                continue
            relpath = PurePosixPath(*rel.parts).as_posix()
            if relpath == "." or (not state.cfg.recursive and len(rel.parts) > 1):
                return
            if is_dir:
                # A folder moved in with files inside produces no events for them.
                if state.cfg.recursive and not state.ignore.ignored_part(p.name):
                    state.next_scan = 0.0
                return
            if not state.ignore.wanted(relpath):
                return
            try:
                st = os.lstat(p)
            except OSError:
                state.tracker.forget(relpath)
                return
            self._observe(state, entry_for(p, relpath, st), closed)
            return

    async def _check(self, state: InboxState, cand: Candidate) -> None:
        entry = cand.entry
        try:
            async with self._check_slots:
                if self.should_exit or state.cfg.path not in self.inboxes:
                    return
                if not entry.regular:
                    if state.tracker.quiet_for(cand) >= state.cfg.quiet_seconds:
                        await self._reject_non_regular(state, entry)
                        state.tracker.forget(entry.relpath)
                    return
                try:
                    info = await self.probe_pool.call(
                        pages.probe, str(entry.path), self.cfg.render.dpi,
                        self.cfg.limits.max_pages, self.cfg.limits.max_file_bytes,
                        self.cfg.limits.max_pixels)
                except (errors.EmptyFile, errors.Truncated) as e:
                    if state.tracker.given_up(cand):
                        await self._claim(state, cand, None, e)
                    else:
                        if "incomplete" not in cand.reported:
                            cand.reported.add("incomplete")
                            log.info("file_incomplete", file=entry.relpath, reason=e.reason,
                                     waiting_up_to=state.cfg.incomplete_seconds)
                        state.tracker.recheck_later(cand)
                    return
                except errors.OcrdError as e:
                    if e.reason == "vanished":
                        state.tracker.forget(entry.relpath)
                    elif state.tracker.quiet_for(cand) >= state.cfg.quiet_seconds:
                        await self._claim(state, cand, None, e)
                    else:
                        state.tracker.recheck_later(cand)
                    return
                try:
                    now = entry_for(entry.path, entry.relpath, os.lstat(entry.path))
                except OSError:
                    state.tracker.forget(entry.relpath)
                    return
                if (now.size, now.mtime_ns, now.ino) != (entry.size, entry.mtime_ns, entry.ino):
                    state.tracker.observe(now)
                    return
                await self._claim(state, cand, info, None)
        except Exception as e:  # noqa: BLE001 - a bug must not leave the file unreported
            log.exception("check_failed", file=entry.relpath)
            if entry.regular and os.path.lexists(entry.path):
                await self._claim(state, cand, None, errors.OcrdError(
                    f"internal error while checking the file: {e!r}", reason="internal_error"))
        finally:
            cand.busy = False

    async def _claim(self, state: InboxState, cand: Candidate, info: pages.DocInfo | None,
                     error: errors.OcrdError | None) -> None:
        entry = cand.entry
        inbox = str(state.cfg.path)
        job_id = self.journal.begin_claim(inbox, entry.relpath, "", entry.size, entry.mtime_ns)
        claim = state.work_dir / str(job_id) / entry.relpath
        self.journal.set_claim_path(job_id, str(claim))
        try:
            claim.parent.mkdir(parents=True, exist_ok=True)
            os.rename(entry.path, claim)
        except FileNotFoundError:
            # Gone, or another ocrd on the same share claimed it first: not ours.
            self.journal.drop(job_id)
            _remove_empty(claim.parent, state.work_dir)
            state.tracker.forget(entry.relpath)
            log.info("claim_lost", file=entry.relpath)
            return
        except OSError as e:
            self.journal.drop(job_id)
            _remove_empty(claim.parent, state.work_dir)
            log.error("claim_failed", file=entry.relpath, error=e.strerror,
                      hint="the work area must be on the inbox's filesystem and writable")
            state.tracker.recheck_later(cand)
            return
        self.journal.claimed(job_id)
        state.tracker.forget(entry.relpath)
        self.metrics.claims.inc()
        log.info("file_claimed", file=entry.relpath, inbox=inbox, size=entry.size,
                 pages=info.pages if info else None)
        item = _item(job_id, state, claim, entry.relpath)
        item.source.info = info
        if error is not None:
            await self._fail(item, error)
            return
        self._submit(item)

    def _submit(self, item: Item, exclusive: bool = False) -> None:
        cost = item.source.info.pixels if item.source.info else 0
        self.scheduler.submit(item, cost, exclusive)
        item.source.order = self.scheduler.order_of(item)

    async def _reject_non_regular(self, state: InboxState, entry: Entry) -> None:
        """Symlinks, FIFOs, sockets and devices are never opened. They are moved (the
        entry itself, not what it points to) to failed/ with an explanation."""
        err = errors.NotRegularFile(
            "not a regular file (a symbolic link, FIFO, socket or device); ocrd never "
            "follows links out of an inbox — copy the document itself into the inbox")
        rel = PurePosixPath(entry.relpath)
        perms = state.perms
        try:
            folder = outbox.makedirs(state.cfg.failed, rel.parent if rel.parent.parts else None,
                                     perms)
            try:
                dest = outbox.move_unique(entry.path, folder, rel.name)
                where = str(dest)
            except OSError:
                dest, where = folder / rel.name, "left in the inbox"
            _write_error(dest, err, entry.relpath, perms, extra={"entry": where})
        except OSError as e:
            log.error("reject_failed", file=entry.relpath, error=e.strerror)
            return
        log.warning("file_failed", file=entry.relpath, reason=err.reason, message=str(err))
        self.metrics.files.labels("failed").inc()

    # -- conversion -------------------------------------------------------------------

    async def _run_item(self, item: Item) -> None:
        job_id = item.job_id
        attempt = self.journal.start(job_id)
        if attempt > self.cfg.schedule.max_attempts:
            await self._fail(item, errors.TooManyAttempts(
                f"conversion was started {attempt - 1} times without finishing (the daemon "
                "may have crashed on this file)"))
            return
        state = item.inbox
        rel = PurePosixPath(item.relpath)
        try:
            out_dir = outbox.makedirs(state.cfg.outbox,
                                      rel.parent if rel.parent.parts else None, state.perms)
            written = await self.converter.convert(item.source, out_dir, state.perms)
        except errors.EngineDead as e:
            self.journal.requeue(job_id)
            log.error("engine_dead", error=str(e), file=item.relpath)
            self.exit_code = 1
            self.should_exit = True
            self._stop.set()
            return
        except asyncio.CancelledError:
            self.journal.requeue(job_id)
            log.info("file_requeued", file=item.relpath, why="stopping")
            raise
        except errors.OcrdError as e:
            await self._fail(item, e)
            return
        except OSError as e:
            # The destination is full, read-only or gone: not the file's fault. Keep it
            # claimed and try again later.
            self.journal.requeue(job_id)
            delay = self._later(item)
            log.error("output_unwritable", file=item.relpath, error=e.strerror or str(e),
                      path=getattr(e, "filename", None), retry_in=delay,
                      hint="is the outbox full, read-only or unmounted? ocrd pauses this "
                      "inbox and retries")
            return
        except Exception as e:  # noqa: BLE001 - one file must never take the daemon down
            log.exception("internal_error", file=item.relpath)
            await self._fail(item, errors.OcrdError(f"internal error: {e!r}",
                                                    reason="internal_error"))
            return
        await self._finish(item, written.markdown, written.meta)

    def _later(self, item: Item) -> float:
        """Try a file again after its destination failed, backing off; the inbox takes
        no new files meanwhile. Returns the delay."""
        item.retries += 1
        delay = min(60.0, 2.0 ** item.retries)
        item.inbox.paused_until = time.monotonic() + delay
        loop = asyncio.get_running_loop()
        self._retry_later = [h for h in self._retry_later if not h.cancelled()]
        self._retry_later.append(loop.call_later(delay, self._submit, item))
        return delay

    async def _finish(self, item: Item, md: Path, meta: dict) -> None:
        state, src = item.inbox, item.source
        self.journal.finishing(item.job_id, str(md))
        kept = await asyncio.to_thread(self._dispose_original, state, item)
        self.journal.done(item.job_id, str(md), kept, pages=meta.get("page_count"),
                          degraded=len(meta.get("degraded_pages") or []))
        _remove_empty(src.path.parent, state.work_dir)
        self.metrics.files.labels("degraded" if meta.get("degraded_pages") else "ok").inc()
        self.metrics.last_success.set(time.time())
        self.metrics.file_seconds.observe(time.time() - src.claimed_at)
        self.done_pages += meta.get("page_count", 0)

    def _dispose_original(self, state: InboxState, item: Item) -> str | None:
        """After the outputs are durable: archive, delete or put back the original.
        Returns the relative path it was put back under (keep), else None."""
        src = item.source.path
        rel = PurePosixPath(item.relpath)
        parent = rel.parent if rel.parent.parts else None
        how = state.cfg.on_success
        if not src.exists():
            return None
        if how == "delete":
            src.unlink()
            return None
        if how == "archive":
            assert state.cfg.archive is not None
            folder = outbox.makedirs(state.cfg.archive, parent, state.perms)
            outbox.move_unique(src, folder, rel.name)
            return None
        folder = state.cfg.path.joinpath(*parent.parts) if parent else state.cfg.path
        folder.mkdir(parents=True, exist_ok=True)
        dest = outbox.move_unique(src, folder, rel.name)
        kept = dest.relative_to(state.cfg.path).as_posix()
        st = os.stat(dest)
        state.kept.add((kept, st.st_size, st.st_mtime_ns))
        return kept

    async def _fail(self, item: Item, err: errors.OcrdError) -> None:
        state = item.inbox
        rel = PurePosixPath(item.relpath)
        attempts = (self.journal.get(item.job_id) or _NOJOB).attempts
        try:
            dest = await asyncio.to_thread(self._move_failed, state, item, rel, err, attempts)
        except OSError as e:
            self.journal.requeue(item.job_id)
            delay = self._later(item)
            log.error("failed_folder_unwritable", file=item.relpath, error=e.strerror,
                      retry_in=delay)
            return
        self.journal.failed(item.job_id, err.reason, str(err), str(dest))
        _remove_empty(item.source.path.parent, state.work_dir)
        self.metrics.files.labels("failed").inc()
        log.warning("file_failed", file=item.relpath, reason=err.reason, message=str(err),
                    moved_to=str(dest))

    def _move_failed(self, state: InboxState, item: Item, rel: PurePosixPath,
                     err: errors.OcrdError, attempts: int) -> Path:
        folder = outbox.makedirs(state.cfg.failed, rel.parent if rel.parent.parts else None,
                                 state.perms)
        src = item.source.path
        if os.path.lexists(src):
            dest = outbox.move_unique(src, folder, rel.name, state.perms)
        else:
            dest = folder / outbox.fit_name(rel.name, "", 40)
        _write_error(dest, err, item.relpath, state.perms,
                     extra={"sha256": item.source.sha256, "attempts": attempts})
        return dest

    async def _recover(self) -> None:
        """Resume what the last run left: claimed files are queued again, half-done
        claims are settled, and files in our work area without a row are adopted."""
        known: set[str] = set()
        jobs = self.journal.open_jobs()
        # Files that were converting when the last run died are suspects. If several
        # were, the crash cannot be pinned on one: their attempt is not counted, and each
        # is converted alone first, so a file that really crashes the daemon is caught
        # by max_attempts while the innocent ones go through.
        suspects = [j.id for j in jobs if j.state == "converting"]
        isolate = len(suspects) > 1
        for job in jobs:
            known.add(job.claim_path)
            state = self.inboxes.get(Path(job.inbox))
            if state is None:
                log.warning("claimed_file_of_unknown_inbox", inbox=job.inbox,
                            file=job.relpath, claim=job.claim_path)
                continue
            claim = Path(job.claim_path)
            exists = bool(job.claim_path) and os.path.lexists(claim)
            if job.state == "claiming":
                if exists:
                    self.journal.claimed(job.id)
                else:
                    self.journal.drop(job.id)
                    continue
            item = _item(job.id, state, claim, job.relpath, claimed_at=job.created)
            src = item.source
            if job.state == "finishing":
                kept = await asyncio.to_thread(self._dispose_original, state, item) \
                    if exists else None
                self.journal.done(job.id, job.output or "", kept)
                _remove_empty(claim.parent, state.work_dir)
                continue
            if not exists:
                self.journal.failed(job.id, "vanished", "the claimed file disappeared from "
                                    "the work area", "")
                log.error("claimed_file_missing", file=job.relpath, claim=job.claim_path)
                continue
            suspect = isolate and job.id in suspects
            if suspect:
                self.journal.requeue(job.id)
            log.info("file_resumed", file=job.relpath, attempts=job.attempts,
                     isolated=suspect)
            try:
                src.info = await self.converter.probe(claim)
            except errors.OcrdError as e:
                await self._fail(item, e)
                continue
            self._submit(item, exclusive=suspect)
        for state in self.inboxes.values():
            for path in await asyncio.to_thread(_files_under, state.work_dir):
                if str(path) in known:
                    continue
                rel = path.relative_to(state.work_dir)
                relpath = PurePosixPath(*rel.parts[1:]).as_posix()
                st = os.lstat(path)
                job_id = self.journal.begin_claim(str(state.cfg.path), relpath, str(path),
                                                  st.st_size, st.st_mtime_ns)
                self.journal.claimed(job_id)
                log.warning("orphan_adopted", file=relpath, claim=str(path))
                item = _item(job_id, state, path, relpath)
                try:
                    item.source.info = await self.converter.probe(path)
                except errors.OcrdError as e:
                    await self._fail(item, e)
                    continue
                self._submit(item)

    # -- liveness ---------------------------------------------------------------------

    def _is_live(self) -> bool:
        """The main loop turns, and pages given to the engine come back (notify.py).
        Before the main loop runs (engine loading) and while stopping: live."""
        return not self.ready or self.liveness.live()

    def _live(self) -> Live:
        """The console's view of what only the daemon knows (ocrd/web/live.py); runs on
        this loop, called through LiveStatus from the console's thread."""
        now = time.monotonic()
        t0, n0 = self._rate[0] if self._rate else (now, self.done_pages)
        running = self.ready and not self.should_exit
        scheduler = getattr(self, "scheduler", None)  # set once the engine is loaded
        return Live(
            state="stopping" if self.should_exit else "ready" if self.ready else "starting",
            engine_kind=self.engine.kind if self.engine else self.cfg.engine.kind,
            engine_model=self.engine.model if self.engine else self.cfg.engine.model,
            engine_ready=running and self.converter.gate.open.is_set(),
            pages_done=self.done_pages,
            pages_per_second=(self.done_pages - n0) / (now - t0) if now > t0 else 0.0,
            pages_in_flight=self.slots.used if scheduler else 0,
            queued=scheduler.queued if scheduler else 0,
            converting=len(scheduler.active) if scheduler else 0,
            inboxes=tuple(InboxLive(names.shown(str(p)), s.mode, s.available, len(s.tracker),
                                    s.paused_until > now) for p, s in self.inboxes.items()),
            version=__version__)

    async def _heartbeat(self) -> None:
        interval = (self.notifier.watchdog_seconds or 10.0) / 2
        last_status = 0.0
        while True:
            await asyncio.sleep(min(interval, 5.0))
            problem = self.liveness.problem()
            if problem is None:
                if self.notifier.watchdog_seconds:
                    self.notifier.send("WATCHDOG=1")
            else:
                log.error("stalled", why=problem, in_engine=self.liveness.in_engine,
                          seconds_since_loop=round(self.liveness.seconds_since_loop(), 1))
            now = time.monotonic()
            self._rate.append((now, self.done_pages))
            self._rate = [(t, n) for t, n in self._rate if now - t <= 60]
            if now - last_status >= 5:
                last_status = now
                t0, n0 = self._rate[0]
                rate = (self.done_pages - n0) / max(1e-9, now - t0) if now > t0 else 0.0
                self.notifier.send(
                    f"STATUS=queue {self.scheduler.queued}, converting "
                    f"{len(self.scheduler.active)} file(s), {self.slots.used} page(s) in "
                    f"flight, {rate:.2f} pages/s")


_NOJOB = Job(0, "", "", "", 0, 0, "", 0)


def _item(job_id: int, state: InboxState, claim: Path, relpath: str, **kw: float) -> Item:
    """A claimed file of an inbox, with that inbox's prompt and naming settings."""
    box = state.cfg
    src = Source(claim, relpath, inbox=str(box.path), prompt_mode=box.prompt,
                 custom_prompt=box.custom_prompt, same_path_replaces=box.on_success == "keep",
                 **kw)
    return Item(job_id, state, src, relpath)


def _write_error(dest: Path, err: errors.OcrdError, source: str, perms: outbox.Perms,
                 extra: dict | None = None) -> None:
    body = {"reason": err.reason, "message": str(err), "source": source,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **(extra or {})}
    name = outbox.fit_name(dest.name, ".error.json")
    outbox.write_atomic(dest.with_name(name),
                        names.json_bytes(body), perms)


def _instance_id(state_dir: Path) -> str:
    """A stable id for this daemon's state, naming its work area in every inbox."""
    path = state_dir / "instance-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        ident = uuid.uuid4().hex
        outbox.write_atomic(path, (ident + "\n").encode(), outbox.Perms(0o644))
        return ident


def _files_under(root: Path) -> list[Path]:
    out = []
    for folder, _dirs, files in os.walk(root):
        out.extend(Path(folder) / f for f in files)
    return sorted(out)


def _remove_empty(folder: Path, stop: Path) -> None:
    """Remove empty folders from `folder` up to (not including) `stop`."""
    with contextlib.suppress(OSError, ValueError):
        folder.relative_to(stop)
        while folder != stop and folder.is_dir():
            folder.rmdir()
            folder = folder.parent


def _keep_rss_near_live_memory() -> None:
    """Page images (6–8 MB each) are allocated and freed all the time. After the first
    such free glibc raises its mmap threshold and serves them from its heaps, which keep
    freed memory: the daemon's RSS then sat 20–50 MB above what was live on a long
    PDF (bench/run.py, memory). A fixed threshold keeps large buffers mmapped, returned
    to the system when freed. Not with the in-process vLLM engine: its image processing
    is the bottleneck there, and would pay page faults for every tensor."""
    import ctypes

    m_mmap_threshold = -3
    try:
        ctypes.CDLL(None).mallopt(m_mmap_threshold, 1 << 20)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def run(config_path: Path) -> int:
    # A watchdog timeout ends in SIGABRT: print every thread's stack first, so the
    # journal shows where the daemon hung.
    faulthandler.enable()
    cfg = load_config(config_path)
    daemon = Daemon(cfg, config_path)

    return asyncio.run(daemon.serve())
