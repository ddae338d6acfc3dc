"""Page images for the console's review page, made on demand: the first time a page is
looked at, it is rendered from the original (wherever the original is now: the work
area, the archive, the inbox, failed/) in a worker process of the console's own, turned
upright as the engine read it, and cached. Conversion never pays for them.

Layout: `state_dir/previews/<sha256[:2]>/<sha256>/p0001.jpg` (`-full` for the large
size) — keyed by the document's content, so a document converted again reuses them.
Previews are disposable: written without fsync, kept within `web.previews_days` and
`web.previews_max_bytes` (oldest documents removed first).
"""

from __future__ import annotations

import concurrent.futures
import io
import multiprocessing
import os
import re
import shutil
import threading
import time
from pathlib import Path

import structlog
from PIL import Image

from ocrd import errors

log = structlog.get_logger("ocrd.render.previews")

# size name → (dpi it is rendered at, longest side of the JPEG)
SIZES = {"page": (150, 1600), "full": (300, 4000)}
QUALITY = 75  # JPEG
NEAREST_UP_TO = 1.25  # see encode()
SWEEP_SECONDS = 600.0
RENDER_TIMEOUT = 60.0
MAX_PIXELS = 40_000_000  # a page image rendered for a preview, at most
# OSD's "Rotate: N" (the sidecar's `rotation`) is the clockwise turn that makes the page
# upright; Pillow's transpositions turn counter-clockwise
_TURN = {90: Image.Transpose.ROTATE_270, 180: Image.Transpose.ROTATE_180,
         270: Image.Transpose.ROTATE_90}

_SHA256 = re.compile(r"[0-9a-f]{64}")


def page_name(page_no: int, size: str = "page") -> str:
    return f"p{page_no:04d}.jpg" if size == "page" else f"p{page_no:04d}-{size}.jpg"


def encode(image: Image.Image, long_side: int) -> bytes:
    """The image as a JPEG whose long side is at most `long_side`."""
    # An integer box reduction (fast, and smooth), then at most a 1.25 × shrink by
    # dropping rows and columns, which leaves text as readable as a filtered resize.
    factor = max(image.size) / long_side
    if factor > 1:
        k = max(1, int(factor))
        if factor / k > NEAREST_UP_TO:
            k += 1
        if k > 1:
            image = image.reduce(k)
        if max(image.size) > long_side:
            scale = long_side / max(image.size)
            image = image.resize((max(1, round(image.width * scale)),
                                  max(1, round(image.height * scale))),
                                 Image.Resampling.NEAREST)
    if image.mode not in ("L", "RGB"):
        image = image.convert("RGB")
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=QUALITY)
    return buf.getvalue()


def make_preview(path: str, index: int, size: str, rotation: int | None) -> bytes:
    """Render page `index` (0-based) of the document at `path`, turned upright, as a
    JPEG — in the previews' worker process."""
    from ocrd.render import pages
    from ocrd.render.pixels import pixels

    dpi, long_side = SIZES[size]
    try:
        info = pages.probe(path, dpi, 1_000_000, 1 << 62, MAX_PIXELS, finished=True)
        if not 0 <= index < info.pages:
            raise errors.OcrdError(f"the document has no page {index + 1}")
        page = pages.render_page(path, info, index, dpi, MAX_PIXELS)
        image = page.to_image(pixels(page))
    finally:
        pages.forget(path)
    if image.mode == "1":
        image = image.convert("L")
    if rotation in _TURN:
        image = image.transpose(_TURN[rotation])
    return encode(image, long_side)


class Previews:
    """The cache, and the worker process that renders what is not in it yet."""

    def __init__(self, root: Path, days: float, max_bytes: int,
                 sweep_seconds: float = SWEEP_SECONDS) -> None:
        self.root = root
        self.days = days
        self.max_bytes = max_bytes
        self.sweep_seconds = sweep_seconds
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # the pool and sweeps
        self._since_sweep = 0
        self._last_sweep = 0.0

    # -- paths ---------------------------------------------------------------------------

    def folder(self, sha256: str) -> Path | None:
        """The document's folder; None for anything that is not a sha256 (the only way
        a name from outside becomes a path here)."""
        if not _SHA256.fullmatch(sha256):
            return None
        return self.root / sha256[:2] / sha256

    def path(self, sha256: str, page_no: int, size: str = "page") -> Path | None:
        folder = self.folder(sha256)
        if folder is None or page_no < 1 or size not in SIZES:
            return None
        return folder / page_name(page_no, size)

    # -- life ----------------------------------------------------------------------------

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def stop(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            return self._pool

    # -- making --------------------------------------------------------------------------

    def make(self, sha256: str, page_no: int, size: str, source_path: str,
             rotation: int | None) -> bytes | None:
        """Render the page from `source_path` (an open file's /proc path), cache it and
        return it; None when it cannot be made (logged)."""
        path = self.path(sha256, page_no, size)
        if path is None:
            return None
        try:
            data = self._executor().submit(make_preview, source_path, page_no - 1, size,
                                           rotation).result(timeout=RENDER_TIMEOUT)
        except concurrent.futures.process.BrokenProcessPool as e:
            with self._lock:
                self._pool = None  # a decoder crashed the worker: a fresh one next time
            return self._failed(page_no, e)
        except (errors.OcrdError, OSError, ValueError, MemoryError, TimeoutError) as e:
            return self._failed(page_no, e)
        self._write(path, data)
        return data

    def _failed(self, page_no: int, e: BaseException) -> None:
        log.warning("preview_failed", page=page_no, error=str(e) or type(e).__name__)
        return None

    def _write(self, path: Path, data: bytes) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".tmp-{path.name}-{threading.get_ident()}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            os.utime(path.parent)  # the document's age for retention: last written
        except OSError as e:
            log.warning("preview_not_cached", path=str(path), error=str(e))
            return
        with self._lock:
            self._since_sweep += len(data)
            # as soon as 2 % of the byte limit was written since the last sweep, so
            # that many pages looked at in a row cannot overshoot it far
            due = self._since_sweep > self.max_bytes // 50 or \
                time.monotonic() - self._last_sweep > self.sweep_seconds
            if due:
                self.sweep()

    # -- retention -----------------------------------------------------------------------

    def sweep(self) -> int:
        """Remove documents older than `days`, then the oldest until the total is within
        `max_bytes`. Returns the documents removed."""
        self._since_sweep = 0
        self._last_sweep = time.monotonic()
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
        if removed:
            log.info("previews_swept", documents=removed, bytes_left=total)
        return removed


def _dirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
