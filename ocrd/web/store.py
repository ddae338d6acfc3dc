"""What the console reads: journal rows, and the files a row points at.

A URL never names a path: it names a journal row (an integer id) and a kind of file
(`md`, `json`, `original`, a figure listed in the sidecar, a preview page number).
The path comes from the row and must lie inside one of the folders the configuration
gives that row's inbox; it is opened from that folder down, one component at a time,
never following a symbolic link. A row of an inbox that is no longer configured, or
pointing outside its inbox's folders, serves nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import stat
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ocrd.config.roots import Roots
from ocrd.config.settings import Config, InboxConfig
from ocrd.render.previews import SIZES, Previews
from ocrd.safefs import fd_path
from ocrd.web.search import Hit, Query, SearchIndex
from ocrd.work.journal import OPEN_STATES, FileFilter, Job, Journal

_FIGURE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,100}")
MAX_TEXT_BYTES = 64 * 1024**2  # a Markdown or sidecar larger than this is not shown


@dataclass
class Opened:
    fd: int
    size: int
    name: str

    def read(self) -> bytes:
        try:
            with os.fdopen(self.fd, "rb", closefd=False) as f:
                return f.read()
        finally:
            os.close(self.fd)

    def chunks(self, size: int = 1 << 20) -> Iterator[bytes]:
        try:
            while chunk := os.read(self.fd, size):
                yield chunk
        finally:
            os.close(self.fd)


def open_inside(root: Path, path: Path, roots: Roots | None = None) -> Opened | None:
    """Open `path` for reading if it is a regular file inside `root`, walking down
    from root without following any symbolic link; None otherwise. With `roots` (the
    daemon's pinned folders) root itself is the folder pinned, or nothing is read."""
    root_abs, path_abs = os.path.abspath(root), os.path.abspath(path)
    if os.path.commonpath([root_abs, path_abs]) != root_abs or root_abs == path_abs:
        return None
    parts = Path(os.path.relpath(path_abs, root_abs)).parts
    if any(p in ("..", ".") for p in parts):
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        if roots is not None:
            top = roots.open(root)
            fd, top.fd = top.fd, -1
        else:
            fd = os.open(root_abs, flags | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        os.close(fd)
        return None
    os.close(fd)
    st = os.fstat(leaf)
    if not stat.S_ISREG(st.st_mode):
        os.close(leaf)
        return None
    return Opened(leaf, st.st_size, parts[-1])


class Store:
    def __init__(self, cfg: Config, previews: Previews | None, roots: Roots | None = None
                 ) -> None:
        self.cfg = cfg
        self.previews = previews
        self.roots = roots  # the daemon's pinned folders (None: opened by their paths)
        self.journal_path = cfg.state_dir / "journal.sqlite3"
        self.search_path = cfg.state_dir / "search.sqlite3"
        self._local = threading.local()
        # every thread's search connection (a thread that ends takes its own with it)
        self._readers: weakref.WeakSet[SearchIndex] = weakref.WeakSet()
        self._readers_lock = threading.Lock()

    # -- journal ------------------------------------------------------------------------

    def journal(self) -> Journal:
        """This thread's read-only connection (sqlite3 connections stay in their thread)."""
        journal = getattr(self._local, "journal", None)
        if journal is None:
            journal = self._local.journal = Journal(self.journal_path, readonly=True)
        return journal

    def search(self, query: Query, limit: int, offset: int
               ) -> tuple[list[Hit], int] | None:
        """SearchIndex.search on this thread's read-only connection to the index (None:
        there is no index yet), opened again when the file is not the one it has open
        (deleted, rebuilt) and closed after a search that finds it so. A damaged index
        raises sqlite3.DatabaseError, its connection closed (the indexer rebuilds it)."""
        for _ in range(3):
            index = self._search_index()
            if index is None:
                return None
            with index.lock:
                if index.closed:  # let go of by another thread meanwhile: open anew
                    continue
                try:
                    return index.search(query, limit, offset)
                except sqlite3.DatabaseError:
                    index.close()
                    raise
                finally:
                    if not index.closed and not index.current():
                        index.close()
        return None

    def _search_index(self) -> SearchIndex | None:
        index = getattr(self._local, "search", None)
        if index is not None and (index.closed or not index.current()):
            with index.lock:
                if not index.closed:
                    index.close()
            index = self._local.search = None
        if index is None:
            if not self.search_path.exists():
                return None
            index = self._local.search = SearchIndex(self.search_path, readonly=True)
            with self._readers_lock:
                self._readers.add(index)
        return index

    def let_go_of_stale_readers(self) -> None:
        """Close every thread's idle connection to an index file that is no longer at
        its path: the file's space comes back without waiting for the thread to search
        again or to end. (One in use is closed by its thread when its search ends.)"""
        with self._readers_lock:
            readers = list(self._readers)
        for index in readers:
            if index.lock.acquire(blocking=False):
                try:
                    if not index.closed and not index.current():
                        index.close()
                finally:
                    index.lock.release()

    def job(self, job_id: int) -> Job | None:
        return self.journal().get(job_id)

    def find(self, where: FileFilter, limit: int, offset: int) -> tuple[list[Job], int]:
        journal = self.journal()
        return journal.find(where, limit, offset), journal.count(where)

    # -- the files of a row -------------------------------------------------------------

    def inbox(self, job: Job) -> InboxConfig | None:
        for box in self.cfg.inboxes:
            if str(box.path) == job.inbox:
                return box
        return None

    def _base(self, job: Job) -> tuple[InboxConfig, Path] | None:
        """The inbox and the output base path (without .md) of a converted file."""
        box = self.inbox(job)
        if box is None or job.state != "done" or not job.output.endswith(".md"):
            return None
        return box, Path(job.output[:-3])

    def open_output(self, job: Job, suffix: str) -> Opened | None:
        """NAME.md or NAME.json of a converted file."""
        found = self._base(job)
        if found is None:
            return None
        box, base = found
        return open_inside(box.outbox, base.with_name(base.name + suffix), self.roots)

    def text(self, job: Job, suffix: str) -> str | None:
        opened = self.open_output(job, suffix)
        if opened is None:
            return None
        if opened.size > MAX_TEXT_BYTES:
            os.close(opened.fd)
            return None
        return opened.read().decode("utf-8", "replace")

    def sidecar(self, job: Job) -> dict | None:
        text = self.text(job, ".json")
        if text is None:
            return None
        with contextlib.suppress(ValueError):
            meta = json.loads(text)
            if isinstance(meta, dict):
                return meta
        return None

    def asset(self, job: Job, name: str, meta: dict | None) -> Opened | None:
        """A figure crop, only when the sidecar lists it for one of the pages."""
        found = self._base(job)
        if found is None or meta is None or not _FIGURE.fullmatch(name):
            return None
        listed = {f for p in meta.get("pages", []) if isinstance(p, dict)
                  for f in p.get("figures", []) or []}
        if name not in listed:
            return None
        box, base = found
        return open_inside(box.outbox, base.with_name(base.name + ".assets") / name,
                           self.roots)

    def output(self, job: Job, meta: dict | None, kind: str) -> Opened | None:
        """An output the sidecar lists beside the Markdown (outputs.pdf, outputs.hocr,
        a writer's of one's own), in the outbox."""
        found = self._base(job)
        if found is None or kind not in listed_outputs(meta):
            return None
        name = meta["outputs"][kind]  # type: ignore[index]
        if "/" in name or name in ("", ".", ".."):
            return None
        box, base = found
        return open_inside(box.outbox, base.with_name(name), self.roots)

    def original(self, job: Job, meta: dict | None) -> Opened | None:
        """The original: in the work area (claimed, converting), in failed/ (failed,
        dismissed), back in the inbox (keep), or in the archive (the archive's name may
        have got a -2 suffix: matched by size)."""
        box = self.inbox(job)
        if box is None:
            return None
        if job.state in OPEN_STATES and job.claim_path:
            return open_inside(box.path, Path(job.claim_path), self.roots)
        if job.state in ("failed", "dismissed") and job.output:
            return open_inside(box.failed, Path(job.output), self.roots)
        if job.state != "done":
            return None
        if box.on_success == "keep":
            return open_inside(box.path, box.path / job.relpath, self.roots)
        if box.on_success != "archive" or box.archive is None:
            return None
        rel = Path(job.relpath)
        stem, dot, ext = rel.name.rpartition(".")
        names = [rel.name] + [f"{stem or ext}-{n}{dot}{ext if stem else ''}"
                              for n in range(2, 10)]
        for name in names:
            opened = open_inside(box.archive, box.archive / rel.parent / name, self.roots)
            if opened is not None and opened.size == job.size:
                return opened
            if opened is not None:
                os.close(opened.fd)
        return None

    def preview(self, job: Job, meta: dict | None, page: int, size: str = "page"
                ) -> bytes | None:
        """The page's image, upright as read: from the cache, else rendered now from
        the original (None when there is neither)."""
        if self.previews is None or meta is None or size not in SIZES:
            return None
        sha = (meta.get("source") or {}).get("sha256")
        path = self.previews.path(sha, page, size) if isinstance(sha, str) else None
        if path is None or page > int(meta.get("page_count") or 0):
            return None
        cached = open_inside(self.previews.root, path)
        if cached is not None:
            return cached.read()
        original = self.original(job, meta)
        if original is None:
            return None
        try:
            return self.previews.make(sha, page, size, fd_path(original.fd),
                                      page_rotation(meta, page))
        finally:
            os.close(original.fd)


def page_rotation(meta: dict | None, page: int) -> int | None:
    """The turn (degrees clockwise) that made the page upright for the engine."""
    for p in (meta or {}).get("pages", []):
        if isinstance(p, dict) and p.get("page") == page:
            rotation = p.get("rotation")
            return rotation if isinstance(rotation, int) and rotation % 360 else None
    return None


def listed_outputs(meta: dict | None) -> list[str]:
    """The outputs a sidecar lists as written besides the Markdown and its figures (the
    writers' names: pdf, hocr, ...), in its order."""
    outputs = (meta or {}).get("outputs")
    if not isinstance(outputs, dict):
        return []
    return [k for k, v in outputs.items() if isinstance(k, str) and isinstance(v, str)
            and k not in ("markdown", "assets") and not k.endswith("_failed")
            and k.replace("_", "").isalnum()]
