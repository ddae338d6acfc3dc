"""Page pixels between processes: `RenderedPage` (one page as packed pixels) and how a
render worker hands it to the daemon — through a file on tmpfs rather than the process
pool's pipe — plus the worker's start-up (its tmpfs tag, dying with the daemon).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import io
import itertools
import os
import signal
from dataclasses import dataclass, field

from PIL import Image

from ocrd.names import number
from ocrd.render import modes


@dataclass(frozen=True)
class RenderedPage:
    """One page as packed pixels (8-bit RGB, grey, or 1-bit rows with 1 = black: see
    ocrd/render/modes.py), cheap to send between processes."""

    index: int  # 0-based
    width: int
    height: int
    data: bytes | bytearray
    dpi: float  # the dpi actually used (lower than asked for oversized pages)
    # in a render worker: the tmpfs file that already holds the pixels (data is empty)
    shared: str | None = field(default=None, compare=False, repr=False)
    mode: str = "RGB"  # "RGB", "L" (grey) or "1" (packed bits)

    def to_image(self, data: bytes | bytearray | None = None) -> Image.Image:
        return modes.to_image(self.mode, self.width, self.height,
                              self.data if data is None else data)

    def pnm_header(self) -> bytes:
        """Binary PNM's header: with `data` after it, what tesseract reads from stdin."""
        return modes.pnm_header(self.mode, self.width, self.height)

    def __reduce__(self) -> tuple:
        # In a render worker, large pixel data leaves through tmpfs (see below).
        if self.shared is not None:
            return (_from_shared, (self.index, self.width, self.height, self.dpi,
                                   self.shared, self.mode))
        if _shared_tag is not None and len(self.data) >= SHARED_MIN_BYTES:
            path = _to_shared(self.data)
            if path is not None:
                return (_from_shared, (self.index, self.width, self.height, self.dpi, path,
                                       self.mode))
        return (RenderedPage, (self.index, self.width, self.height, self.data, self.dpi,
                               None, self.mode))


@dataclass(frozen=True)
class EncodedPage:
    """A page as the PNG data URL an engine sent (ocrd/engines/remote.py), kept for the
    page's figures instead of its packed pixels while the engine works: a fraction of the
    packed pixels' bytes, and the same string the engine holds."""

    data_url: str

    @staticmethod
    def decodable(width: int, height: int) -> bool:
        """Whether Pillow opens a PNG of this size without its decompression-bomb
        warning (larger pages, up to limits.max_pixels, stay packed)."""
        return width * height <= (Image.MAX_IMAGE_PIXELS or width * height)

    def to_image(self) -> Image.Image:
        png = base64.b64decode(self.data_url.partition(",")[2])
        with Image.open(io.BytesIO(png)) as image:
            return image.convert("RGB")


# ---------------------------------------------------------------------------------------
# Pixels between processes
#
# An A4 page at 144 dpi is 6 MB of RGB. Returned through the process pool's pipe it is
# copied in 64 KiB pieces, with a context switch each, by the one thread that reads all
# results, which capped the render workers well below what they render.
# Instead the worker writes the pixels to a file on tmpfs (one write from PDFium's own
# buffer) and the main process reads it in one call. The main process removes each file
# as it unpickles the page; files left by a killed pool are removed with it, and
# RemoveIPC= in the systemd unit removes any others.

SHARED_DIR = "/dev/shm"
SHARED_PREFIX = "ocrd-page-"
SHARED_MIN_BYTES = 256 * 1024
_shared_tag: str | None = None  # in a render worker: "<daemon pid>-<pool generation>"
_shared_seq = itertools.count()


def _init_worker(tag: str | None, parent: int | None = None) -> None:
    global _shared_tag
    _shared_tag = tag
    # Ctrl-C in a terminal reaches the whole process group; the daemon (or `ocrd
    # convert`) stops its workers itself, so a worker must not die of it with a
    # traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent is not None:
        _die_with_parent(parent)


def _die_with_parent(parent: int) -> None:
    """A worker must not outlive the daemon: when the daemon is SIGKILLed (the OOM
    killer, a test) outside systemd's cgroup clean-up, its workers would otherwise wait
    on their queue forever. Linux only; elsewhere a no-op."""
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the daemon died before the signal was armed
        os._exit(1)


def _to_shared(data: bytes | memoryview) -> str | None:
    """Worker side: data in a new tmpfs file; None (use the pipe) if that fails."""
    path = _shared_path()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:  # tmpfs full: the pipe still works
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    finally:
        os.close(fd)
    return path


def _shared_path() -> str:
    return f"{SHARED_DIR}/{SHARED_PREFIX}{_shared_tag}-{os.getpid()}-{next(_shared_seq)}"


def _from_shared(index: int, width: int, height: int, dpi: float, path: str,
                 mode: str = "RGB") -> RenderedPage:
    """Main side (unpickling a worker's page): read the file and remove it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.unlink(path)
        size = modes.packed_size(mode, width, height)
        data = os.read(fd, size)
        if len(data) < size:  # a short read: rare, but allowed
            chunks = [data]
            got = len(data)
            while got < size and (more := os.read(fd, size - got)):
                chunks.append(more)
                got += len(more)
            data = b"".join(chunks)
    finally:
        os.close(fd)
    return RenderedPage(index, width, height, data, dpi, mode=mode)


def pixels(page: RenderedPage) -> bytes:
    """The page's packed pixels, also in the worker that rendered it (where it may already
    sit in its tmpfs file)."""
    if page.data or page.shared is None:
        return page.data
    with open(page.shared, "rb") as f:
        return f.read()


def _shared_dir_usable() -> bool:
    return os.path.isdir(SHARED_DIR) and os.access(SHARED_DIR, os.W_OK | os.X_OK)


def _remove_shared(prefix: str, only_dead_owners: bool = False) -> None:
    """Remove page files whose names start with prefix (of dead daemons only, if asked)."""
    try:
        names = os.listdir(SHARED_DIR)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        if only_dead_owners:
            owner = number(name[len(SHARED_PREFIX):].split("-", 1)[0])
            if owner is None or _alive(owner):
                continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHARED_DIR, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
