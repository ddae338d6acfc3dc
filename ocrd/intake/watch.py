"""Finding files in inboxes: full scans (the truth) and watchdog events (hints).

Scans walk an inbox without following symlinks and report every entry that is not
ignored, down to MAX_DEPTH folders below the inbox (deeper folders are skipped and
reported: a chain of thousands of nested folders must cost neither the scan nor the
watch). inotify observers only tell the daemon to look sooner; on network filesystems,
where inotify misses other machines' writes, inboxes are polled by scanning instead.
An observer whose threads died is noticed (`Observers.dead`) and replaced.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog
from watchdog.events import (
    DirCreatedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.inotify import InotifyEmitter, InotifyObserver, InotifyWatchGroup
from watchdog.observers.inotify_c import InotifyConstants, InotifyEvent, InotifyFD, Mask
from watchdog.observers.inotify_move_event_grouper import PathedInotifyEvent

from ocrd.config.settings import BUILTIN_IGNORE, InboxConfig
from ocrd.safefs import Dir

log = structlog.get_logger("ocrd.intake.watch")

NETWORK_FS = {
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "afs", "lustre",
    "gpfs", "davfs", "virtiofs", "vboxsf", "vmhgfs", "ncpfs", "beegfs", "ocfs2", "gfs2",
}

# folders below an inbox that a recursive scan or watch enters; deeper ones are skipped
MAX_DEPTH = 64
# entries looked at, per scan, to count the files in a non-recursive inbox's subfolders
# (which it does not read): a big tree there costs a scan no more than this
SUBFOLDER_LOOK = 2000


def fs_type(path: Path) -> str:
    """The filesystem type of the mount holding `path`, from /proc/self/mountinfo."""
    real = os.path.realpath(path)
    best, best_type = "", "unknown"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) < 5 or not right:
                    continue
                mount = _unescape(fields[4])
                if (real == mount or real.startswith(mount.rstrip("/") + "/")) and \
                        len(mount) >= len(best):
                    best, best_type = mount, right.split()[0]
    except OSError:
        pass
    return best_type


def _unescape(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...)
    return text.encode().decode("unicode_escape") if "\\" in text else text


def is_network_fs(kind: str) -> bool:
    return kind in NETWORK_FS or kind.startswith("fuse")


def watch_method(inbox: InboxConfig) -> str:
    """How an inbox is watched (inotify or polling): polling on network filesystems under
    `auto`."""
    if inbox.watch != "auto":
        return inbox.watch
    return "polling" if is_network_fs(fs_type(inbox.path)) else "inotify"


class Ignore:
    """Built-in plus configured ignore patterns, and the include patterns. Each list is
    matched as one regular expression (a scan asks for every entry of the inbox)."""

    def __init__(self, inbox: InboxConfig) -> None:
        self._set([p.lower() for p in (*BUILTIN_IGNORE, *inbox.ignore)],
                  [p.lower() for p in inbox.include])

    @classmethod
    def rules(cls, ignore: Iterable[str], include: Iterable[str]) -> Ignore:
        """The rules from patterns alone (a folder given to `ocrd convert`)."""
        made = cls.__new__(cls)
        made._set([p.lower() for p in ignore], [p.lower() for p in include])
        return made

    def _set(self, ignore: list[str], include: list[str]) -> None:
        self.ignore = ignore
        self.include = include
        # what any(fnmatch.fnmatchcase(name, p) for p in patterns) says, in one match
        self._ignore = _one_pattern(ignore)
        self._include = _one_pattern(include)

    def ignored_part(self, name: str) -> bool:
        return self._ignore.match(name.lower()) is not None

    def wanted(self, relpath: str) -> bool:
        """True if no component is ignored and the file name is included."""
        parts = relpath.split("/")
        if any(self.ignored_part(p) for p in parts):
            return False
        return self.included(parts[-1])

    def included(self, name: str) -> bool:
        """The file name matches an include pattern (whether it is ignored aside)."""
        return self._include.match(name.lower()) is not None


def _one_pattern(patterns: list[str]) -> re.Pattern[str]:
    if not patterns:
        return re.compile(r"(?!)")  # matches nothing
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


@dataclass(frozen=True)
class Entry:
    """An inbox entry a scan found. `regular` is False for symlinks, FIFOs, sockets and
    devices: those are never opened, only reported. `path` is for messages: ocrd never
    opens an entry by it (safefs walks from the inbox's folder instead). A string, not a
    Path: one object for the garbage collector to look at per entry, not three (an
    inbox may hold a great many, and a full collection holds up the loop)."""

    path: str
    relpath: str
    size: int
    mtime_ns: int
    ino: int
    regular: bool


def entry_for(path: Path | str, relpath: str, st: os.stat_result) -> Entry:
    return Entry(os.fspath(path), relpath, st.st_size, st.st_mtime_ns, st.st_ino,
                 stat.S_ISREG(st.st_mode))


def scan(root: Path, recursive: bool, ignore: Ignore,
         on_error: Callable[[Path, OSError], None] | None = None, *,
         open_top: Callable[[], Dir] | None = None, max_depth: int = MAX_DEPTH,
         on_too_deep: Callable[[str], None] | None = None,
         stop: Callable[[], bool] | None = None,
         unread: UnreadFiles | None = None) -> Iterator[Entry]:
    """Every wanted entry under root (opened with `open_top`, else by its path).
    Folders are entered through their parent's descriptor, never through a link: a
    subfolder replaced by a symbolic link is an entry like any other link (reported, not
    followed). Folders more than `max_depth` levels down are not entered
    (`on_too_deep(relpath)`); `stop()` true ends the scan early. Not `recursive`: the
    wanted files in subfolders, which are not read, are counted into `unread`."""
    def failed(folder: Path, e: OSError) -> None:
        if on_error is not None:
            on_error(folder, e)

    try:
        top = open_top() if open_top is not None else Dir.open_root(root)
    except OSError as e:
        failed(root, e)
        return
    top_path = os.fspath(root)
    with top:
        stack: list[tuple[str, ...]] = [()]
        while stack:
            if stop is not None and stop():
                return
            parts = stack.pop()
            prefix = "".join(p + "/" for p in parts)
            try:
                with top.walk(parts) as folder:
                    entries = list(_listing(folder))
            except OSError as e:
                failed(root.joinpath(*parts), e)
                continue
            for name, mode, size, mtime_ns, ino in entries:
                if mode is None or ignore.ignored_part(name):
                    continue
                rel = prefix + name
                if stat.S_ISDIR(mode):
                    if not recursive:
                        if unread is not None:
                            unread.count(top, rel, ignore, max_depth)
                        continue
                    if len(parts) >= max_depth:
                        if on_too_deep is not None:
                            on_too_deep(rel)
                        continue
                    stack.append((*parts, name))
                    continue
                if ignore.included(name):  # its folders and itself are not ignored
                    yield Entry(f"{top_path}/{rel}", rel, size, mtime_ns, ino,
                                stat.S_ISREG(mode))


@dataclass
class UnreadFiles:
    """Wanted files in the subfolders of an inbox that does not read them (not
    recursive), counted by a scan: at most SUBFOLDER_LOOK entries are looked at
    (`complete` False when there was more)."""

    files: int = 0
    first: str | None = None  # one of them, relative to the inbox
    looked: int = 0
    complete: bool = True

    def count(self, top: Dir, folder: str, ignore: Ignore, max_depth: int) -> None:
        stack = [tuple(folder.split("/"))]
        while stack:
            parts = stack.pop()
            try:
                with top.walk(parts) as sub:
                    entries = list(_listing(sub))
            except OSError:
                continue
            for name, mode, *_ in entries:
                if self.looked >= SUBFOLDER_LOOK:
                    self.complete = False
                    return
                self.looked += 1
                if mode is None or ignore.ignored_part(name):
                    continue
                if stat.S_ISDIR(mode):
                    if len(parts) < max_depth:
                        stack.append((*parts, name))
                    continue
                rel = "/".join((*parts, name))
                if stat.S_ISREG(mode) and ignore.wanted(rel):
                    self.files += 1
                    self.first = self.first or rel


Listed = tuple[str, int | None, int, int, int]  # (name, mode, size, mtime_ns, inode)


def _listing(folder: Dir) -> Iterator[Listed]:
    """Each entry's name and what lstat says of it (mode None: it vanished between list
    and stat). Plain strings and numbers: a folder of a great many entries is held as
    a list of them while it is gone through, and the garbage collector lets such
    tuples be at once, where it would keep looking at tuples holding a stat result."""
    for de in folder.entries():
        try:
            st = de.stat(follow_symlinks=False)
        except FileNotFoundError:
            yield de.name, None, 0, 0, 0
            continue
        yield de.name, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino


Hint = Callable[[str, bool, bool], None]  # (path, closed_after_write, is_dir)


class _Handler(FileSystemEventHandler):
    def __init__(self, hint: Hint) -> None:
        self.hint = hint

    def on_any_event(self, event: FileSystemEvent) -> None:
        moved = isinstance(event, FileMovedEvent | DirMovedEvent)
        path = event.dest_path if moved else event.src_path
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not path:
            return  # moved out of the watched tree (IN_MOVED_FROM without its pair)
        # A file renamed into place (IN_MOVED_TO: "write elsewhere, then mv") is as
        # complete as one closed after writing: both take the fast path.
        done = isinstance(event, FileClosedEvent) or (moved and not event.is_directory)
        self.hint(path, done, event.is_directory)


EVENTS = [FileCreatedEvent, FileModifiedEvent, FileMovedEvent, FileClosedEvent,
          DirCreatedEvent, DirMovedEvent]


def _folders_below(path: bytes, limit: int) -> Iterator[tuple[bytes, list[bytes], list[bytes]]]:
    """(folder, subfolders, files) for path and the folders below it, at most `limit`
    levels down, without following links or entering dot-folders; iterative (watchdog's
    os.walk recurses: a chain of nested folders a few thousand deep killed its thread
    with RecursionError)."""
    stack = [(path, 0)]
    while stack:
        folder, depth = stack.pop()
        dirs: list[bytes] = []
        files: list[bytes] = []
        try:
            with os.scandir(folder) as it:
                for de in it:
                    try:
                        is_dir = de.is_dir(follow_symlinks=False)
                    except OSError:
                        continue
                    (dirs if is_dir else files).append(de.name)
        except OSError:
            continue
        dirs = [d for d in dirs if not d.startswith(b".")]
        yield folder, dirs, files
        if depth < limit:
            stack.extend((os.path.join(folder, d), depth + 1) for d in dirs)


class _InboxWatchGroup(InotifyWatchGroup):
    """A recursive watch that leaves out dot-folders (ignored by every scan anyway), above
    all ocrd's own `.ocrd-work/`: every claim makes a folder there, so watching each one
    would give a busy recursive inbox thousands of watches, and watchdog formats its
    whole table into a warning at each re-added one (a long fuzzer run slowed to a
    fraction of its claims per second). Folders deeper than MAX_DEPTH are not watched,
    and the tree is walked without recursion."""

    def _depth(self, path: bytes) -> int:
        rel = os.path.relpath(path, self.path) if path != self.path else b""
        return 0 if rel in (b"", b".") else rel.count(b"/") + 1

    def _add_callback(self, path: bytes) -> None:
        rel = os.path.relpath(path, self.path) if path != self.path else b""
        if any(part.startswith(b".") for part in rel.split(b"/") if part):
            return
        if self._depth(path) > MAX_DEPTH:
            return
        super()._add_callback(path)

    def _add_all_callbacks(self, path: bytes) -> None:
        self._add_callback(path)
        if not self.is_recursive or not os.path.isdir(path):
            return
        room = MAX_DEPTH - self._depth(path)
        for folder, dirs, _files in _folders_below(path, max(0, room - 1)):
            for name in dirs:
                self._add_callback(os.path.join(folder, name))

    def _recursive_simulate(self, src_path: bytes) -> list[InotifyEvent]:
        events = []
        room = MAX_DEPTH - self._depth(src_path)
        for folder, dirs, files in _folders_below(src_path, max(0, room)):
            wd = self._active_callbacks_by_path.get(folder)
            if wd is None:
                continue
            for name in dirs:
                events.append(InotifyEvent(wd, Mask(InotifyConstants.IN_CREATE
                                                    | InotifyConstants.IN_ISDIR), 0, name))
            for name in files:
                events.append(InotifyEvent(wd, InotifyConstants.IN_CREATE, 0, name))
        return events


class _FlatInboxEmitter(InotifyEmitter):
    """An inotify emitter that reports a file moved in as moved (watchdog's "full
    events"), not as created, and does not ask for IN_MOVED_FROM on a non-recursive
    watch.

    Moved, not created: IN_MOVED_TO means the file is complete (renamed into place),
    IN_CREATE that it is about to be written; watchdog's default emitter reports both
    as FileCreatedEvent.

    watchdog holds every IN_MOVED_FROM for 0.5 s to pair it with its IN_MOVED_TO, and
    delivers nothing behind it meanwhile. Each claim renames a file out of the inbox
    (into .ocrd-work/, never watched), so every claim stalled the next file's events by up
    to half a second. In a flat inbox nothing is lost without it: a rename inside the
    inbox (x.part → x.pdf) still arrives as IN_MOVED_TO, reported as moved in.

    A folder moved in is reported as itself, not with an event for each entry inside
    (watchdog walks it recursively for those: ocrd rescans instead). `reader` is the
    thread that reads the observer's inotify instance (one per observer, so per inbox):
    it is watched for its life like the emitter's own."""

    @property
    def reader(self) -> InotifyFD:
        return self._inotify_fd

    def build_and_queue_event(self, event, *, full_events: bool = False) -> None:  # noqa: ANN001
        if self.watch.is_recursive and _folder_moved(event):
            if not isinstance(event, PathedInotifyEvent):  # a (from, to) pair
                src, dst = (self._decode_path(e.path) for e in event)
                self.queue_event(DirMovedEvent(src, dst))
            else:
                self.queue_event(DirMovedEvent("", self._decode_path(event.path)))
            return
        super().build_and_queue_event(event, full_events=True)

    def on_thread_start(self) -> None:
        self._inotify = _InboxWatchGroup(
            self._inotify_fd, os.fsencode(self.watch.path),
            is_recursive=self.watch.is_recursive,
            event_mask=self.get_event_mask_from_filter(),
            follow_symlink=self.watch.follow_symlink)

    def get_event_mask_from_filter(self) -> Mask:
        mask = super().get_event_mask_from_filter()
        if not self.watch.is_recursive:
            mask = Mask(mask & ~InotifyConstants.IN_MOVED_FROM)
        return mask


def _folder_moved(event) -> bool:  # noqa: ANN001 - watchdog's grouped inotify event
    if not isinstance(event, PathedInotifyEvent):  # a (from, to) pair
        return event[0].ev.is_directory
    return event.ev.is_moved_to and event.ev.is_directory


def _observer() -> InotifyObserver:
    observer = InotifyObserver()
    if hasattr(observer, "_emitter_class"):  # watchdog 7.x: the class it instantiates
        observer._emitter_class = _FlatInboxEmitter
    return observer


class Observers:
    """inotify observers for the inboxes that use them. Starting one can fail (watch
    limit reached, folder missing): the inbox then falls back to polling, with a
    warning. An observer one of whose threads died (its dispatcher, its emitter, or its
    inotify reader) is `dead`: the inbox replaces it."""

    def __init__(self, hint: Hint) -> None:
        self.hint = hint
        self._observers: dict[Path, InotifyObserver] = {}

    def watch(self, inbox: InboxConfig) -> bool:
        if inbox.path in self._observers:
            return True
        observer = _observer()
        try:
            observer.schedule(_Handler(self.hint), str(inbox.path), recursive=inbox.recursive,
                              event_filter=EVENTS)
            observer.start()
        except OSError as e:
            log.warning("inotify_unavailable", inbox=str(inbox.path), error=str(e),
                        fallback="polling")
            _stop(observer)
            return False
        self._observers[inbox.path] = observer
        return True

    def unwatch(self, path: Path) -> None:
        observer = self._observers.pop(path, None)
        if observer is not None:
            _stop(observer)

    def alive(self, path: Path) -> bool:
        observer = self._observers.get(path)
        return observer is not None and not _dead_threads(observer)

    def dead(self) -> dict[Path, list[str]]:
        """Watched inboxes whose observer lost a thread: the threads' names."""
        out = {}
        for path, observer in list(self._observers.items()):
            lost = _dead_threads(observer)
            if lost:
                out[path] = lost
        return out

    def stop(self) -> None:
        for path in list(self._observers):
            self.unwatch(path)


def _threads(observer: InotifyObserver) -> list:
    threads = [observer]
    for emitter in list(getattr(observer, "emitters", ())):
        threads.append(emitter)
        reader = getattr(emitter, "reader", None)
        if reader is not None:
            threads.append(reader)
    return threads


def _dead_threads(observer: InotifyObserver) -> list[str]:
    return [t.name for t in _threads(observer) if not t.is_alive()]


def _stop(observer: InotifyObserver) -> None:
    try:
        observer.stop()  # its emitters, and its inotify reader
    except OSError as e:  # a broken one (its inotify descriptor gone) cannot unwatch
        log.debug("observer_stop_failed", error=str(e))
    if observer.is_alive():
        observer.join(timeout=5)
