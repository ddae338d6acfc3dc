"""Paths below ocrd's folders, walked through directory file descriptors.

A configured folder (an inbox, an outbox, …) is opened once by its path — the admin's
path, symbolic links in it resolved at check-config. Below it, nothing is ever reached by
a path string: every component is opened relative to its parent with
O_NOFOLLOW|O_DIRECTORY, so a folder that a user replaces by a symbolic link is refused,
never followed; files are opened with O_NOFOLLOW, created with O_EXCL, and given their
final names with link()/renameat2(RENAME_NOREPLACE), so no name ocrd creates can replace
an entry it did not write. Where ocrd means to replace (its own earlier result), the
caller says so.

A file that ocrd opened is read by other processes (render workers, poppler) through
`fd_path(fd)` — /proc/PID/fd/N, which names that open file whatever happens to its path.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_RENAME_NOREPLACE = 1


class Blocked(OSError):
    """A path component is there but is not a folder ocrd may enter (a file, a symbolic
    link, a device …)."""


def _blocked(path: str, what: str) -> Blocked:
    return Blocked(errno.ENOTDIR, f"{what} (ocrd never follows links or enters "
                   "anything but a real folder)", path)


class Dir:
    """An open folder: its descriptor, and its path (for messages and logs only)."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open_root(cls, path: Path, create: bool = False, mode: int = 0o755) -> Dir:
        """A configured folder, by its path (created if asked)."""
        if create:
            path.mkdir(parents=True, exist_ok=True, mode=mode)
        return cls(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Dir({str(self.path)!r}, fd={self.fd})"

    # -- folders ----------------------------------------------------------------------

    def sub(self, name: str) -> Dir:
        """The subfolder `name`, never through a link."""
        _check_part(name)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _blocked(str(self.path / name), "not a folder") from None
            raise
        return Dir(fd, self.path / name)

    def walk(self, parts: tuple[str, ...] | list[str]) -> Dir:
        """The folder at parts below this one (an empty tuple: a new handle on this)."""
        cur = Dir(os.dup(self.fd), self.path)
        for part in parts:
            _check_part(part)
            try:
                nxt = cur.sub(part)
            finally:
                cur.close()
            cur = nxt
        return cur

    def mkdir(self, name: str, mode: int = 0o755, gid: int | None = None) -> Dir:
        """The subfolder `name`, created (mode, group) if it is not there.

        With a group to give, it is made private first and opened up once the group is
        set. Without, it is made with `mode` at once: in a setgid folder (a share laid
        out like systemd/ocrd.tmpfiles) it then takes the setgid bit and group from its
        parent, and is only changed where the result differs from `mode`, so that
        "2770" needs no chmod with the setgid bit — which the unit's
        RestrictSUIDSGID=yes refuses (EPERM)."""
        _check_part(name)
        try:
            os.mkdir(name, 0o700 if gid is not None else mode & 0o777, dir_fd=self.fd)
            created = True
        except FileExistsError:
            created = False
        d = self.sub(name)
        if created:
            try:
                if gid is not None:
                    os.fchown(d.fd, -1, gid)
                if gid is not None or stat.S_IMODE(os.fstat(d.fd).st_mode) != mode:
                    os.fchmod(d.fd, mode)
            except BaseException:
                d.close()
                raise
        return d

    def entries(self) -> Iterator[os.DirEntry]:
        with os.scandir(self.fd) as it:
            yield from it

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    # -- entries ----------------------------------------------------------------------

    def lstat(self, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def exists(self, name: str) -> bool:
        try:
            self.lstat(name)
        except FileNotFoundError:
            return False
        return True

    def open_file(self, name: str) -> int:
        """A regular file, opened for reading: never a link; a FIFO is not waited on and
        a device never opened (looked at first, checked again once open)."""
        _check_part(name)
        if not stat.S_ISREG(self.lstat(name).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(self.path / name))
        fd = os.open(name, _FILE_FLAGS, dir_fd=self.fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", str(self.path / name))
        return fd

    def read_file(self, name: str, limit: int = 1 << 24) -> bytes:
        fd = self.open_file(name)
        try:
            return os.read(fd, limit)
        finally:
            os.close(fd)

    def unlink(self, name: str) -> None:
        _check_part(name)
        os.unlink(name, dir_fd=self.fd)

    def rmdir(self, name: str) -> None:
        _check_part(name)
        os.rmdir(name, dir_fd=self.fd)

    def create(self, name: str, mode: int = 0o600) -> int:
        """A new file opened for writing; fails if anything has the name."""
        _check_part(name)
        return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                       | os.O_CLOEXEC, mode, dir_fd=self.fd)

    def rename(self, name: str, dest: Dir, new: str, replace: bool = False) -> None:
        """Give the entry `name` the name `new` in `dest`. Without `replace` an existing
        entry of that name is never replaced (FileExistsError)."""
        _check_part(name)
        _check_part(new)
        if replace:
            os.rename(name, new, src_dir_fd=self.fd, dst_dir_fd=dest.fd)
        else:
            rename_noreplace(self.fd, name, dest.fd, new)

    def remove_tree(self, name: str) -> None:
        """Remove the folder `name` and everything in it, never following a link."""
        try:
            d = self.sub(name)
        except (FileNotFoundError, Blocked):
            return
        with d:
            for entry in list(d.entries()):
                if entry.is_dir(follow_symlinks=False):
                    d.remove_tree(entry.name)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        d.unlink(entry.name)
        with contextlib.suppress(FileNotFoundError):
            self.rmdir(name)

    def remove_empty(self, parts: tuple[str, ...]) -> None:
        """Remove the empty folders parts[0]/…/parts[-1] below this one, deepest first;
        stops at the first that is not empty (or not there)."""
        for depth in range(len(parts), 0, -1):
            try:
                with self.walk(parts[:depth - 1]) as parent:
                    parent.rmdir(parts[depth - 1])
            except OSError:
                return

    def fsync(self) -> None:
        os.fsync(self.fd)


def _check_part(part: str) -> None:
    if part in ("", ".", "..") or "/" in part or "\0" in part:
        raise ValueError(f"unsafe path component {part!r}")


def split(relpath: str) -> tuple[tuple[str, ...], str]:
    """A relative path as (folders, name), refusing '', '.', '..' and absolute paths."""
    parts = relpath.split("/")
    for part in parts:
        _check_part(part)
    return tuple(parts[:-1]), parts[-1]


# -- renames that never replace ----------------------------------------------------------

_libc: ctypes.CDLL | None = None
_noreplace_works = True


def _renameat2(src_fd: int, src: str, dst_fd: int, dst: str, flags: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fn = _libc.renameat2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                   ctypes.c_uint]
    if fn(src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)


def rename_noreplace(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    """renameat2(RENAME_NOREPLACE); where the filesystem or libc lacks it (some network
    filesystems), link + unlink for files and a checked rename for folders."""
    global _noreplace_works
    if _noreplace_works:
        try:
            _renameat2(src_fd, src, dst_fd, dst, _RENAME_NOREPLACE)
            return
        except AttributeError:
            _noreplace_works = False
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                if e.errno == errno.EEXIST:
                    raise FileExistsError(errno.EEXIST, "exists", dst) from None
                raise
    st = os.stat(src, dir_fd=src_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.link(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EMLINK, errno.EOPNOTSUPP):
                raise
        else:
            os.unlink(src, dir_fd=src_fd)
            return
    try:
        os.stat(dst, dir_fd=dst_fd, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        return
    raise FileExistsError(errno.EEXIST, "exists", dst)


# -- a file for other processes ------------------------------------------------------------

FD_PATH_PREFIX = "/proc/"


def fd_path(fd: int) -> str:
    """A path other processes of this user open to read exactly this open file."""
    return f"/proc/{os.getpid()}/fd/{fd}"


def is_fd_path(path: str) -> bool:
    if not path.startswith(FD_PATH_PREFIX):
        return False
    parts = path.split("/")
    return len(parts) == 5 and parts[2].isdigit() and parts[3] == "fd" and parts[4].isdigit()
