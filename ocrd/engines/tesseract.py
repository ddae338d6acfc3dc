"""The CPU engine: the `tesseract` program, one process per page.

Why the command line and not tesserocr/pytesseract: a subprocess per page runs truly in
parallel (no GIL, no thread-safety questions in libtesseract), a crash or a hang on one
page kills only that process (it is killed on timeout), there is nothing to compile
against the system's libtesseract, and the page travels through a pipe as PPM, so no
temporary files are written. The process start is small next to OCR time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import replace
from typing import Any

import structlog
from PIL import Image

from ocrd.config.engine import TesseractConfig
from ocrd.config.settings import EngineConfig
from ocrd.engines import orientation, tesseract_tsv
from ocrd.engines.base import Engine, PageRequest
from ocrd.errors import EngineDead
from ocrd.layout import page as layout
from ocrd.layout.reading import Ink, Reading
from ocrd.outputs.page import PageOutput, Word
from ocrd.render import modes

log = structlog.get_logger("ocrd.engine.tesseract")

FEED_BYTES = 1 << 20  # written to tesseract's stdin at a time
# The outputs (TSV, then text) asked for by variable, not by the names of tesseract's
# config files (`tsv txt`): a tessdata folder without tesseract's configs/ (a download of
# tessdata_best or tessdata_fast) has no such files, and tesseract then writes plain
# text only and exits 0 — every page would pass as blank.
OUTPUTS = ("-c", "tessedit_create_tsv=1", "-c", "tessedit_create_txt=1",
           # the text says where the page has spaces (tesseract_tsv._space), whatever the
           # first language: kor sets this itself, but eng+kor would space every syllable
           "-c", "preserve_interword_spaces=1")
# Seconds the self-test's one tiny page may take (a cold start loads the language data).
SELF_TEST_SECONDS = 120.0


class TesseractEngine(Engine):
    kind = "tesseract"
    output_format = "markdown"  # the page's structure, from tesseract's layout
    # tesseract is trained on ~300 dpi text (at 144 dpi it loses accents); a scan keeps
    # its own resolution down to 200 dpi (upscaling it costs time and finds nothing more)
    render_dpi = 300
    scan_dpi = (200, 600)
    # it binarises pages itself: colour mostly costs memory and time (a colour photo comes
    # in colour all the same: _read_colour)
    page_mode = "L"
    # tesseract's own peak RSS per pixel in each mode (measured with tesseract 5.3), plus
    # the packed page in the daemon and the render worker
    pixel_bytes = {"1": 7.5, "L": 11.0, "RGB": 17.0}  # noqa: RUF012 - read only

    @classmethod
    def preflight(cls, cfg: EngineConfig) -> list[str]:
        problems = super().preflight(cfg)
        if shutil.which("tesseract") is not None:  # (not installed: start says so)
            problems += self_test(cfg.tesseract)
        return problems

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg.tesseract
        self.max_concurrency = self.cfg.workers or os.cpu_count() or 1
        self._slots = asyncio.Semaphore(self.max_concurrency)
        self.binary = shutil.which("tesseract")
        self.version = "?"
        self.model = f"tesseract:{self.cfg.lang}"
        self.orientation = self.cfg.orientation

    async def start(self) -> None:
        if self.binary is None:
            raise EngineDead("tesseract is not installed (apt-get install tesseract-ocr "
                             "tesseract-ocr-eng)")
        proc = await asyncio.create_subprocess_exec(
            self.binary, "--version", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        first = out.decode(errors="replace").splitlines()[:1]
        self.version = first[0].split()[-1] if first else "?"
        proc = await asyncio.create_subprocess_exec(
            self.binary, "--list-langs", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        have = set(out.decode(errors="replace").split())
        if self.orientation and "osd" not in have:
            self.orientation = False
            log.warning("orientation_off", why="tesseract has no 'osd' language data "
                        "(apt-get install tesseract-ocr-osd): pages are read as they lie")
        missing = [lang for lang in self.cfg.lang.split("+") if lang not in have]
        if missing:
            raise EngineDead(f"tesseract has no language data for {'+'.join(missing)} "
                             f"(apt-get install tesseract-ocr-{missing[0]})")
        problems = await asyncio.to_thread(self_test, self.cfg, self.binary)
        if problems:
            raise EngineDead("; ".join(problems))
        log.info("engine_ready", engine="tesseract", version=self.version,
                 lang=self.cfg.lang, workers=self.max_concurrency)

    async def ocr(self, page: PageRequest) -> PageOutput:
        async with self._slots:
            started, t0 = time.time(), time.monotonic()
            if _in_colour(page):
                tsv, text = await self._read_colour(page)
            else:
                tsv, text = await self._read(page, _pnm_parts(page))
            rotation = 0 if self.orientation else None
            turned_image = None
            if self.orientation:
                found = await self._upright(page, tsv)
                if found is not None:
                    (tsv, text), rotation, turned_image = found
        # layout analysis is CPU work: off the event loop
        reading, text, words = await asyncio.to_thread(_structure, page, tsv, text,
                                                       turned_image)
        if rotation:  # boxes on the page as given, not as turned
            size = _size(page)
            words = [replace(w, box=orientation.unturn(w.box, rotation, size)) for w in words]
        return PageOutput(text=text, finish_reason="stop",
                          tokens=sum(len(line.tokens) for line in reading.lines),
                          seconds=time.monotonic() - t0, started_at=started,
                          finished_at=time.time(), rotation=rotation, words=words)

    async def _read_colour(self, page: PageRequest) -> tuple[str, str]:
        """A colour photo (ocrd/render/pages.py keeps one in colour) read grey, as every
        page is, and where that reading is weak in colour too: the better reading kept
        (most words read well, then the higher confidence). tesseract thresholds each
        colour on its own, so text of about the background's brightness, which grey
        loses, still stands out."""
        grey = _image(page).convert("L")
        first = await self._read(page, _pnm_parts(replace(page, image=grey, rendered=None)))
        del grey
        if not tesseract_tsv.weak(first[0]):
            return first
        again = await self._read(page, _pnm_parts(page))
        key = (tesseract_tsv.read_well, tesseract_tsv.confidence)
        return max((first, again), key=lambda r: tuple(f(r[0]) for f in key))

    async def _upright(self, page: PageRequest, tsv: str
                       ) -> tuple[tuple[str, str], int, Image.Image] | None:
        """The page read upright when it lies otherwise: (its reading, the clockwise turn,
        the turned image), or None to keep the reading as it lies. An upside-down page
        reads as confident-less garbage, a sideways one tesseract reads top to bottom:
        OSD is asked, on the text region alone for a page of few words (where OSD on the
        whole page has too little to go on), and the better reading kept."""
        lying = orientation.sideways(tsv)
        if not (lying or tesseract_tsv.doubtful(tsv)):
            return None
        angle = await orientation.detect(self._tesseract, page,
                                         self.cfg.orientation_confidence)
        if not angle and len(tesseract_tsv.parse(tsv)[1]) <= orientation.FEW_WORDS:
            angle = await orientation.upright_region(self._tesseract, page, tsv,
                                                     self.cfg.lang,
                                                     self.cfg.orientation_confidence)
        if not angle:
            return None
        turned = replace(page, image=orientation.turn(_image(page), angle), rendered=None)
        again = await self._read(page, _pnm_parts(turned))
        better = tesseract_tsv.confidence(again[0]) > tesseract_tsv.confidence(tsv)
        # read as it lies, a sideways page may read about as well: upright is the page
        # whose lines run across and that reads well
        upright = lying and not orientation.sideways(again[0]) and \
            tesseract_tsv.confidence(again[0]) >= orientation.READ_WELL
        if not (better or upright):
            return None
        assert turned.image is not None
        return again, angle, turned.image

    async def _read(self, page: PageRequest,
                    image: tuple[bytes, bytes | bytearray]) -> tuple[str, str]:
        """tesseract's TSV and text for the page from one run: every word with its box
        and confidence in its block, paragraph and line (the Markdown's structure, the
        searchable PDF's layer), and where the words have spaces between them."""
        out = await self._tesseract(image, read_args(self.cfg, page.dpi))
        tsv, text = tesseract_tsv.split(out.decode("utf-8", errors="replace"))
        if not tsv:  # never a blank page: tesseract did not do what it was asked
            raise EngineDead(not_tsv(text, "", self.binary or "tesseract"))
        return tsv, text

    async def _tesseract(self, image: tuple[bytes, bytes | bytearray],
                         args: list[str]) -> bytes:
        """Run tesseract on one PNM image (header, pixels) from stdin; its stdout."""
        assert self.binary is not None
        # OMP threads inside tesseract fight with our own parallelism: one per process.
        env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
        proc = await asyncio.create_subprocess_exec(
            self.binary, "stdin", "stdout", *args, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
        # stdout and stderr are read while the page is written: a pipe that fills up
        # would otherwise stop tesseract, and with it the writing
        reading = asyncio.gather(_read(proc.stdout), _read(proc.stderr))
        try:
            async with asyncio.timeout(self.cfg.timeout_seconds):
                await _feed(proc.stdin, image)
                out, err = await reading
                await proc.wait()
        except (TimeoutError, asyncio.CancelledError):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            reading.cancel()
            with contextlib.suppress(BaseException):
                await reading
            await proc.wait()
            raise
        if proc.returncode != 0:
            msg = err.decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"tesseract exited with {proc.returncode}: "
                               f"{msg[-1] if msg else ''}")
        return out

    def describe(self) -> dict:
        return {"kind": self.kind, "model": self.model, "version": self.version,
                "lang": self.cfg.lang, "psm": self.cfg.psm, "orientation": self.orientation}


def read_args(cfg: TesseractConfig, dpi: float) -> list[str]:
    """tesseract's arguments for reading a page: its TSV and its text, from one run."""
    args = ["-l", cfg.lang, "--psm", str(cfg.psm)]
    if dpi >= 70:  # PNM carries no resolution; tesseract would guess 70
        args += ["--dpi", str(round(dpi))]
    return [*args, *OUTPUTS]


def self_test(cfg: TesseractConfig, binary: str | None = None) -> list[str]:
    """tesseract run once as the engine runs it, on a tiny page of printed text: what
    keeps it from giving ocrd the page's words (it fails, or writes something other than
    its TSV table), one line per problem with the fix; [] when it works. The engine's
    start refuses to go on without it; check-config asks too (Engine.preflight)."""
    binary = binary or shutil.which("tesseract")
    if binary is None:
        return ["engine.kind: tesseract: tesseract is not installed (apt-get install "
                "tesseract-ocr tesseract-ocr-eng)"]
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    try:
        r = subprocess.run([binary, "stdin", "stdout", *read_args(cfg, 300)],
                           input=pnm(sample_page()), capture_output=True, env=env,
                           timeout=SELF_TEST_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"engine.tesseract: tesseract ({binary}) did not read a test page ({e})"]
    said = r.stderr.decode(errors="replace")
    if r.returncode != 0:
        last = [ln for ln in said.splitlines() if ln.strip()][-1:] or [""]
        return [f"engine.tesseract: tesseract ({binary}) fails on a test page with lang "
                f"{cfg.lang!r} (exit {r.returncode}: {last[0].strip()[:200]}); "
                f"{_data_fix(cfg.lang)}"]
    tsv, text = tesseract_tsv.split(r.stdout.decode("utf-8", errors="replace"))
    if not tsv:
        return [f"engine.tesseract: {not_tsv(text, said, binary)}"]
    return []


def sample_page() -> Image.Image:
    """A tiny page of printed text (grey, as the engine's pages are)."""
    from PIL import ImageDraw, ImageFont

    page = Image.new("L", (640, 160), 255)
    ImageDraw.Draw(page).text((40, 40), "Ocrd 2024", fill=0,
                              font=ImageFont.load_default(size=64))
    return page


def not_tsv(text: str, said: str, binary: str) -> str:
    """Why tesseract's output is not what ocrd reads, and what to do about it."""
    got = " ".join(text.split())[:60]
    complaint = next((ln.strip() for ln in said.splitlines() if ln.strip()), "")
    return (f"tesseract ({binary}) wrote no TSV table, only "
            f"{repr(got) if got else 'nothing'}"
            f"{f' (it said: {complaint[:160]})' if complaint else ''}: its setup is "
            f"broken, and every page would pass as blank; {_data_fix()}")


def _data_fix(lang: str = "") -> str:
    prefix = os.environ.get("TESSDATA_PREFIX")
    first = lang.split("+")[0] if lang else ""
    if prefix:
        return (f"TESSDATA_PREFIX={prefix!r} names the language data: make it a complete "
                f"tessdata folder{f' with {first}.traineddata' if first else ''} (or "
                "unset it to use the system's)")
    return ("reinstall tesseract's language data (apt-get install --reinstall "
            f"tesseract-ocr-{first.replace('_', '-') or 'eng'})")


def _pnm_parts(page: PageRequest) -> tuple[bytes, bytes | bytearray]:
    """The page as binary PNM (header, pixels): a rendered page's own bytes, uncopied."""
    if page.rendered is not None:
        return page.rendered.pnm_header(), page.rendered.data
    assert page.image is not None
    image = page.image
    if image.mode not in ("1", "L", "RGB"):
        image = image.convert("RGB")
    # PBM's 1 is black, Pillow's is white: "1;I" inverts
    data = image.tobytes("raw", "1;I") if image.mode == "1" else image.tobytes()
    return modes.pnm_header(image.mode, image.width, image.height), data


def _ink(page: PageRequest, turned: Image.Image | None) -> Ink:
    """Where the page tesseract read has dark pixels: for list markers it did not read."""
    image = turned if turned is not None else page.image
    if image is not None or page.rendered is None:
        assert image is not None
        return lambda box: modes.dark_box(image, box)
    rendered = page.rendered

    def ink(box: tuple[int, int, int, int]) -> tuple[tuple[int, int, int, int], int] | None:
        top = max(0, box[1])
        band = modes.band_image(rendered.mode, rendered.width, rendered.height,
                                rendered.data, top, box[3])
        if band.height == 0:
            return None
        dark = modes.dark_box(band, (box[0], 0, box[2], band.height))
        if dark is None:
            return None
        (left, y0, right, y1), count = dark
        return (left, y0 + top, right, y1 + top), count
    return ink


def _in_colour(page: PageRequest) -> bool:
    """A page that reached this engine (which reads grey) in colour: a colour photo."""
    mode = page.rendered.mode if page.rendered is not None else \
        page.image.mode if page.image is not None else "L"
    return mode == "RGB"


def _size(page: PageRequest) -> tuple[int, int]:
    if page.rendered is not None:
        return page.rendered.width, page.rendered.height
    assert page.image is not None
    return page.image.size


def _image(page: PageRequest) -> Image.Image:
    if page.rendered is not None:
        return page.rendered.to_image()
    assert page.image is not None
    return page.image


async def _feed(stdin: asyncio.StreamWriter | None, image: tuple[bytes, Any]) -> None:
    """Write the image in pieces, so that the pipe's buffer never holds a copy of it."""
    assert stdin is not None
    header, data = image
    try:
        stdin.write(header)
        view = memoryview(data)
        for at in range(0, len(view), FEED_BYTES):
            stdin.write(view[at:at + FEED_BYTES])
            await stdin.drain()
        await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # tesseract stopped reading: its exit status says why
    finally:
        stdin.close()


async def _read(stream: asyncio.StreamReader | None) -> bytes:
    assert stream is not None
    return await stream.read()


def pnm(image: Image.Image) -> bytes:
    """An image as binary PNM, what tesseract reads from stdin without any decoding
    cost: PBM for 1-bit pages, PGM for grey, PPM for colour (kept in its own mode)."""
    header, data = _pnm_parts(PageRequest(image=image, page_no=1, doc_id=""))
    return header + bytes(data)


def _structure(page: PageRequest, tsv: str, text: str, turned: Image.Image | None
               ) -> tuple[Reading, str, list[Word]]:
    """tesseract's reading of a page, its Markdown with the page's structure, and the
    words of the searchable PDF's text layer."""
    reading = tesseract_tsv.read(tsv, text)
    return (reading, layout.to_markdown(reading, _ink(page, turned)),
            tesseract_tsv.layer_words(reading))
