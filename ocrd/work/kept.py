"""What `on_success: keep` put back, known on the share: a mark per original in the
inbox's own `.ocrd-work/kept/`, written before the original reappears in the inbox.

Several ocrd hosts may serve one inbox, each with a state folder of its own. Its journal
tells a daemon which originals *it* put back; the mark tells every daemon on the share
that an original is done, so that no other converts it again. A daemon looks for the
mark before it claims a file, and once more right after its claim (the rename wins, but
the mark is the truth: a file that turns out to be marked goes back where it was).

A mark says: this relative path, with this size and modification time, was converted.
An original edited in place (another size or time) is not marked any more, and is
converted anew; its new mark replaces the old.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from typing import Any

from ocrd import names
from ocrd.outputs import destinations, records
from ocrd.safefs import Dir
from ocrd.work.area import WORK_DIR_NAME

KEPT_DIR = "kept"  # .ocrd-work/kept/: ocrd's marks, not a work area


def _mark_name(relpath: str) -> str:
    digest = hashlib.sha256(relpath.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{digest[:40]}.json"


def _folder(inbox_root: Dir, perms: destinations.Perms, create: bool) -> Dir:
    if not create:
        return inbox_root.walk((WORK_DIR_NAME, KEPT_DIR))
    with inbox_root.mkdir(WORK_DIR_NAME, perms.dir_mode, perms.gid) as work:
        return work.mkdir(KEPT_DIR, perms.dir_mode, perms.gid)


def mark(inbox_root: Dir, relpath: str, size: int, mtime_ns: int, perms: destinations.Perms,
         **facts: Any) -> None:
    """Mark relpath (size, mtime) as converted, for every daemon on the share."""
    body = names.json_bytes({"relpath": relpath, "size": size, "mtime_ns": mtime_ns,
                             "at": records.iso(time.time()), **facts})
    with _folder(inbox_root, perms, create=True) as folder:
        destinations.write_atomic(folder, _mark_name(relpath), body,
                            destinations.Perms(perms.file_mode, perms.dir_mode, perms.gid,
                                         perms.tag))


def marked(inbox_root: Dir, relpath: str, size: int, mtime_ns: int) -> bool:
    """relpath, as it is now (size, mtime), was converted by some daemon on the share."""
    try:
        with _folder(inbox_root, destinations.Perms(), create=False) as folder:
            return _says(folder, relpath, size, mtime_ns)
    except OSError:
        return False


def marked_among(inbox_root: Dir, keys: Iterable[tuple[str, int, int]]
                 ) -> set[tuple[str, int, int]]:
    """`marked` for many (relpath, size, mtime_ns) at once: the marks' folder is listed
    once, and only the marks there are read."""
    try:
        with _folder(inbox_root, destinations.Perms(), create=False) as folder:
            there = set(folder.names())
            return {k for k in keys if _mark_name(k[0]) in there and _says(folder, *k)}
    except OSError:
        return set()


def _says(folder: Dir, relpath: str, size: int, mtime_ns: int) -> bool:
    try:
        data = json.loads(folder.read_file(_mark_name(relpath), limit=1 << 16))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("relpath") == relpath and \
        data.get("size") == size and data.get("mtime_ns") == mtime_ns
