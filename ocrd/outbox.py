"""Writing results: atomic files, mirrored folders, collision-safe names, permissions,
and moving originals to the archive or the failed folder.

Every write goes to a temporary name in the destination folder, is fsynced, and is
renamed into place, so a reader never sees a partial file. Every destination path is
built from a configured root plus the file's path relative to its inbox, and checked to
stay inside that root whatever the file is called.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from . import names

NAME_MAX = 255
TMP_PREFIX = ".ocrd-tmp-"


class UnsafePath(Exception):
    """A relative path that would leave its root."""


@dataclass(frozen=True)
class Perms:
    file_mode: int = 0o644
    dir_mode: int = 0o755
    gid: int | None = None
    # marks this daemon's temporary names, so that a restart removes its own leftovers
    # and never another daemon's work in progress on a shared outbox
    tag: str = "0"

    def tmp_name(self, final: str) -> str:
        return f"{TMP_PREFIX}{self.tag}-{secrets.token_hex(4)}-{fit_name(final, '', 40)}"


def safe_join(root: Path, relpath: str) -> Path:
    """root/relpath, refusing absolute paths, `..` and empty components."""
    parts = PurePosixPath(relpath).parts
    if not parts or PurePosixPath(relpath).is_absolute():
        raise UnsafePath(f"not a relative path: {relpath!r}")
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "\0" in part:
            raise UnsafePath(f"unsafe path component {part!r} in {relpath!r}")
    path = root.joinpath(*parts)
    if os.path.commonpath([os.path.abspath(root), os.path.abspath(path)]) != \
            os.path.abspath(root):
        raise UnsafePath(f"{relpath!r} leaves {root}")
    return path


def fit_name(stem: str, suffix: str, reserve: int = 0) -> str:
    """stem+suffix, shortened so that it (plus `reserve` bytes for temp prefixes and
    longer siblings like `.error.json`) fits in one file name."""
    limit = NAME_MAX - reserve
    name = stem + suffix
    if names.nbytes(name) <= limit:
        return name
    raw = stem.encode("utf-8", "surrogateescape")
    digest = hashlib.sha256(raw).hexdigest()[:8]
    room = limit - names.nbytes(suffix) - len(digest) - 1
    cut = raw[: max(room, 1)]
    # A UTF-8 name is cut at a character boundary; a name that is not UTF-8 keeps its
    # bytes as they are.
    short = cut.decode("utf-8", "ignore") if names.utf8(stem) else \
        cut.decode("utf-8", "surrogateescape")
    return f"{short}~{digest}{suffix}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs(root: Path, sub: PurePosixPath | None, perms: Perms) -> Path:
    """Create root/sub (mirrored inbox subfolders) with the configured mode and group."""
    if sub is not None and sub.parts:
        safe_join(root, sub.as_posix())  # never outside root, whatever a folder is called
    root.mkdir(parents=True, exist_ok=True)
    path = root
    for part in (sub.parts if sub else ()):
        path = path / part
        try:
            os.mkdir(path, perms.dir_mode)
        except FileExistsError:
            continue
        _apply(path, perms.dir_mode, perms.gid)
    return path


def _apply(path: Path | int, mode: int, gid: int | None) -> None:
    if isinstance(path, int):
        os.fchmod(path, mode)
        if gid is not None:
            os.fchown(path, -1, gid)
    else:
        os.chmod(path, mode)
        if gid is not None:
            os.chown(path, -1, gid)


def write_atomic(path: Path, data: bytes, perms: Perms) -> None:
    tmp = path.with_name(perms.tmp_name(path.name))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
            f.flush()
        _apply(fd, perms.file_mode, perms.gid)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def write_dir_atomic(path: Path, files: Iterable[tuple[str, bytes]], perms: Perms) -> None:
    """A folder of files that appears whole: built under a temporary name, then renamed.
    An existing folder of the same name (an earlier run of the same document) is
    replaced."""
    tmp = path.with_name(perms.tmp_name(path.name))
    os.mkdir(tmp, 0o700)
    try:
        for name, data in files:
            write_atomic(tmp / name, data, perms)
        _apply(tmp, perms.dir_mode, perms.gid)
        fsync_dir(tmp)
        if path.exists():
            old = path.with_name(perms.tmp_name("old"))
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)


def move_file(src: Path, dest: Path, perms: Perms | None = None) -> None:
    """Rename src to dest (dest must not exist); across filesystems, copy durably and
    then remove the source. Never follows a symlink."""
    try:
        os.link(src, dest, follow_symlinks=False)
    except OSError as e:
        if e.errno == errno.EXDEV:
            _copy_then_remove(src, dest, perms)
            return
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EMLINK, errno.EOPNOTSUPP):
            raise
        # Filesystems without hard links (some SMB/FUSE mounts): rename, after checking
        # that nothing would be replaced.
        if os.path.lexists(dest):
            raise FileExistsError(errno.EEXIST, "exists", str(dest)) from None
        os.rename(src, dest)
        return
    # link+unlink instead of rename: rename would silently replace an existing dest.
    os.unlink(src)


def _copy_then_remove(src: Path, dest: Path, perms: Perms | None) -> None:
    tmp = dest.with_name((perms or Perms()).tmp_name(dest.name))
    fd_in = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fd_out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            while True:
                chunk = os.read(fd_in, 1 << 20)
                if not chunk:
                    break
                os.write(fd_out, chunk)
            if perms is not None:
                _apply(fd_out, perms.file_mode, perms.gid)
            os.fsync(fd_out)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)
    try:
        os.link(tmp, dest)
    finally:
        os.unlink(tmp)
    os.unlink(src)


def unique_names(directory: Path, stem: str, suffix: str) -> Iterator[str]:
    """stem+suffix, then stem-2+suffix, stem-3+suffix, ... (each fitted to NAME_MAX)."""
    yield fit_name(stem, suffix, reserve=40)
    n = 2
    while True:
        yield fit_name(f"{stem}-{n}", suffix, reserve=40)
        n += 1


def move_unique(src: Path, directory: Path, name: str, perms: Perms | None = None) -> Path:
    """Move src into directory under `name`, or name-2, name-3 ... if taken."""
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        stem, ext = name, ""
    suffix = "." + ext if ext else ""
    for candidate in unique_names(directory, stem, suffix):
        dest = directory / candidate
        if dest.exists() or dest.is_symlink():
            continue
        try:
            move_file(src, dest, perms)
            return dest
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


class Reservations:
    """Output names being written by this process right now, so that `a.pdf` and
    `a.png` converted at the same time do not both become `a.md`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: set[Path] = set()

    def choose(self, directory: Path, stem: str, sha256: str, source: str,
               same_path_replaces: bool = False) -> Path:
        """The output base path (without suffix) for a document: the plain name unless
        another document's results hold it, then stem-2, stem-3, ... Results of the same
        document (same content and source path) are replaced, not duplicated. With
        `same_path_replaces` (on_success: keep, where a file is edited in place), the
        results of an earlier version of the same source path are replaced too."""
        with self._lock:
            for candidate in unique_names(directory, stem, ""):
                base = directory / candidate
                if base in self._taken:
                    continue
                if _free_or_same(base, None if same_path_replaces else sha256, source):
                    self._taken.add(base)
                    return base
        raise AssertionError("unreachable")

    def release(self, base: Path) -> None:
        with self._lock:
            self._taken.discard(base)


def _free_or_same(base: Path, sha256: str | None, source: str) -> bool:
    md, sidecar, assets = (base.with_name(base.name + s) for s in (".md", ".json", ".assets"))
    if not (md.exists() or sidecar.exists() or assets.exists()):
        return True
    try:
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    src = meta.get("source", {})
    return src.get("path") == source and (sha256 is None or src.get("sha256") == sha256)


def sweep_temporaries(root: Path, tag: str) -> int:
    """Remove this daemon's temporary files and folders under root (left by a crash)."""
    prefix = f"{TMP_PREFIX}{tag}-"
    removed = 0
    for folder, dirs, files in os.walk(root):
        for name in [d for d in dirs if d.startswith(prefix)]:
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
            dirs.remove(name)
            removed += 1
        for name in files:
            if name.startswith(prefix):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))
                removed += 1
    return removed
