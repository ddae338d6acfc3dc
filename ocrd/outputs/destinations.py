"""Writing into ocrd's destination folders (outbox, archive, failed): atomic files,
mirrored subfolders, collision-safe names, permissions.

Everything works on open folders (`safefs.Dir`): a write goes to a temporary name made
with O_EXCL, is fsynced, and gets its final name with a rename that replaces only where
the caller knows the old entry is ocrd's own (the same document's earlier result). Moving
an original in never replaces anything (`move_unique`). A mirrored subfolder whose name
is taken by something that is not a folder gets the next free name (`x-2/`) instead of
blocking the file. Also here: output names (fitted to NAME_MAX, held while being written:
`Reservations`), error files beside failed originals, and the sweep of this daemon's
temporaries after a crash.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ocrd import names
from ocrd.safefs import Blocked, Dir

NAME_MAX = 255
TMP_PREFIX = ".ocrd-tmp-"
ERROR_SUFFIX = ".error.json"
# an output base name leaves room for its longest file suffix (.json); the assets
# folder's name is fitted on its own (assets_name)
OUTPUT_RESERVE = len(".json")


@dataclass(frozen=True)
class Perms:
    """How ocrd's outputs are made on a destination: modes, group, temporary names."""

    file_mode: int = 0o644
    dir_mode: int = 0o755
    gid: int | None = None
    # marks this daemon's temporary names, so that a restart removes its own leftovers
    # and never another daemon's work in progress on a shared outbox
    tag: str = "0"

    def tmp_name(self, final: str) -> str:
        return f"{TMP_PREFIX}{self.tag}-{secrets.token_hex(4)}-{fit_name(final, '', 40)}"


def fit_name(stem: str, suffix: str, reserve: int = 0) -> str:
    """stem+suffix, shortened so that it (plus `reserve` bytes for longer siblings such
    as `.error.json`) fits in one file name; a hash of the whole stem keeps shortened
    names apart."""
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


def split_ext(name: str) -> tuple[str, str]:
    """('scan', '.pdf') for 'scan.pdf'; a dotfile or a name without a dot has no ext."""
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        return name, ""
    return stem, "." + ext


def assets_name(base: str) -> str:
    return fit_name(base, ".assets")


def unique_names(stem: str, suffix: str, reserve: int = 0) -> Iterator[str]:
    """stem+suffix, then stem-2+suffix, stem-3+suffix, ... (each fitted to NAME_MAX)."""
    yield fit_name(stem, suffix, reserve)
    n = 2
    while True:
        yield fit_name(f"{stem}-{n}", suffix, reserve)
        n += 1


# -- folders ------------------------------------------------------------------------------


def mirror(root: Dir, parts: tuple[str, ...], perms: Perms) -> tuple[Dir, tuple[str, ...]]:
    """The folder root/parts, created with the configured mode and group. A component
    whose name is taken by a file (or a link, a device …) becomes the first free or
    existing folder among name-2, name-3 …: the file is not blocked, and nothing is
    followed. Returns the folder and the parts actually used."""
    cur = root.walk(())
    used: list[str] = []
    try:
        for part in parts:
            for candidate in _folder_names(part):
                try:
                    nxt = cur.mkdir(candidate, perms.dir_mode, perms.gid)
                except Blocked:
                    continue
                break
            cur.close()
            cur = nxt
            used.append(candidate)
    except BaseException:
        cur.close()
        raise
    return cur, tuple(used)


def _folder_names(part: str) -> Iterator[str]:
    yield part
    n = 2
    while True:
        yield fit_name(f"{part}-{n}", "")
        n += 1


# -- files --------------------------------------------------------------------------------


def write_atomic(folder: Dir, name: str, data: bytes, perms: Perms,
                 replace: bool = True) -> None:
    """name in folder holds data, whole or not at all. replace=False: only if the name
    is free (FileExistsError otherwise)."""
    def fill(out: BinaryIO) -> None:
        out.write(data)

    write_atomic_with(folder, name, fill, perms, replace)


def write_atomic_all(folder: Dir, files: list[tuple[str, bytes]], perms: Perms) -> None:
    """Each name in folder holds its data, in this order, or none does: every file is
    written under a temporary name first, and only then renamed, one after the other
    (a rename that fails takes back those made before it)."""
    written: list[tuple[str, str]] = []
    renamed: list[str] = []
    try:
        for name, data in files:
            tmp = perms.tmp_name(name)
            _write_tmp(folder, tmp, lambda out, data=data: out.write(data), perms)
            written.append((tmp, name))
        for tmp, name in written:
            folder.rename(tmp, folder, name, replace=True)
            renamed.append(name)
    except BaseException:
        for tmp, name in written:
            with contextlib.suppress(OSError):
                folder.unlink(name if name in renamed else tmp)
        raise


def write_atomic_with(folder: Dir, name: str, fill: Callable[[BinaryIO], None],
                      perms: Perms, replace: bool = True) -> None:
    """write_atomic for what `fill` writes into the open file: large outputs such as the
    searchable PDF go to disk as they are made."""
    tmp = perms.tmp_name(name)
    _write_tmp(folder, tmp, fill, perms)
    try:
        folder.rename(tmp, folder, name, replace=replace)
    except BaseException:
        with contextlib.suppress(OSError):
            folder.unlink(tmp)
        raise


def _write_tmp(folder: Dir, tmp: str, fill: Callable[[BinaryIO], None],
               perms: Perms) -> None:
    """The new file `tmp` (which must not exist) filled, with its mode and group,
    durable; removed again when that fails."""
    fd = folder.create(tmp)
    try:
        with open(fd, "wb", closefd=False) as out:  # buffered: whole writes
            fill(out)
        os.fchmod(fd, perms.file_mode)
        if perms.gid is not None:
            os.fchown(fd, -1, perms.gid)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            folder.unlink(tmp)
        raise
    os.close(fd)


def move_file(src: Dir, name: str, dest: Dir, new: str, perms: Perms | None = None) -> None:
    """Move the entry src/name to dest/new, which must not exist (FileExistsError); the
    entry itself, never what a link points to. Across filesystems, copied durably first."""
    try:
        src.rename(name, dest, new)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        _copy_then_remove(src, name, dest, new, perms or Perms())


def _copy_then_remove(src: Dir, name: str, dest: Dir, new: str, perms: Perms) -> None:
    fd_in = src.open_file(name)
    tmp = perms.tmp_name(new)
    try:
        fd_out = dest.create(tmp)
        try:
            while chunk := os.read(fd_in, 1 << 20):
                os.write(fd_out, chunk)
            os.fchmod(fd_out, perms.file_mode)
            if perms.gid is not None:
                os.fchown(fd_out, -1, perms.gid)
            os.fsync(fd_out)
        finally:
            os.close(fd_out)
        dest.rename(tmp, dest, new)
    except BaseException:
        with contextlib.suppress(OSError):
            dest.unlink(tmp)
        raise
    finally:
        os.close(fd_in)
    src.unlink(name)


def move_unique(src: Dir, name: str, dest: Dir, wanted: str, perms: Perms | None = None,
                siblings: tuple[str, ...] = ()) -> str:
    """Move src/name into dest as `wanted` (its name kept whenever it is free), or
    wanted-2, wanted-3 … where taken — taken also when a sibling of that name (a
    suffix such as '.error.json', the pair fitted to NAME_MAX on its own) is. Returns
    the name used."""
    stem, ext = split_ext(wanted)
    for candidate in unique_names(stem, ext):
        if any(dest.exists(n) for n in (candidate, *(fit_name(candidate, s)
                                                      for s in siblings))):
            continue
        try:
            move_file(src, name, dest, candidate, perms)
        except FileExistsError:
            continue
        return candidate
    raise AssertionError("unreachable")


def write_error(folder: Dir, failed_name: str, data: bytes, perms: Perms) -> str:
    """failed_name.error.json (data: records.error_json) beside a failed original; never
    replaces a file of that name (a user's own `x.pdf.error.json`): the next free name
    is taken then. Returns the name written."""
    first = fit_name(failed_name, ERROR_SUFFIX)
    stem = first.removesuffix(ERROR_SUFFIX).removesuffix(".error")
    for candidate in (first, *(fit_name(f"{stem}.error-{n}", ".json")
                               for n in range(2, 1000))):
        try:
            write_atomic(folder, candidate, data, perms, replace=False)
        except FileExistsError:
            continue
        return candidate
    raise AssertionError("unreachable")


RESERVED_PREFIX = f"{TMP_PREFIX}reserved-"


def reservation_name(base: str) -> str:
    return fit_name(RESERVED_PREFIX + base, "")


class Reservations:
    """Output names being written right now, so that `a.pdf` and `a.png` converted at
    the same time do not both become `a.md` — in this process (a set), and, given the
    daemon's `tag`, among the hosts that write to a shared outbox (a file
    `.ocrd-tmp-reserved-BASE` made with O_EXCL beside the outputs, holding the tag,
    removed once the outputs are written; a crashed daemon's are swept at its start)."""

    def __init__(self, tag: str | None = None) -> None:
        self.tag = tag
        self._lock = threading.Lock()
        self._taken: set[tuple[int, int, str]] = set()

    def choose(self, folder: Dir, stem: str, sha256: str, source: str,
               same_path_replaces: bool = False, suffixes: tuple[str, ...] = ()) -> str:
        """The output base name (without suffix) for a document in folder: the plain
        name unless another document's results (or anything not ocrd's) hold it, then
        stem-2, stem-3, ... Results of the same document (same content and source path)
        are replaced, not duplicated. With `same_path_replaces` (on_success: keep, where
        a file is edited in place) the results of an earlier version of the same source
        path are replaced too. `suffixes`: further outputs (the searchable PDF's
        suffix) whose names must be free or this document's too."""
        st = os.fstat(folder.fd)
        with self._lock:
            for candidate in unique_names(stem, "", reserve=OUTPUT_RESERVE):
                key = (st.st_dev, st.st_ino, candidate)
                if key in self._taken:
                    continue
                if _free_or_same(folder, candidate, None if same_path_replaces else sha256,
                                 source, suffixes) and self._reserve(folder, candidate):
                    self._taken.add(key)
                    return candidate
        raise AssertionError("unreachable")

    def _reserve(self, folder: Dir, base: str) -> bool:
        """The name for this writer alone, also among other hosts on a share. Called
        under the lock, for a name this process does not hold: a reservation of this
        tag found there is a leftover of this daemon's own (a write that failed), and
        taken over."""
        if self.tag is None:
            return True
        name = reservation_name(base)
        try:
            fd = folder.create(name, 0o600)
        except FileExistsError:
            return _reserved_by(folder, name) == self.tag.encode()
        try:
            os.write(fd, self.tag.encode())
        except BaseException:
            with contextlib.suppress(OSError):
                folder.unlink(name)
            raise
        finally:
            os.close(fd)
        return True

    def release(self, folder: Dir, base: str) -> None:
        st = os.fstat(folder.fd)
        if self.tag is not None:
            with contextlib.suppress(OSError):
                folder.unlink(reservation_name(base))
        with self._lock:
            self._taken.discard((st.st_dev, st.st_ino, base))


def _free_or_same(folder: Dir, base: str, sha256: str | None, source: str,
                  suffixes: tuple[str, ...] = ()) -> bool:
    md, sidecar, assets = base + ".md", base + ".json", assets_name(base)
    extra = [fit_name(base, suffix) for suffix in suffixes]
    if not any(folder.exists(n) for n in (md, sidecar, assets, *extra)):
        return True
    for name, want_dir in ((md, False), (assets, True), *((n, False) for n in extra)):
        try:
            st = folder.lstat(name)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode) != want_dir or stat.S_ISLNK(st.st_mode):
            return False  # not what ocrd writes there: someone else's
    try:
        meta = json.loads(folder.read_file(sidecar).decode("utf-8"))
    except (OSError, ValueError):
        return False
    src = meta.get("source", {}) if isinstance(meta, dict) else {}
    outputs = meta.get("outputs") if isinstance(meta, dict) else None
    listed = {v for v in outputs.values() if isinstance(v, str)} \
        if isinstance(outputs, dict) else set()
    if any(folder.exists(n) and n not in listed for n in extra):
        return False  # an output's file of that name that this document's results do not list
    return src.get("path") == source and (sha256 is None or src.get("sha256") == sha256)


def _reserved_by(folder: Dir, name: str) -> bytes | None:
    try:
        return folder.read_file(name, limit=256)
    except OSError:
        return None


def sweep_temporaries(root: Path, tag: str, open_root: Callable[[], Dir] | None = None
                      ) -> int:
    """Remove this daemon's temporary files and folders under root (left by a crash),
    never entering a link. `open_root`: how the daemon opens that folder (pinned)."""
    prefix = f"{TMP_PREFIX}{tag}-"
    try:
        top = open_root() if open_root is not None else Dir.open_root(root)
    except OSError:
        return 0
    with top:
        return _sweep(top, prefix)


def _sweep(folder: Dir, prefix: str) -> int:
    removed = 0
    tag = prefix.removeprefix(TMP_PREFIX).removesuffix("-").encode()
    for entry in list(folder.entries()):
        is_dir = entry.is_dir(follow_symlinks=False)
        if entry.name.startswith(prefix):
            with contextlib.suppress(OSError):
                folder.remove_tree(entry.name) if is_dir else folder.unlink(entry.name)
            removed += 1
        elif entry.name.startswith(RESERVED_PREFIX) and not is_dir and \
                _reserved_by(folder, entry.name) == tag:
            with contextlib.suppress(OSError):
                folder.unlink(entry.name)
            removed += 1
        elif is_dir:
            with contextlib.suppress(OSError), folder.sub(entry.name) as sub:
                removed += _sweep(sub, prefix)
    return removed
