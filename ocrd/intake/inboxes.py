"""The inboxes the daemon watches: each one's state, the add/change/remove diff of a
reload, and what scans and inotify hints show in them.

A reload changes an inbox in place (its settings, ignore rules, watch mode and readiness
periods): the files it has claimed and queued keep going. An inbox removed by a reload
stops taking files; what it had claimed still converts.

Every folder of an inbox is reached through its pinned root (config/roots.py). An inbox one of
whose folders is not the one pinned (a link now, another folder, gone) takes no files
(`blocked`) and says so in one line, until the folder is back or a reload pins anew.
Scans run beside the intake loop, one at a time per inbox, never holding it up: the
listing and the journal's and the share's answers on which files are kept originals
(`kept_among`, for all of them at once) in a thread, what is left on the loop in parts
of OBSERVE_SLICE entries. An inotify observer that lost a thread is replaced, and after
repeated losses the inbox is polled instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from ocrd.conditions import Conditions
from ocrd.config.roots import MISSING, Roots, unmounted
from ocrd.config.settings import InboxConfig
from ocrd.intake.readiness import Tracker
from ocrd.intake.watch import (
    MAX_DEPTH,
    Entry,
    Ignore,
    Observers,
    UnreadFiles,
    entry_for,
    scan,
    watch_method,
)
from ocrd.outputs import destinations
from ocrd.safefs import Dir
from ocrd.work.area import WORK_DIR_NAME

log = structlog.get_logger("ocrd.intake.inboxes")

# how often each inbox's folders are compared with their pins
FOLDER_CHECK_SECONDS = 1.0
# observers that may die within WATCH_RESTART_WINDOW before the inbox is polled instead
WATCH_RESTARTS = 3
WATCH_RESTART_WINDOW = 600.0
# a scan's entries handed to the readiness tracker at a time, the loop free in between
OBSERVE_SLICE = 2000

Key = tuple[str, int, int]  # (relpath, size, mtime_ns) of a file in an inbox


@dataclass
class Inbox:
    cfg: InboxConfig
    ignore: Ignore
    tracker: Tracker
    watch: str  # inotify | polling
    instance: str
    perms: destinations.Perms
    roots: Roots
    next_scan: float = 0.0
    available: bool = True
    removed: bool = False  # taken out by a reload: no new claims
    paused_until: float = 0.0  # a destination failed: no new claims until then
    # a folder of the inbox is not the one pinned: why, for people; no new claims
    blocked: str | None = None
    readable: bool = True  # the inbox folder itself is the one pinned: it may be scanned
    next_folder_check: float = 0.0
    scanning: asyncio.Task | None = None
    checking: asyncio.Task | None = None  # a look at its folders, in a thread
    watch_deaths: list[float] = field(default_factory=list)  # monotonic times
    # originals put back after conversion (on_success: keep): (relpath, size, mtime_ns)
    kept: set[Key] = field(default_factory=set)
    # (size, mtime_ns) of originals being put back right now, from a worker thread: the
    # intake may see one in the inbox before it is in `kept` (and convert it again)
    putting_back: list[tuple[int, int]] = field(default_factory=list)
    # files in subfolders that this inbox does not read (not recursive), at the last scan
    unread: UnreadFiles | None = None

    @property
    def path(self) -> Path:
        return self.cfg.path

    def open_root(self) -> Dir:
        """The inbox folder, the one pinned (roots.RootChanged otherwise)."""
        return self.roots.open(self.cfg.path)

    def open_destination(self, path: Path) -> Dir:
        """One of the inbox's destinations (outbox, archive, failed), the one pinned
        (roots.RootChanged otherwise); created on first use only where the inbox's
        `create_folders` says so."""
        return self.roots.open(path, create=self.cfg.create_folders,
                               mode=self.perms.dir_mode)

    def open_work(self, create: bool = False) -> Dir:
        """This daemon's work area in the inbox, `.ocrd-work/<instance>/` (0700: other
        users of a shared inbox cannot reach into claimed files)."""
        with self.open_root() as root:
            if not create:
                return root.walk((WORK_DIR_NAME, self.instance))
            with root.mkdir(WORK_DIR_NAME, self.perms.dir_mode, self.perms.gid) as work:
                return work.mkdir(self.instance, 0o700)

    def taking_files(self, now: float) -> bool:
        return self.available and not self.removed and not self.blocked and \
            self.paused_until <= now

    @property
    def paused_why(self) -> str | None:
        """Why the inbox takes no files now, in one line (None: it does)."""
        if self.blocked:
            return self.blocked
        if not self.available:
            return f"the inbox folder {MISSING}"
        if self.paused_until > time.monotonic():
            return "a destination refused a file; ocrd tries again shortly"
        return None


def _folder_word(which: str) -> str:
    return {"path": "inbox folder", "failed": "failed folder",
            "archive": "archive folder"}.get(which, which)


def perms_for(box: InboxConfig, instance: str) -> destinations.Perms:
    return destinations.Perms(box.file_mode_bits, box.dir_mode_bits, box.gid, instance[:8])


Hint = tuple[str, bool, bool]  # (path, complete (closed/moved in), is_dir)


class Inboxes:
    """Every inbox by path, their watches, and the hints inotify sends from its thread."""

    def __init__(self, instance: str, is_kept: Callable[[Inbox, Entry], bool],
                 roots: Roots | None = None,
                 kept_among: Callable[[Inbox, list[Entry]], set[Key]] | None = None
                 ) -> None:
        """`is_kept`: whether one file is an original put back (on_success: keep), asked
        on the loop for a file an event shows; `kept_among`: the same for a scan's files
        at once, asked in the scan's thread (None: no lookup, none is)."""
        self.instance = instance
        self.is_kept = is_kept
        self.kept_among = kept_among
        self.roots = roots or Roots()
        self.by_path: dict[Path, Inbox] = {}
        self.observers = Observers(self._hint_from_thread)
        self.hints: list[Hint] = []
        self.wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self.conditions = Conditions(log)
        self._stopping = threading.Event()

    def __iter__(self):
        return iter(list(self.by_path.values()))

    def __len__(self) -> int:
        return len(self.by_path)

    def get(self, path: Path) -> Inbox | None:
        return self.by_path.get(path)

    # -- add, change, remove --------------------------------------------------------------

    def add(self, box: InboxConfig) -> Inbox:
        watch = watch_method(box)
        inbox = Inbox(box, Ignore(box), Tracker(box.quiet_seconds, fast_close=watch == "inotify"),
                      watch, self.instance, perms_for(box, self.instance), self.roots)
        self.by_path[box.path] = inbox
        self.check_folders(inbox)
        self._start_watch(inbox)
        log.info("inbox_added", inbox=str(box.path), watch=inbox.watch,
                 recursive=box.recursive, outbox=str(box.outbox))
        return inbox

    def update(self, inbox: Inbox, box: InboxConfig) -> None:
        """New settings for an inbox that stays: its claimed files keep their place."""
        rewatch = (box.watch, box.recursive) != (inbox.cfg.watch, inbox.cfg.recursive)
        inbox.cfg = box
        inbox.ignore = Ignore(box)
        inbox.perms = perms_for(box, self.instance)
        inbox.tracker.quiet = box.quiet_seconds
        if rewatch:
            self.observers.unwatch(box.path)
            inbox.watch = watch_method(box)
            inbox.tracker.fast_close = inbox.watch == "inotify"
            self._start_watch(inbox)
        inbox.next_scan = 0.0  # new ignore/include rules: look again now
        log.info("inbox_changed", inbox=str(box.path), watch=inbox.watch)

    def remove(self, path: Path) -> Inbox:
        inbox = self.by_path.pop(path)
        inbox.removed = True
        inbox.blocked = None
        self.observers.unwatch(path)
        for key in self.conditions.open_keys():
            if key[0] == path:
                self.conditions.cleared(key)
        log.info("inbox_removed", inbox=str(path))
        return inbox

    def reload(self, boxes: list[InboxConfig]) -> list[Inbox]:
        """Apply a reloaded inbox list; returns the inboxes added."""
        fresh = {b.path: b for b in boxes}
        for path in list(self.by_path):
            if path not in fresh:
                self.remove(path)
        added = []
        for path, box in fresh.items():
            inbox = self.by_path.get(path)
            if inbox is None:
                added.append(self.add(box))
            elif box != inbox.cfg:
                self.update(inbox, box)
        for inbox in self:  # the folders were pinned anew
            self.check_folders(inbox)
            self._start_watch(inbox)
        return added

    def _start_watch(self, inbox: Inbox) -> None:
        if inbox.watch != "inotify" or not inbox.available or not inbox.readable:
            return
        if not self.observers.watch(inbox.cfg):
            inbox.watch = "polling"
            inbox.tracker.fast_close = False

    def stop(self) -> None:
        self._stopping.set()
        for inbox in self:
            for task in (inbox.scanning, inbox.checking):
                if task is not None:
                    task.cancel()
        self.observers.stop()

    # -- the inbox's folders against their pins -------------------------------------------

    def check_folders(self, inbox: Inbox) -> None:
        """Compare the inbox's folders with their pins now (at add and reload): block
        the inbox while one is not the folder pinned, say so once, and go on when it
        is back."""
        inbox.next_folder_check = time.monotonic() + FOLDER_CHECK_SECONDS
        self._apply_folders(inbox, self._look_at_folders(inbox.cfg))

    def start_folder_checks(self, now: float) -> None:
        """check_folders for every inbox whose turn it is (every FOLDER_CHECK_SECONDS),
        the looking done in a thread: a share that hangs holds up nothing else."""
        for inbox in self:
            if now < inbox.next_folder_check or \
                    (inbox.checking is not None and not inbox.checking.done()):
                continue
            inbox.next_folder_check = now + FOLDER_CHECK_SECONDS
            inbox.checking = asyncio.create_task(self._check_beside(inbox),
                                                 name="check-folders")

    async def _check_beside(self, inbox: Inbox) -> None:
        cfg = inbox.cfg
        found = await asyncio.to_thread(self._look_at_folders, cfg)
        if inbox.cfg is cfg and not inbox.removed:
            self._apply_folders(inbox, found)

    def _look_at_folders(self, box: InboxConfig) -> list[tuple[str, Path, str | None, bool]]:
        """(which, path, why it is not usable or None, pinned) for each folder of the
        inbox; any thread."""
        out = []
        for which, path in (("path", box.path), *box.destinations().items()):
            root = self.roots.get(path)
            why = root.problem()
            out.append((which, path, why, root.pinned))
        return out

    def _apply_folders(self, inbox: Inbox,
                       found: list[tuple[str, Path, str | None, bool]]) -> None:
        box, problems, missing, readable = inbox.cfg, [], False, True
        for which, path, why, pinned in found:
            key = (box.path, which)
            if which == "path" and why == MISSING:
                missing = True  # a share not mounted: inbox_missing, as ever
                continue
            if why is None or (why == MISSING and not pinned and box.create_folders):
                # as pinned (or a destination that ocrd makes on first use)
                if self.conditions.cleared(key):
                    log.info("folder_back", inbox=str(box.path), folder=which,
                             path=str(path))
                continue
            if why == MISSING and not pinned:  # never there: ocrd does not make it
                problems.append(f"its {_folder_word(which)} {str(path)!r} is not there (an "
                                "unmounted share? ocrd creates it only with "
                                "create_folders: true)")
                self.conditions.met(
                    key, "folder_missing", level="warning", inbox=str(box.path),
                    folder=which, path=str(path),
                    hint="the inbox takes no files until the folder is there: mount the "
                    "share, or create the folder (or set create_folders: true to let ocrd "
                    "create it)")
                continue
            problems.append(f"its {_folder_word(which)} {str(path)!r} {why}")
            readable = readable and which != "path"
            mount = self.roots.get(path).mount
            if mount is not None and why == unmounted(mount):
                self.conditions.met(
                    key, "folder_unmounted", level="warning", inbox=str(box.path),
                    folder=which, path=str(path), mount=str(mount),
                    hint="the inbox takes no files until the share is mounted there")
                continue
            self.conditions.met(
                key, "folder_replaced", level="error", inbox=str(box.path), folder=which,
                path=str(path), why=why, resolved=str(self.roots.get(path).real),
                hint="ocrd neither reads nor writes through it: the inbox is paused until "
                "the folder is back as it was, or `systemctl reload ocrd` accepts the "
                "folder that is there now (never a symbolic link)")
        if missing:
            self._inbox_missing(inbox)
        elif not inbox.available:
            log.info("inbox_back", inbox=str(box.path))
            inbox.available = True
            inbox.next_scan = 0.0
        if not readable and inbox.readable:
            self.observers.unwatch(box.path)
        inbox.blocked = "; ".join(problems) or None
        inbox.readable = readable
        if inbox.available and readable and not self.observers.alive(box.path):
            self._start_watch(inbox)

    def _inbox_missing(self, inbox: Inbox) -> None:
        if inbox.available:
            log.error("inbox_missing", inbox=str(inbox.path),
                      hint="is the share mounted? ocrd keeps looking")
        inbox.available = False
        self.observers.unwatch(inbox.path)

    def check_watches(self, now: float) -> None:
        """Replace observers that lost a thread; an inbox whose observers keep dying is
        polled instead."""
        for path, lost in self.observers.dead().items():
            inbox = self.by_path.get(path)
            self.observers.unwatch(path)
            if inbox is None:
                continue
            inbox.watch_deaths = [t for t in inbox.watch_deaths
                                  if now - t < WATCH_RESTART_WINDOW] + [now]
            inbox.next_scan = 0.0  # events may have been lost meanwhile
            if len(inbox.watch_deaths) > WATCH_RESTARTS:
                inbox.watch = "polling"
                inbox.tracker.fast_close = False
                log.error("watch_thread_died", inbox=str(path), threads=lost,
                          then="polling", hint="its inotify watch kept failing; the inbox "
                          "is scanned every poll_seconds instead")
                continue
            log.error("watch_thread_died", inbox=str(path), threads=lost, then="restarted")
            self._start_watch(inbox)

    # -- what is in them ------------------------------------------------------------------

    def start_scans(self, now: float, rescan: float, poll: float,
                    rescans: Callable[[], None]) -> None:
        """Start the scans that are due, each beside the intake loop (never awaited by
        it): a huge tree or a slow share costs the loop nothing."""
        for inbox in self.due_scans(now, rescan, poll):
            if inbox.scanning is None or inbox.scanning.done():
                inbox.scanning = asyncio.create_task(self._scan_reporting(inbox, rescans),
                                                     name="scan")

    async def _scan_reporting(self, inbox: Inbox, rescans: Callable[[], None]) -> None:
        try:
            await self.scan(inbox, rescans)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the next scan tries again
            log.exception("scan_failed", inbox=str(inbox.path), error=repr(e))
        finally:
            self.wake.set()

    async def scan(self, inbox: Inbox, rescans: Callable[[], None]) -> None:
        root = inbox.cfg.path
        self._apply_folders(inbox, await asyncio.to_thread(self._look_at_folders, inbox.cfg))
        if not inbox.available or not inbox.readable:
            return
        if inbox.watch == "inotify" and not self.observers.alive(root):
            self._start_watch(inbox)
        rescans()
        started = time.monotonic()
        seen_errors: set = set()
        too_deep: list[str] = []

        def on_error(folder: Path, e: OSError) -> None:
            key = (root, "scan", str(folder), e.errno)
            seen_errors.add(key)
            self.conditions.met(key, "scan_error", folder=str(folder),
                                error=e.strerror or str(e))

        unread = None if inbox.cfg.recursive else UnreadFiles()

        def listing() -> tuple[list[Entry], set[str], set[Key]]:
            """(the entries that are new or changed since the tracker saw them, the
            relative path of every entry, the kept originals among the new)."""
            candidates = inbox.tracker.candidates  # only read here (dict.get)
            fresh, listed = [], set()
            for entry in scan(root, inbox.cfg.recursive, inbox.ignore, on_error,
                              open_top=inbox.open_root, on_too_deep=too_deep.append,
                              stop=self._stopping.is_set, unread=unread):
                listed.add(entry.relpath)
                cand = candidates.get(entry.relpath)
                # an unchanged candidate is let go of at once: a rescan of a huge inbox
                # leaves nothing behind for the garbage collector
                if cand is None or cand.key() != (entry.size, entry.mtime_ns, entry.ino):
                    fresh.append(entry)
            regular = [e for e in fresh if e.regular]
            kept = self.kept_among(inbox, regular) if self.kept_among and regular else set()
            return fresh, listed, kept

        entries, listed, kept = await asyncio.to_thread(listing)
        for key in self.conditions.open_keys():
            if key[:2] == (root, "scan") and key not in seen_errors:
                self.conditions.cleared(key, "scan_error_gone", folder=key[2])
        self._report_too_deep(inbox, too_deep)
        self._report_unread(inbox, unread)
        inbox.kept |= kept
        # in parts, the loop free in between: a huge inbox must not hold it up (nor the
        # other inboxes, the console's questions, the watchdog)
        for start in range(0, len(entries), OBSERVE_SLICE):
            if inbox.removed:
                return
            for entry in entries[start:start + OBSERVE_SLICE]:
                if not (entry.regular and self._known_kept(inbox, entry)):
                    inbox.tracker.observe(entry)
            await asyncio.sleep(0)
        if inbox.removed:
            return
        names = list(inbox.tracker.candidates)
        for start in range(0, len(names), OBSERVE_SLICE):
            inbox.tracker.keep_only(listed, since=started,
                                    among=names[start:start + OBSERVE_SLICE])
            await asyncio.sleep(0)

    def _report_too_deep(self, inbox: Inbox, folders: list[str]) -> None:
        key = (inbox.path, "too_deep")
        if not folders:
            self.conditions.cleared(key, "folders_too_deep_gone", inbox=str(inbox.path))
            return
        self.conditions.met(key, "folders_too_deep", inbox=str(inbox.path),
                            folders=len(folders), first=folders[0], max_depth=MAX_DEPTH,
                            hint="folders more than max_depth levels below the inbox are "
                            "neither scanned nor watched: their files are not converted")

    def _report_unread(self, inbox: Inbox, unread: UnreadFiles | None) -> None:
        """Files in the subfolders of an inbox that does not read them: kept for status
        and the console, one log line when they first are there."""
        inbox.unread = unread if unread is not None and unread.files else None
        key = (inbox.path, "unread")
        if inbox.unread is None:
            self.conditions.cleared(key, "files_in_subfolders_gone", inbox=str(inbox.path))
            return
        self.conditions.met(key, "files_in_subfolders", level="info", inbox=str(inbox.path),
                            files=unread.files, first=unread.first,
                            hint="the inbox is not recursive: files in its subfolders are "
                            "not read (recursive: true reads them)")

    def observe(self, inbox: Inbox, entry: Entry, complete: bool = False) -> None:
        if entry.regular and self.is_kept(inbox, entry):
            return
        inbox.tracker.observe(entry, complete)

    @staticmethod
    def _known_kept(inbox: Inbox, entry: Entry) -> bool:
        """An original put back, as this daemon knows without asking (being put back
        now, or found so before)."""
        return (entry.size, entry.mtime_ns) in inbox.putting_back or \
            (entry.relpath, entry.size, entry.mtime_ns) in inbox.kept

    def _hint_from_thread(self, path: str, complete: bool, is_dir: bool) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self._loop.call_soon_threadsafe(self._hint, path, complete, is_dir)

    def _hint(self, path: str, complete: bool, is_dir: bool) -> None:
        self.hints.append((path, complete, is_dir))
        self.wake.set()

    def apply_hints(self) -> None:
        hints, self.hints = self.hints, []
        for path, complete, is_dir in hints:
            self._apply_hint(path, complete, is_dir)

    def _apply_hint(self, path: str, complete: bool, is_dir: bool) -> None:
        p = Path(path)
        for root, inbox in self.by_path.items():
            try:
                rel = p.relative_to(root)
            except ValueError:
                continue
            if not rel.parts or (not inbox.cfg.recursive and len(rel.parts) > 1):
                return
            relpath = "/".join(rel.parts)
            if is_dir:
                # A folder moved in with files inside produces no events for them.
                if inbox.cfg.recursive and not inbox.ignore.ignored_part(p.name):
                    inbox.next_scan = 0.0
                return
            if not inbox.ignore.wanted(relpath):
                return
            try:
                with inbox.open_root() as top, top.walk(rel.parts[:-1]) as folder:
                    st = folder.lstat(rel.parts[-1])
            except (OSError, ValueError):
                inbox.tracker.forget(relpath)
                return
            self.observe(inbox, entry_for(p, relpath, st), complete)
            return

    def next_wait(self, now: float) -> float:
        """Seconds until the next scan or candidate is due (at most 1)."""
        waits = [1.0] + [i.next_scan - now for i in self]
        waits += [w for i in self if (w := i.tracker.next_wakeup()) is not None]
        return max(0.02, min(waits))

    def due_scans(self, now: float, rescan: float, poll: float) -> list[Inbox]:
        due = []
        for inbox in self:
            if now >= inbox.next_scan:
                inbox.next_scan = now + (poll if inbox.watch == "polling" else rescan)
                due.append(inbox)
        return due
