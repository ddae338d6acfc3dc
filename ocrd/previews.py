"""Page previews for the console's review page: a small JPEG of every page the pipeline
renders, so a page can be checked against its Markdown after the original was archived
or deleted. Made in the render worker that renders the page (render_with_preview),
written by one thread, kept within `web.previews_days` and `web.previews_max_bytes`.

Layout: `state_dir/previews/<sha256[:2]>/<sha256>/p0001.jpg` — keyed by the document's
content, so the console finds them from the sidecar's `source.sha256`, and a document
converted again reuses its folder. Previews are disposable: written without fsync, and
a page whose preview could not be made (queue full, disk full) just has none.
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import re
import shutil
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import structlog
from PIL import Image

from .pagepixels import RenderedPage, pixels
from .pages import DocInfo, render_page
from .resolution import Resolution

log = structlog.get_logger("ocrd.previews")

LONG_SIDE = 1600  # px, the longest side of a preview
QUALITY = 70  # JPEG
NEAREST_UP_TO = 1.25  # see encode()
# Previews (JPEG, ~50-250 KB) waiting to be written: beyond this (a disk slower than
# the conversion), a page gets none rather than slowing the conversion.
QUEUE_PAGES = 64
WRITERS = 1
SWEEP_SECONDS = 600.0

_SHA256 = re.compile(r"[0-9a-f]{64}")


def page_name(page_no: int) -> str:
    return f"p{page_no:04d}.jpg"


def encode(image: Image.Image) -> bytes:
    """The page image as a JPEG whose long side is at most LONG_SIDE (1000–1600 px for
    pages rendered larger)."""
    # Pillow's filtered resize costs several times the JPEG encoding (48 against 8 ms for
    # an A4 page at 144 dpi, 1684 px). So: an integer box reduction (fast, and smooth),
    # then at most a 1.25 × shrink by dropping rows and columns, which leaves text as
    # readable as the filter does; a larger rest takes one more reduction step instead.
    factor = max(image.size) / LONG_SIDE
    if factor > 1:
        k = max(1, int(factor))
        if factor / k > NEAREST_UP_TO:
            k += 1
        if k > 1:
            image = image.reduce(k)
        if max(image.size) > LONG_SIDE:
            scale = LONG_SIDE / max(image.size)
            image = image.resize((max(1, round(image.width * scale)),
                                  max(1, round(image.height * scale))),
                                 Image.Resampling.NEAREST)
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=QUALITY)
    return buf.getvalue()


def render_with_preview(path: str, info: DocInfo, index: int, dpi: float | Resolution,
                        max_pixels: int) -> RenderedPage:
    """pages.render_page, plus the page's preview — run in a render worker, so that the
    preview costs worker time beside rendering, never the daemon's loop or its GIL."""
    page = render_page(path, info, index, dpi, max_pixels)
    try:
        image = page.to_image(pixels(page))
        if page.mode == "1":  # a 1-bit scan: its preview is small anyway
            image = image.convert("L")
        return replace(page, preview=encode(image))
    except (OSError, ValueError, MemoryError) as e:
        log.warning("preview_failed", page=index + 1, error=str(e))
        return page


@dataclass
class PreviewStats:
    written: int = 0
    skipped: int = 0  # queue full or write failed
    bytes_written: int = 0
    swept_docs: int = 0


class Previews:
    """The store and its writer thread. `page()` is called on the event loop for every
    rendered page and returns at once."""

    def __init__(self, root: Path, days: float, max_bytes: int,
                 sweep_seconds: float = SWEEP_SECONDS) -> None:
        self.root = root
        self.days = days
        self.max_bytes = max_bytes
        self.sweep_seconds = sweep_seconds
        self.stats = PreviewStats()
        self._queue: queue.Queue[tuple[str, int, bytes] | None] = queue.Queue(QUEUE_PAGES)
        self._threads = [threading.Thread(target=self._run, name=f"previews-{k}", daemon=True)
                         for k in range(WRITERS)]
        self._since_sweep = 0
        self._lock = threading.Lock()  # stats and sweeps, shared by the writers

    # -- paths ---------------------------------------------------------------------------

    def folder(self, sha256: str) -> Path | None:
        """The document's folder; None for anything that is not a sha256 (the only way
        a name from outside becomes a path here)."""
        if not _SHA256.fullmatch(sha256):
            return None
        return self.root / sha256[:2] / sha256

    def path(self, sha256: str, page_no: int) -> Path | None:
        folder = self.folder(sha256)
        return folder / page_name(page_no) if folder is not None and page_no >= 1 else None

    # -- writing -------------------------------------------------------------------------

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        for _ in self._threads:
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=5)
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=10)

    def page(self, sha256: str | None, page_no: int, page: RenderedPage) -> None:
        """Queue a rendered page's preview for writing (called on the event loop where
        the pipeline renders the page; returns at once)."""
        if sha256 is None or page.preview is None:
            return
        try:
            self._queue.put_nowait((sha256, page_no, page.preview))
        except queue.Full:
            self.stats.skipped += 1
            if self.stats.skipped % 100 == 1:
                log.warning("previews_skipped", pages=self.stats.skipped,
                            why="previews are made faster than the disk takes them")

    def _run(self) -> None:
        next_sweep = 0.0
        while True:
            try:
                item = self._queue.get(timeout=max(0.1, next_sweep - time.monotonic()))
            except queue.Empty:
                item = ()  # type: ignore[assignment]
            if item is None:
                return
            if item:
                self._write(*item)
            # on a timer, and as soon as 2 % of the byte limit was written since the last
            # sweep, so that a burst of conversions cannot overshoot it far
            with self._lock:
                due = time.monotonic() >= next_sweep or \
                    self._since_sweep > self.max_bytes // 50
                if due:
                    self.sweep()
                    next_sweep = time.monotonic() + self.sweep_seconds

    def _write(self, sha256: str, page_no: int, data: bytes) -> None:
        path = self.path(sha256, page_no)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".tmp-{page_no}-{threading.get_ident()}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            os.utime(path.parent)  # the document's age for retention: last written
        except (OSError, ValueError) as e:
            self.stats.skipped += 1
            log.warning("preview_failed", page=page_no, error=str(e))
            return
        with self._lock:
            self.stats.written += 1
            self.stats.bytes_written += len(data)
            self._since_sweep += len(data)

    # -- retention -----------------------------------------------------------------------

    def sweep(self) -> int:
        """Remove documents older than `days`, then the oldest until the total is within
        `max_bytes`. Returns the documents removed."""
        self._since_sweep = 0
        docs = []
        for sub in _dirs(self.root):
            for doc in _dirs(sub):
                try:
                    mtime = doc.stat().st_mtime
                    size = sum(f.stat().st_size for f in doc.iterdir())
                except OSError:
                    continue
                docs.append((mtime, size, doc))
        docs.sort()
        cutoff = time.time() - self.days * 86400
        total = sum(size for _, size, _ in docs)
        # over the limit: down to 90 % of it, so that writing goes on for a while before
        # the next sweep instead of hovering at the limit
        keep = self.max_bytes * 0.9 if total > self.max_bytes else self.max_bytes
        removed = 0
        for mtime, size, doc in docs:
            if mtime >= cutoff and total <= keep:
                break
            shutil.rmtree(doc, ignore_errors=True)
            total -= size
            removed += 1
        self.stats.swept_docs += removed
        if removed:
            log.info("previews_swept", documents=removed, bytes_left=total)
        return removed


def _dirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
