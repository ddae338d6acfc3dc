"""The configured folders (inboxes, outboxes, archives, failed folders, the state
folder), pinned when the configuration is loaded, at start and at each reload.

Pinning a folder: its path with the links in it resolved (the admin's layout, as
check-config compares it), walked from / one component at a time without following any
link, kept open, and known by its identity (device and inode). Every later use walks the
same resolved path again, without following links, and goes on only when it reaches the
same folder. A folder that someone replaced by a symbolic link or by another folder while
ocrd runs — or one that is gone — is never used: nothing is read, moved or written
through it (RootChanged), and its inbox pauses until the folder is back as it was or a
reload pins what is there then.

A folder that is not there at load (an inbox on a share not mounted yet, an outbox the
configuration lets ocrd create: `create_folders`) is pinned when it first appears, or
when ocrd creates it; ocrd never creates a folder that was pinned and then went away
(an unmounted share would have it written onto the disk under the mount point).

A folder at or below one of `required_mounts` is used only while a filesystem is mounted
there (/proc/self/mountinfo), and pinned only then: the empty mount point of a share not
mounted yet is never taken for the share's folder.

The same folder after a network share was mounted again may have a new device number;
its filesystem id (statvfs f_fsid, the server's for NFS) and inode still say it is the
same folder.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from ocrd.safefs import Dir

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

MISSING = "is not there (an unmounted share?)"
LINKED = "is a symbolic link or not a folder now"
OTHER = "is another folder now (replaced or moved)"
MOUNTINFO = "/proc/self/mountinfo"


def unmounted(mount: Path) -> str:
    """Why a folder on the required mount `mount` is not used now."""
    return f"lies on {str(mount)!r}, where no filesystem is mounted (required_mounts)"


@dataclass(frozen=True)
class _Mount:
    id: int
    parent: int
    dev: str  # major:minor of the filesystem
    point: str


def _mounts(mountinfo: str) -> list[_Mount]:
    """The mounts this process sees, in /proc/self/mountinfo's order (empty when it
    cannot be read)."""
    out = []
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split(" - ", 1)[0].split()
                if len(fields) >= 5 and fields[0].isdigit() and fields[1].isdigit():
                    out.append(_Mount(int(fields[0]), int(fields[1]), fields[2],
                                      _unescape(fields[4])))
    except OSError:
        pass
    return out


def _unescape(text: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes (\040 ...)
    if "\\" not in text:
        return text
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def is_mounted(mount: Path, mountinfo: str = MOUNTINFO) -> bool:
    """Another filesystem is mounted at `mount` (its links resolved) than the one that
    holds the folder: the top of what is mounted there is not a bind mount of its parent
    filesystem — which the service's sandbox makes of every ReadWritePaths= folder, and
    which must not pass for the share."""
    point = os.path.realpath(mount)
    mounts = _mounts(mountinfo)
    here = [m for m in mounts if m.point == point]
    if not here:
        return False
    ids = {m.id for m in here}
    top = [m for m in here if not any(o.parent == m.id for o in here)][-1]
    bottom = next((m for m in here if m.parent not in ids), here[0])
    below = next((m for m in mounts if m.id == bottom.parent), None)
    return below is None or top.dev != below.dev


def mount_of(path: Path, mounts: list[Path]) -> Path | None:
    """The required mount that `path` lies at or below (the deepest), compared after
    resolving links; None if none."""
    real = Path(os.path.realpath(path))
    found = [(len(Path(os.path.realpath(m)).parts), m) for m in mounts
             if real == Path(os.path.realpath(m)) or Path(os.path.realpath(m)) in real.parents]
    return max(found, key=lambda f: f[0])[1] if found else None


class RootChanged(OSError):
    """A configured folder is not the one pinned at load: nothing goes through it."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(errno.ESTALE, f"the folder {why}", str(path))
        self.why = why


def _walk(real: Path, create: bool, mode: int) -> int:
    """The folder at the absolute path `real`, each component opened without following
    a link; created (with mode) where missing if asked."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in real.parts[1:]:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, mode, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fsid(fd: int) -> int:
    try:
        return os.fstatvfs(fd).f_fsid
    except OSError:
        return 0


class Root:
    """One configured folder, pinned (or waiting to be, while it is not there, or while
    its required mount `mount` has nothing mounted)."""

    def __init__(self, path: Path, real: Path | None = None, mount: Path | None = None) -> None:
        self.path = path
        self.real = real or Path(os.path.realpath(path))
        self.mount = mount
        self._lock = threading.Lock()
        self._fd = -1  # kept open: the inode cannot be reused while pinned
        self._ident: tuple[int, int, int] | None = None  # (dev, ino, fsid)
        if mount is None or is_mounted(mount):
            with contextlib.suppress(OSError):
                fd = _walk(self.real, False, 0)
                try:
                    self._pin(fd)
                finally:
                    os.close(fd)

    @property
    def pinned(self) -> bool:
        return self._ident is not None

    @property
    def ident(self) -> tuple[int, int, int] | None:
        """(st_dev, st_ino, f_fsid) of the folder pinned; None before it was there."""
        return self._ident

    def _pin(self, fd: int) -> None:
        st = os.fstat(fd)
        with self._lock:
            if self._ident is None:
                self._ident = (st.st_dev, st.st_ino, _fsid(fd))
                self._fd = os.dup(fd)

    def _same(self, fd: int) -> bool:
        assert self._ident is not None
        dev, ino, fsid = self._ident
        st = os.fstat(fd)
        if st.st_ino != ino:
            return False
        return st.st_dev == dev or (fsid != 0 and _fsid(fd) == fsid)

    def open(self, create: bool = False, mode: int = 0o755) -> Dir:
        """The folder, after making sure it is the pinned one (RootChanged if not).
        create: make it if it is not there and never was pinned (a destination)."""
        if self.mount is not None and not is_mounted(self.mount):
            raise RootChanged(self.path, unmounted(self.mount))
        try:
            fd = _walk(self.real, create and not self.pinned, mode)
        except FileNotFoundError:
            raise RootChanged(self.path, MISSING) from None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise RootChanged(self.path, LINKED) from None
            raise
        try:
            if not self.pinned:
                self._pin(fd)
            if not self._same(fd):
                raise RootChanged(self.path, OTHER)
        except BaseException:
            os.close(fd)
            raise
        return Dir(fd, self.path)

    def problem(self) -> str | None:
        """None while the folder is the pinned one (or pinned now, having appeared);
        else why it is not usable (MISSING, LINKED, OTHER)."""
        try:
            self.open().close()
        except RootChanged as e:
            return e.why
        except OSError as e:
            return f"cannot be opened ({e.strerror})"
        return None

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __repr__(self) -> str:
        return f"Root({str(self.path)!r}, pinned={self.pinned})"


class Roots:
    """Every configured folder by its configured path.

    A reload pins every folder anew at the path resolved when it was first pinned: a
    folder that was replaced by another folder is then taken as it is (the admin's
    reload says so); one replaced by a link still is not — links in a configured path
    are resolved once, when the folder first enters the configuration."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roots: dict[Path, Root] = {}
        self._mounts: list[Path] = []

    def pin(self, paths: list[Path], mounts: list[Path] | None = None
            ) -> dict[Path, tuple[Root | None, Root]]:
        """Pin these folders anew (and let go of those no longer configured); `mounts`:
        the required mounts (a folder on one is used only while it is mounted). Returns
        {path: (old root or None, new root)}."""
        with self._lock:
            known = dict(self._roots)
            self._mounts = list(mounts or [])
        fresh = {p: Root(p, known[p].real if p in known else None,
                         mount_of(p, self._mounts))
                 for p in dict.fromkeys(paths)}
        with self._lock:
            old, self._roots = self._roots, fresh
        for root in old.values():
            root.close()
        return {p: (old.get(p), r) for p, r in fresh.items()}

    def get(self, path: Path) -> Root:
        with self._lock:
            root = self._roots.get(path)
        if root is None:  # a folder that was not configured when the roots were pinned
            root = Root(path, mount=mount_of(path, self._mounts))
            with self._lock:
                root = self._roots.setdefault(path, root)
        return root

    def open(self, path: Path, create: bool = False, mode: int = 0o755) -> Dir:
        return self.get(path).open(create, mode)

    def close(self) -> None:
        with self._lock:
            roots, self._roots = self._roots, {}
        for root in roots.values():
            root.close()


def configured(cfg) -> list[Path]:  # noqa: ANN001 - config.Config
    """The folders of a configuration: the state folder and every inbox's."""
    paths = [cfg.state_dir]
    for box in cfg.inboxes:
        paths += [box.path, *box.destinations().values()]
    return paths
