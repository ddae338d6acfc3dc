"""The inboxes the daemon watches: each one's state, the add/change/remove diff of a
reload, and what scans and inotify hints show in them.

A reload changes an inbox in place (its settings, ignore rules, watch mode and readiness
periods): the files it has claimed and queued keep going. An inbox removed by a reload
stops taking files; what it had claimed still converts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from . import outbox
from .config import InboxConfig
from .readiness import Tracker
from .safefs import Dir
from .watch import WORK_DIR_NAME, Entry, Ignore, Observers, entry_for, scan, watch_method

log = structlog.get_logger("ocrd.inboxes")

OWNER_FILE = ".owner"


@dataclass
class Inbox:
    cfg: InboxConfig
    ignore: Ignore
    tracker: Tracker
    watch: str  # inotify | polling
    instance: str
    perms: outbox.Perms
    next_scan: float = 0.0
    available: bool = True
    removed: bool = False  # taken out by a reload: no new claims
    paused_until: float = 0.0  # a destination failed: no new claims until then
    # originals put back after conversion (on_success: keep): (relpath, size, mtime_ns)
    kept: set[tuple[str, int, int]] = field(default_factory=set)
    # (size, mtime_ns) of originals being put back right now, from a worker thread: the
    # intake may see one in the inbox before it is in `kept` (and convert it again)
    putting_back: list[tuple[int, int]] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.cfg.path

    @property
    def work_path(self) -> Path:
        return self.cfg.path / WORK_DIR_NAME / self.instance

    def open_root(self) -> Dir:
        return Dir.open_root(self.cfg.path)

    def open_work(self, create: bool = False) -> Dir:
        """This daemon's work area in the inbox, `.ocrd-work/<instance>/` (0700: other
        users of a shared inbox cannot reach into claimed files)."""
        with self.open_root() as root:
            if not create:
                return root.walk((WORK_DIR_NAME, self.instance))
            with root.mkdir(WORK_DIR_NAME, self.perms.dir_mode, self.perms.gid) as work:
                return work.mkdir(self.instance, 0o700)

    def taking_files(self, now: float) -> bool:
        return self.available and not self.removed and self.paused_until <= now

    def mark_owner(self, state_dir: Path) -> None:
        """Say in the work area whose it is, so that a later instance on this host can
        adopt it if this one's state is lost (recovery.py)."""
        body = json.dumps({"host": host_id(), "state_dir": str(state_dir),
                           "instance": self.instance}).encode()
        with self.open_work(create=True) as work:
            outbox.write_atomic(work, OWNER_FILE, body, outbox.Perms(0o600, tag="owner"))


def host_id() -> str:
    """This machine: its machine-id where there is one, else its host name."""
    with contextlib.suppress(OSError):
        ident = Path("/etc/machine-id").read_text().strip()
        if ident:
            return ident
    return socket.gethostname()


def perms_for(box: InboxConfig, instance: str) -> outbox.Perms:
    return outbox.Perms(box.file_mode_bits, box.dir_mode_bits, box.gid, instance[:8])


Hint = tuple[str, bool, bool]  # (path, complete (closed/moved in), is_dir)


class Inboxes:
    """Every inbox by path, their watches, and the hints inotify sends from its thread."""

    def __init__(self, instance: str, is_kept: Callable[[Inbox, Entry], bool]) -> None:
        self.instance = instance
        self.is_kept = is_kept
        self.by_path: dict[Path, Inbox] = {}
        self.observers = Observers(self._hint_from_thread)
        self.hints: list[Hint] = []
        self.wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def __iter__(self):
        return iter(list(self.by_path.values()))

    def __len__(self) -> int:
        return len(self.by_path)

    def get(self, path: Path) -> Inbox | None:
        return self.by_path.get(path)

    # -- add, change, remove --------------------------------------------------------------

    def add(self, box: InboxConfig) -> Inbox:
        watch = watch_method(box)
        inbox = Inbox(box, Ignore(box), Tracker(box.quiet_seconds, box.incomplete_seconds,
                                                fast_close=watch == "inotify"),
                      watch, self.instance, perms_for(box, self.instance))
        self.by_path[box.path] = inbox
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
        inbox.tracker.incomplete = box.incomplete_seconds
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
        self.observers.unwatch(path)
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
        return added

    def _start_watch(self, inbox: Inbox) -> None:
        if inbox.watch == "inotify" and inbox.cfg.path.is_dir() and \
                not self.observers.watch(inbox.cfg):
            inbox.watch = "polling"
            inbox.tracker.fast_close = False

    def stop(self) -> None:
        self.observers.stop()

    # -- what is in them ------------------------------------------------------------------

    async def scan(self, inbox: Inbox, rescans: Callable[[], None]) -> None:
        root = inbox.cfg.path
        if not root.is_dir():
            if inbox.available:
                log.error("inbox_missing", inbox=str(root),
                          hint="is the share mounted? ocrd keeps looking")
            inbox.available = False
            self.observers.unwatch(root)
            return
        if not inbox.available:
            log.info("inbox_back", inbox=str(root))
            inbox.available = True
        if inbox.watch == "inotify" and not self.observers.alive(root):
            self._start_watch(inbox)
        rescans()

        def on_error(folder: Path, e: OSError) -> None:
            log.warning("scan_error", folder=str(folder), error=e.strerror)

        entries = await asyncio.to_thread(
            lambda: list(scan(root, inbox.cfg.recursive, inbox.ignore, on_error)))
        for entry in entries:
            self.observe(inbox, entry)
        inbox.tracker.keep_only({e.relpath for e in entries})

    def observe(self, inbox: Inbox, entry: Entry, complete: bool = False) -> None:
        if entry.regular and self.is_kept(inbox, entry):
            return
        inbox.tracker.observe(entry, complete)

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


def remove_empty(folder: Dir, parts: tuple[str, ...]) -> None:
    """Remove the empty folders folder/parts[0]/…/parts[-1], deepest first."""
    for depth in range(len(parts), 0, -1):
        try:
            with folder.walk(parts[:depth - 1]) as parent:
                parent.rmdir(parts[depth - 1])
        except OSError:
            return
