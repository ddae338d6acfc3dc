"""What every benchmark needs: generated inputs, the daemon as a subprocess (the tests'
harness, tests/daemon_process.py, with the benchmarks' settings), and the resident memory
of a process tree sampled from /proc.

Inputs are generated (reportlab, Pillow) under bench/out/, never checked in. Page
content comes from a fixed set of designs, so the same page image can be produced
again outside the daemon (to drive an engine directly with exactly the daemon's pages).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# the checkout, and tests/ for the engines the benchmarks name by class path
# (tests/simulated_engines.py)
for _path in (ROOT / "tests", ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from simulated_engines import SIMULATED as SIMULATED_ENGINE  # noqa: E402, F401 - the engine

from tests.daemon_process import DaemonProcess as SharedDaemon  # noqa: E402
from tests.daemon_process import wait_for as shared_wait_for  # noqa: E402

OUT = ROOT / "bench" / "out"
PAGE_DESIGNS = 40  # distinct page contents; page k of a document uses design k % 40

WORDS = ("invoice payment customer account balance report quarter revenue shipment "
         "delivery warehouse contract signature address number total schedule budget "
         "meeting summary analysis approval request vendor").split()


# -- inputs ------------------------------------------------------------------------------


def design_lines(design: int, n: int = 30) -> list[str]:
    """Deterministic lines of ordinary words for one page design."""
    out = []
    for i in range(n):
        words = [WORDS[(design * 7 + i * 3 + k * 5) % len(WORDS)] for k in range(9)]
        out.append(" ".join(words).capitalize() + f" {design}.{i}")
    return out


def pdf_bytes(pages: int, first_design: int = 0) -> bytes:
    """An A4 text PDF (a heading, lines of text and a table-like grid per page)."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=A4, pageCompression=1)
    for k in range(pages):
        design = (first_design + k) % PAGE_DESIGNS
        c.setFont("Helvetica-Bold", 16)
        # no page number on the page: a design renders to the same pixels wherever it
        # appears, so a benchmark can feed an engine the daemon's exact page images
        c.drawString(60, 790, f"Section {design}: quarterly report")
        c.setFont("Helvetica", 11)
        y = 760
        for line in design_lines(design):
            c.drawString(60, y, line)
            y -= 17
        # a small grid, as many business documents have
        for row in range(6):
            for col in range(4):
                c.rect(60 + col * 120, 180 - row * 20, 120, 20)
                c.drawString(64 + col * 120, 186 - row * 20, f"{design * 10 + row}.{col}")
        c.showPage()
    c.save()
    return buf.getvalue()


def _scan_jpeg(design: int, dpi: int, mode: str) -> bytes:
    """A page design as a scanner would store it: rasterised, slightly soft, JPEG."""
    import pypdfium2 as pdfium
    from PIL import ImageFilter

    doc = pdfium.PdfDocument(pdf_bytes(1, design))
    img = doc[0].render(scale=dpi / 72).to_pil().convert(mode)
    doc.close()
    img = img.filter(ImageFilter.GaussianBlur(0.6))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=80)
    return buf.getvalue()


PAGE_KINDS = ("text", "text-embedded-font", "scan-gray-200dpi", "scan-color-300dpi")


def mixed_pdf_bytes(pages: int, kinds: tuple[str, ...] = PAGE_KINDS) -> bytes:
    """A PDF whose pages cycle through `kinds`: born-digital text (a standard font, an
    embedded TrueType font) and scans (a grey 200 dpi and a colour 300 dpi JPEG per
    page), as an office inbox receives them."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont
    from reportlab.pdfgen import canvas

    pdfmetrics.registerFont(TTFont("DejaVuSans", "DejaVuSans.ttf"))
    scans: dict[tuple[str, int], bytes] = {}
    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=A4, pageCompression=1)
    for k in range(pages):
        kind = kinds[k % len(kinds)]
        design = (k // len(kinds)) % 8
        if kind.startswith("scan"):
            dpi, mode = (200, "L") if "gray" in kind else (300, "RGB")
            key = (kind, design)
            if key not in scans:
                scans[key] = _scan_jpeg(design, dpi, mode)
            c.drawImage(ImageReader(io.BytesIO(scans[key])), 0, 0, width=A4[0],
                        height=A4[1])
        else:
            c.setFont("DejaVuSans" if "embedded" in kind else "Helvetica", 11)
            y = 790
            for line in design_lines(design, 40):
                c.drawString(50, y, line)
                y -= 18
        c.showPage()
    c.save()
    return buf.getvalue()


def write_pdf(path: Path, pages: int, first_design: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pdf_bytes(pages, first_design))
    return path


def png_bytes(i: int, size: tuple[int, int] = (480, 160)) -> bytes:
    """A small, unique image: a receipt-like line of text with the number i."""
    from PIL import Image, ImageDraw

    img = Image.new("L", size, 255)
    draw = ImageDraw.Draw(img)
    draw.text((12, 20), f"Receipt {i:06d}", fill=0)
    draw.text((12, 60), " ".join(WORDS[(i + k) % len(WORDS)] for k in range(5)), fill=0)
    draw.rectangle((12, 110, 12 + (i % 400), 130), fill=0)
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def drop_file(path: Path, data: bytes) -> float:
    """Write a file straight into an inbox the way `cp` does (open, write, close) and
    return the time it was closed."""
    with open(path, "wb") as f:
        f.write(data)
    return time.time()


# -- memory ------------------------------------------------------------------------------

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def tree_pids(root: int) -> list[int]:
    """root and all its descendants, from /proc/PID/task/TID/children."""
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
            except OSError:
                continue
    return out


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


def _comm(pid: int) -> str:
    """A short description of a process: its role for Python workers, else its name."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(a.decode(errors="replace") for a in args if a)
    for key in ("resource_tracker", "spawn_main", "ocrd run"):
        if key in text:
            return key
    return os.path.basename(args[0].decode(errors="replace")) if args else "?"


class TreeRss:
    """Samples the summed RSS of a process tree every `interval` seconds in a thread."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self.peak_procs = 0
        self.peak_by_process: dict[str, float] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> TreeRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> int:
        pids = tree_pids(self.pid)
        sizes = {p: rss_bytes(p) for p in pids}
        total = sum(sizes.values())
        if total > self.peak:
            self.peak, self.peak_procs = total, len(pids)
            self.peak_by_process = {f"{p} {_comm(p)}": round(n / 2**20, 1)
                                    for p, n in sizes.items()}
        self.samples += 1
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)


# -- the daemon --------------------------------------------------------------------------


def daemon_config(root: Path, engine: dict, **top: Any) -> dict:
    """A daemon config for one benchmark: one inbox under root, its folders made (as an
    admin makes them: a missing one would pause the inbox), JSON logs at info level
    (what a production daemon logs), no metrics port (runs must not collide)."""
    inbox = top.pop("inbox", {})
    for folder in ("outbox", "failed", "archive"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    return {
        "state_dir": str(root / "state"),
        "engine": engine,
        "metrics": {"listen": None},
        # the console off (runs must not collide on its port); page previews on, as in
        # production
        "web": {"listen": None},
        "log": {"level": "info", "format": "json"},
        "inboxes": [{"path": str(root / "inbox"), "outbox": str(root / "outbox"),
                     "failed": str(root / "failed"), "archive": str(root / "archive"),
                     **inbox}],
        **top,
    }


class DaemonProcess(SharedDaemon):
    """`ocrd run` for one benchmark (tests/daemon_process.py, the tests' harness too);
    its JSON log goes to root/daemon.log. A daemon that does not stop in time is killed
    without complaint: the benchmark has measured what it came for."""

    def __init__(self, root: Path, config: dict, prefix: list[str] | None = None) -> None:
        super().__init__(root, config, cwd=ROOT, prefix=prefix)
        self.inbox = Path(config["inboxes"][0]["path"])
        self.outbox = Path(config["inboxes"][0]["outbox"])
        self.failed = Path(config["inboxes"][0]["failed"])

    def start(self, wait_ready: bool = True, timeout: float = 120,
              systemd: dict[str, str] | None = None) -> DaemonProcess:
        self.inbox.mkdir(parents=True, exist_ok=True)
        for box in self.config["inboxes"]:  # ocrd creates no missing destination
            for key in ("outbox", "failed", "archive"):
                if box.get(key):
                    Path(box[key]).mkdir(parents=True, exist_ok=True)
        super().start(wait_ready, timeout, systemd)
        return self

    def stop(self, timeout: float = 60, strict: bool = False) -> int:
        return super().stop(timeout, strict)

    def wait_markdown(self, n: int, timeout: float, every: float = 0.05) -> list[float]:
        """wait_markdown() on the outbox, failing at once if the daemon dies. On a
        timeout the daemon gets SIGABRT, so faulthandler writes every thread's stack to
        its log, and the error carries the log's end."""
        assert self.proc is not None
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {proc.returncode} before "
                                   f"{n} Markdown files appeared:\n{self.log_text()[-3000:]}")
            return len(markdown_files(self.outbox)) >= n

        try:
            wait_for(ready, timeout, f"{n} Markdown files in {self.outbox}", every)
        except TimeoutError as e:
            if proc.poll() is None:
                proc.send_signal(signal.SIGABRT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
            raise TimeoutError(f"{e}; daemon log ends:\n{self.log_text()[-6000:]}") from None
        return sorted(e.stat().st_mtime for e in markdown_files(self.outbox))

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def event_time(ev: dict) -> float:
    """The epoch seconds of a structlog ISO timestamp."""
    return datetime.fromisoformat(ev["timestamp"].replace("Z", "+00:00")).timestamp()


def wait_for(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """pred()'s first true value, polled every `every` s; TimeoutError after `timeout`."""
    return shared_wait_for(pred, timeout, what, every, error=TimeoutError)


def markdown_files(folder: Path) -> list[os.DirEntry]:
    """The NAME.md entries directly in folder."""
    try:
        with os.scandir(folder) as it:
            return [e for e in it if e.name.endswith(".md") and not e.name.startswith(".")]
    except FileNotFoundError:
        return []


def wait_markdown(folder: Path, n: int, timeout: float, every: float = 0.05) -> list[float]:
    """Wait until folder holds n Markdown files; returns their mtimes (when each was
    written), sorted."""
    wait_for(lambda: len(markdown_files(folder)) >= n, timeout,
             f"{n} Markdown files in {folder}", every)
    return sorted(e.stat().st_mtime for e in markdown_files(folder))
