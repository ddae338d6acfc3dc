"""Intake: the main loop that finds files and claims them.

Each turn: scan the inboxes that are due (at start, every `rescan_seconds`, every
`poll_seconds` on network filesystems), apply inotify's hints, and check each candidate
that is due — open it (by its folder's descriptor, never through a link), probe it in a
worker process, and let `readiness.decide` say what happens. Intake pauses while the
engine is away, while an inbox's destination is failing, and while the state folder
cannot take journal writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import structlog

from ocrd import errors, safefs
from ocrd.conditions import Conditions
from ocrd.config.settings import Config
from ocrd.intake import readiness
from ocrd.intake.claims import Claims
from ocrd.intake.inboxes import Inbox, Inboxes
from ocrd.intake.readiness import Candidate
from ocrd.intake.watch import Entry, entry_for
from ocrd.render import pages
from ocrd.render.pool import RenderPool
from ocrd.render.resolution import ESTIMATE_DPI
from ocrd.work.item import Item
from ocrd.work.journal import JournalUnwritable
from ocrd.work.outcomes import STATE_BACKOFF_SECONDS

log = structlog.get_logger("ocrd.intake.loop")

# Checks of one file that may fail with an unexpected exception before the file is
# claimed to fail as internal_error (the traceback in its error file) instead.
MAX_CHECK_FAILURES = 3
# Checks at once (each opens and probes a file) ...
CHECKS_AT_ONCE = 8
# ... and started, waiting for their turn: a huge backlog of due files starts this many,
# and more as they end, not a task for each file in one turn of the loop.
CHECKS_STARTED = 64
# Files claimed and queued (not yet converting) beyond which the intake claims no more:
# the rest wait in their inbox — where another daemon on the share may take them — and
# are claimed as the queue drains. Claiming far ahead of the engine would only fill the
# work area and hold up the loop with the claims' journal commits.
CLAIMED_AHEAD = 256


class Intake:
    def __init__(self, cfg: Config, inboxes: Inboxes, claims: Claims,
                 probe_pool: RenderPool, submit: Callable[[Item], None],
                 engine_open: asyncio.Event, metrics: Any,
                 loop_turned: Callable[[], None]) -> None:
        self.cfg = cfg
        self.inboxes = inboxes
        self.claims = claims
        self.probe_pool = probe_pool
        self.submit = submit
        self.engine_open = engine_open
        self.metrics = metrics
        self.loop_turned = loop_turned
        self.stopping = False
        self._checks = asyncio.Semaphore(CHECKS_AT_ONCE)
        self._claiming = asyncio.Lock()
        self._turn = 0
        self._tasks: set[asyncio.Task] = set()
        self.journal_paused_until = 0.0
        self._journal_backoff = 0.0
        self.conditions = Conditions(log)
        self._state_ok = True
        self._next_state_check = 0.0
        self._state_check: asyncio.Task | None = None
        # files queued ahead when the intake last looked, when it holds back its claims
        # for them (else 0): what a due file waits for
        self.queued_ahead = 0

    async def run(self, queue_depth: Callable[[], int], active: Callable[[], int]) -> None:
        while not self.stopping:
            now = time.monotonic()
            self.loop_turned()
            self.inboxes.start_folder_checks(now)
            self.inboxes.check_watches(now)
            self.inboxes.start_scans(now, self.cfg.rescan_seconds, self.cfg.poll_seconds,
                                     self.metrics.rescans.inc)
            self.inboxes.apply_hints()
            queued = queue_depth()
            self.queued_ahead = queued if queued >= CLAIMED_AHEAD else 0
            if self.engine_open.is_set() and now >= self.journal_paused_until and \
                    not self.queued_ahead and self._state_folder_ok(now):
                self._start_checks(now)
            self.metrics.candidates.set(sum(len(i.tracker) for i in self.inboxes))
            self.metrics.set_paused({str(i.path): why for i in self.inboxes
                                     if (why := i.paused_why) is not None})
            self.metrics.set_unread({str(i.path): i.unread.files for i in self.inboxes
                                     if i.unread is not None})
            self.metrics.queue_depth.set(queued)
            self.metrics.active_files.set(active())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.inboxes.next_wait(time.monotonic())):
                    await self.inboxes.wake.wait()
            self.inboxes.wake.clear()

    def _start_checks(self, now: float) -> None:
        """Checks for the due candidates, while fewer than CHECKS_STARTED are under way;
        each turn another inbox has the first pick."""
        room = CHECKS_STARTED - len(self._tasks)
        boxes = [i for i in self.inboxes if i.taking_files(now)]
        if room <= 0 or not boxes:
            return
        self._turn += 1
        first = self._turn % len(boxes)
        for inbox in boxes[first:] + boxes[:first]:
            for cand in inbox.tracker.due(room):
                cand.busy = True
                self._spawn(self.check(inbox, cand))
                room -= 1
            if room <= 0:
                return

    def _state_folder_ok(self, now: float) -> bool:
        """The state folder is the one pinned (looked at once a second, in a thread):
        otherwise no claim is made, whatever its journal would say."""
        if now >= self._next_state_check and \
                (self._state_check is None or self._state_check.done()):
            self._next_state_check = now + 1.0
            self._state_check = asyncio.create_task(self._check_state_folder(),
                                                    name="check-state-folder")
        return self._state_ok

    async def _check_state_folder(self) -> None:
        path = self.cfg.state_dir
        why = await asyncio.to_thread(self.inboxes.roots.get(path).problem)
        if why is None:
            self.conditions.cleared("state_dir", "folder_back", folder="state_dir",
                                    path=str(path))
        else:
            self.conditions.met("state_dir", "folder_replaced", level="error",
                                folder="state_dir", path=str(path), why=why,
                                hint="ocrd claims no file until the state folder is back "
                                "as it was (or a restart)")
        self._state_ok = why is None

    def _spawn(self, coro) -> None:  # noqa: ANN001
        task = asyncio.create_task(coro, name="check")
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self.inboxes.wake.set()  # room for another check
        if not task.cancelled() and task.exception() is not None:
            log.error("task_failed", task=task.get_name(), error=repr(task.exception()))

    async def stop(self) -> None:
        self.stopping = True
        self.inboxes.wake.set()
        if self._state_check is not None:
            self._state_check.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)

    # -- one candidate ------------------------------------------------------------------

    async def check(self, inbox: Inbox, cand: Candidate) -> None:
        try:
            async with self._checks:
                if self.stopping or inbox.removed:
                    return
                await self._check(inbox, cand)
            for key in self.conditions.open_keys():
                if key != "state_dir":
                    self.conditions.cleared(key, "resources_back")
        except JournalUnwritable as e:
            self._state_unwritable(e)
            cand.next_check = self.journal_paused_until  # nothing wrong with the file
        except OSError as e:
            if not errors.shortage(e):
                raise
            # Nothing wrong with the file either: look again later.
            self.conditions.met(("short", e.errno), "resources_short", level="error",
                                at="checking files", error=e.strerror or str(e),
                                hint="ocrd has no file descriptor, memory or disk space "
                                "to spare; files wait, nothing is failed")
            inbox.tracker.recheck_later(cand)
            return
        except Exception as e:  # noqa: BLE001 - a bug must not leave the file unreported
            log.exception("check_failed", file=cand.entry.relpath)
            cand.failures += (errors.internal(e, "checking the file in its inbox"),)
            inbox.tracker.recheck_later(cand)
        finally:
            inbox.tracker.checked(cand)

    async def _check(self, inbox: Inbox, cand: Candidate) -> None:
        entry = cand.entry
        dirs, name = safefs.split(entry.relpath)
        try:
            root = inbox.open_root()
        except OSError as e:
            if errors.shortage(e):
                raise
            return  # the inbox is gone for now; the next scan says so
        with root:
            try:
                folder = root.walk(dirs)
            except OSError as e:
                if errors.shortage(e):
                    raise
                inbox.tracker.forget(entry.relpath)  # its folder is gone or a link now
                return
            with folder:
                if len(cand.failures) >= MAX_CHECK_FAILURES:  # claimed to fail as itself
                    await self._act(inbox, cand, folder, readiness.Claim(
                        error=cand.failures[-1]), None)
                    return
                probe, checked = await self._probe(folder, entry)
                try:
                    now_entry = entry_for(entry.path, entry.relpath, folder.lstat(name))
                except OSError:
                    now_entry = None
                decision = readiness.decide(cand, probe, now_entry, inbox.cfg.quiet_seconds,
                                            inbox.cfg.incomplete_seconds, time.monotonic())
                await self._act(inbox, cand, folder, decision, checked)

    async def _probe(self, folder: safefs.Dir, entry: Entry
                     ) -> tuple[readiness.Probe | None, os.stat_result | None]:
        """The completeness check of the file ocrd opened (not of whatever the path
        names by the time a worker looks). None for an entry that is not a regular file.
        An OSError of a shortage (errors.SHORTAGE) is raised: not the file's fault."""
        if not entry.regular:
            return None, None
        name = entry.relpath.rsplit("/", 1)[-1]
        try:
            fd = folder.open_file(name)
        except FileNotFoundError:
            return errors.Unreadable("gone", reason="vanished"), None
        except PermissionError:
            return errors.Unreadable("ocrd has no permission to read the file (check its "
                                     "owner and mode)"), None
        except OSError as e:
            if errors.shortage(e):
                raise
            return None, None  # no longer a regular file: readiness looks again
        try:
            checked = os.fstat(fd)
            lim = self.cfg.limits
            try:
                info = await self.probe_pool.call(
                    pages.probe, safefs.fd_path(fd), self.cfg.render.dpi or ESTIMATE_DPI,
                    lim.max_pages,
                    lim.max_file_bytes, lim.max_pixels)
            except errors.OcrdError as e:
                return e, checked
            return info, checked
        finally:
            os.close(fd)

    async def _act(self, inbox: Inbox, cand: Candidate, folder: safefs.Dir,
                   decision: readiness.Decision, checked: os.stat_result | None) -> None:
        entry = cand.entry
        if isinstance(decision, readiness.Wait):
            cand.why = decision.reason
            cand.until, cand.fails_then = decision.until, decision.fails_then
            if decision.report:
                cand.reported |= {decision.report}
                log.info("file_incomplete", file=entry.relpath, reason=decision.reason,
                         waiting_up_to=inbox.cfg.incomplete_seconds)
            inbox.tracker.recheck_later(cand, decision.until)
        elif isinstance(decision, readiness.Forget):
            inbox.tracker.forget(entry.relpath)
        elif isinstance(decision, readiness.Changed):
            inbox.tracker.observe(decision.entry)
        else:
            info = decision.info if isinstance(decision, readiness.Claim) else None
            error = decision.error if isinstance(decision, readiness.Claim) else \
                errors.NotRegularFile("not a regular file (a symbolic link, FIFO, socket or "
                                      "device); ocrd never follows links out of an inbox — "
                                      "copy the document itself into the inbox")
            # one claim per turn of the loop: its journal commits wait for the disk, and
            # the checks of a backlog end together (the rest of the loop goes on between)
            async with self._claiming:
                await asyncio.sleep(0)
                if entry.regular and self.inboxes.is_kept(inbox, entry):
                    inbox.tracker.forget(entry.relpath)  # put back since it was seen
                    return
                try:
                    item = self.claims.claim(inbox, folder, entry, checked, info, error)
                except JournalUnwritable:
                    raise
                except OSError as e:
                    log.error("claim_failed", file=entry.relpath, error=e.strerror or str(e),
                              hint="the work area must be on the inbox's filesystem and "
                              "writable")
                    inbox.tracker.recheck_later(cand)
                    return
            self._journal_backoff = 0.0
            inbox.tracker.forget(entry.relpath)
            if item is not None:
                item.claimed_at, item.claimed_mono = time.time(), time.monotonic()
                self.submit(item)

    def _state_unwritable(self, e: JournalUnwritable) -> None:
        """The journal cannot take a claim: claim nothing for a while, fail nothing.
        The pause grows once per failed try, not once per check that met it (several
        run at a time)."""
        now = time.monotonic()
        if now < self.journal_paused_until:
            return
        self._journal_backoff = min(STATE_BACKOFF_SECONDS, max(1.0, self._journal_backoff * 2))
        self.journal_paused_until = now + self._journal_backoff
        self.claims.journal.make_room()
        log.error("state_unwritable", error=str(e), retry_in=self._journal_backoff,
                  hint="the state folder (journal) is full or read-only; ocrd claims no "
                  "file until it can record the claim")

