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
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog
from PIL import Image

from ocrd.config.engine import TesseractConfig
from ocrd.config.settings import EngineConfig
from ocrd.engines import orientation, tesseract_tsv, unread
from ocrd.engines.base import Engine, PageRequest
from ocrd.errors import EngineDead
from ocrd.layout import page as layout
from ocrd.layout.reading import Box, Ink, Look, Reading, Stroke
from ocrd.outputs.page import PageOutput, Word, unturn
from ocrd.render import modes

log = structlog.get_logger("ocrd.engine.tesseract")

FEED_BYTES = 1 << 20  # written to tesseract's stdin at a time
NOT_INSTALLED = "tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng)"


def _languages(binary: str) -> set[str]:
    """The languages whose data tesseract finds (`--list-langs`, which honours
    TESSDATA_PREFIX)."""
    out = subprocess.run([binary, "--list-langs"], capture_output=True, timeout=60,
                         check=False, start_new_session=True).stdout
    lines = out.decode(errors="replace").splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("List of")}


def _missing_languages(lang: str, have: set[str]) -> str | None:
    """What is missing of `lang` ('eng+fra'), with the command that installs it (Debian's
    packages: tesseract-ocr-fra, tesseract-ocr-chi-sim); None when nothing is."""
    missing = [x for x in lang.split("+") if x not in have]
    if not missing:
        return None
    packages = " ".join("tesseract-ocr-" + x.lower().replace("_", "-") for x in missing)
    return (f"tesseract has no language data for {'+'.join(missing)}: apt-get install "
            f"{packages} (installed: {'+'.join(sorted(have - {'osd'})) or 'none'})")
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

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg.tesseract
        self.max_concurrency = self.cfg.workers or os.cpu_count() or 1
        self._slots = asyncio.Semaphore(self.max_concurrency)
        self.binary = shutil.which("tesseract")
        self.version = "?"
        self.model = f"tesseract:{self.cfg.lang}"
        self.orientation = self.cfg.orientation

    @classmethod
    def preflight(cls, cfg: EngineConfig) -> list[str]:
        """tesseract installed, with the data of every language engine.tesseract.lang
        names (`tesseract --list-langs`), and able to read a tiny page as set up (a
        tessdata folder without configs/ ...: self_test), besides the engine's own checks."""
        out = super().preflight(cfg)
        binary = shutil.which("tesseract")
        if binary is None:
            return [*out, f"engine.kind = {cfg.kind!r}: {NOT_INSTALLED}"]
        try:
            have = _languages(binary)
        except (OSError, subprocess.SubprocessError) as e:
            return [*out, f"engine.kind = {cfg.kind!r}: tesseract does not run "
                    f"(`tesseract --list-langs`: {e})"]
        problem = _missing_languages(cfg.tesseract.lang, have)
        if problem:
            return [*out, f"engine.tesseract.lang = {cfg.tesseract.lang!r}: {problem}"]
        return out + self_test(cfg.tesseract, binary)  # reads a page, as it is set up

    async def start(self) -> None:
        if self.binary is None:
            raise EngineDead(NOT_INSTALLED)
        proc = await asyncio.create_subprocess_exec(
            self.binary, "--version", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        out, _ = await proc.communicate()
        first = out.decode(errors="replace").splitlines()[:1]
        self.version = first[0].split()[-1] if first else "?"
        have = await asyncio.to_thread(_languages, self.binary)
        if self.orientation and "osd" not in have:
            self.orientation = False
            log.warning("orientation_off", why="tesseract has no 'osd' language data "
                        "(apt-get install tesseract-ocr-osd): pages are read as they lie")
        missing = _missing_languages(self.cfg.lang, have)
        if missing:
            raise EngineDead(missing)
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
            if self.orientation and page.turned is None:  # (a person turned it: as they did)
                found = await self._upright(page, tsv)
                if found is not None:
                    (tsv, text), rotation, turned_image = found
            if self.cfg.psm == unread.AUTO_PSM and unread.applies(self.cfg.lang):
                column = await self._as_one_column(page, tsv, turned_image)
                if column is not None:
                    tsv, text = column
        # layout analysis is CPU work: off the event loop
        reading, text, words = await asyncio.to_thread(
            _structure, page, tsv, text, turned_image, self._look(page, turned_image),
            _stroke(page, turned_image))
        if rotation:  # boxes on the page as given, not as turned
            size = _size(page)
            words = [replace(w, box=unturn(w.box, rotation, size)) for w in words]
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

    async def _as_one_column(self, page: PageRequest, tsv: str,
                             turned: Image.Image | None) -> tuple[str, str] | None:
        """The page (as turned to be read) read again as one column of text when the
        automatic layout left most of its text unread, and that reading is clearly
        better (engines/unread.py); None to keep the reading."""
        first_well = tesseract_tsv.read_well(tsv)
        if first_well >= unread.ENOUGH_READ_WELL:
            return None
        image = turned if turned is not None else _image(page)
        if not await asyncio.to_thread(unread.should_read_again, image, page.dpi,
                                       tesseract_tsv.word_boxes(tsv)):
            return None
        shown = page if turned is None else replace(page, image=turned, rendered=None)
        again = await self._read(shown, _pnm_parts(shown), psm=unread.COLUMN_PSM)
        again_well = tesseract_tsv.read_well(again[0])
        kept = unread.better(first_well, again_well)
        log.debug("page_read_as_one_column", page=page.page_no, read_well=first_well,
                  as_one_column=again_well, kept=kept)
        return again if kept else None

    async def _read(self, page: PageRequest, image: tuple[bytes, bytes | bytearray],
                    psm: int | None = None) -> tuple[str, str]:
        """tesseract's TSV and text for the page from one run: every word with its box
        and confidence in its block, paragraph and line (the Markdown's structure, the
        searchable PDF's layer), and where the words have spaces between them. `psm`:
        this page segmentation instead of engine.tesseract.psm."""
        out = await self._tesseract(image, read_args(self.cfg, page.dpi, psm))
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

    def _look(self, page: PageRequest, turned: Image.Image | None) -> Look:
        """A second look at parts of the page tesseract read: the parts cut out, stacked
        one under another on a sheet, read in one run (a block of text, with only the
        characters asked for); what each part reads as ("" where nothing) and the
        confidence. It runs in the layout's thread, a small tesseract process of its
        own."""
        crop = _cropper(page, turned)

        def look(boxes: list[Box], chars: str) -> list[tuple[str, float]]:
            assert self.binary is not None
            nothing = [("", 0.0)] * len(boxes)
            sheet, bands = marks_sheet([crop(b) for b in boxes])
            args = [self.binary, "stdin", "stdout", "-l", self.cfg.lang, "--psm", "6"]
            if chars:
                args += ["-c", f"tessedit_char_whitelist={chars}"]
            if page.dpi >= 70:
                args += ["--dpi", str(round(page.dpi))]
            try:
                done = subprocess.run([*args, "tsv"], input=pnm(sheet), capture_output=True,
                                      timeout=self.cfg.timeout_seconds,
                                      env={**os.environ, "OMP_THREAD_LIMIT": "1"})
            except (OSError, subprocess.SubprocessError):
                return nothing
            if done.returncode != 0:
                return nothing
            return tesseract_tsv.band_texts(done.stdout.decode("utf-8", errors="replace"),
                                            bands)
        return look

    def describe(self) -> dict:
        return {"kind": self.kind, "model": self.model, "version": self.version,
                "lang": self.cfg.lang, "psm": self.cfg.psm, "orientation": self.orientation}


def read_args(cfg: TesseractConfig, dpi: float, psm: int | None = None) -> list[str]:
    """tesseract's arguments for reading a page: its TSV and its text, from one run
    (`psm`: this page segmentation instead of the configured one)."""
    args = ["-l", cfg.lang, "--psm", str(cfg.psm if psm is None else psm)]
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
        return [f"engine.kind: tesseract: {NOT_INSTALLED}"]
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    try:
        # (its own session, as --list-langs and --version at the start: a Ctrl-C in the
        # terminal while the daemon starts stops the daemon, and is not read as a
        # tesseract that cannot read a page)
        r = subprocess.run([binary, "stdin", "stdout", *read_args(cfg, 300)],
                           input=pnm(sample_page()), capture_output=True, env=env,
                           timeout=SELF_TEST_SECONDS, check=False, start_new_session=True)
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
    """Where the page tesseract read has marks (pixels that stand out from its paper):
    for list markers and check boxes it did not read. The page's marks are found once,
    at the first question (most pages ask none)."""
    image = turned if turned is not None else _image(page)
    marks: list[Image.Image] = []

    def ink(box: tuple[int, int, int, int]) -> tuple[tuple[int, int, int, int], int] | None:
        if not marks:
            grey = image if image.mode == "L" else image.convert("L")
            table = modes.marks_table(modes.paper(grey.reduce(4) if min(grey.size) >= 64
                                                  else grey))
            marks.append(grey.point(table))
        return modes.mark_box(marks[0], box)
    return ink


def _cropper(page: PageRequest, turned: Image.Image | None,
             ) -> Callable[[Box], Image.Image]:
    """Parts of the page tesseract read, with a margin of two pixels, as grey images
    (only their rows unpacked)."""
    image = turned if turned is not None else page.image
    width, height = image.size if image is not None else _size(page)

    def crop(box: Box) -> Image.Image:
        left, top = max(0, box[0] - 2), max(0, box[1] - 2)
        right, bottom = min(width, max(left + 1, box[2] + 2)), min(height, max(top + 1,
                                                                               box[3] + 2))
        if image is not None:
            part = image.crop((left, top, right, bottom))
        else:
            r = page.rendered
            band = modes.band_image(r.mode, r.width, r.height, r.data, top, bottom)
            part = band.crop((left, 0, right, band.height))
        return part if part.mode == "L" else part.convert("L")
    return crop


_PAPER = [255 if v > 160 else v for v in range(256)]  # light grey: paper, made white


def marks_sheet(parts: list[Image.Image]) -> tuple[Image.Image, list[tuple[int, int]]]:
    """Small parts of a page one under another on a white sheet, as many of their own
    heights apart, with a margin around each; and the band of rows each one holds. Their
    paper is made as white as the sheet's (a scan's light grey beside pure white throws
    tesseract's threshold: "571.39" read as "a7 1.89")."""
    parts = [p.point(_PAPER) for p in parts]
    pad = 4
    tall = max(p.height for p in parts) + 2 * pad
    wide = max(p.width for p in parts) + 2 * pad
    sheet = Image.new("L", (wide + 2 * tall, tall * (2 * len(parts) + 1)), 255)
    bands = []
    for k, part in enumerate(parts):
        top = tall * (2 * k + 1)
        sheet.paste(part, (tall + pad, top + pad + (tall - 2 * pad - part.height) // 2))
        bands.append((top - tall // 2, top + tall + tall // 2))
    return sheet, bands


def _stroke(page: PageRequest, turned: Image.Image | None) -> Stroke:
    """How thick the strokes are on the page tesseract read (bold type from regular)."""
    image = turned if turned is not None else page.image
    if image is not None:
        return lambda box: modes.stroke_width(image, box)
    rendered = page.rendered

    def stroke(box: Box) -> float | None:
        band = modes.band_image(rendered.mode, rendered.width, rendered.height,
                                rendered.data, box[1], box[3])
        if band.height == 0:
            return None
        return modes.stroke_width(band, (box[0], 0, box[2], band.height))
    return stroke


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


def _structure(page: PageRequest, tsv: str, text: str, turned: Image.Image | None,
               look: Look | None = None, stroke: Stroke | None = None,
               ) -> tuple[Reading, str, list[Word]]:
    """tesseract's reading of a page, its Markdown with the page's structure, and the
    words of the searchable PDF's text layer."""
    reading = tesseract_tsv.read(tsv, text)
    # ruling lines tesseract does not report (it finds few): from the pixels
    reading.rules.extend(modes.ruling_lines(_image(page) if turned is None else turned,
                                            page.dpi))
    return (reading, layout.to_markdown(reading, _ink(page, turned), look, stroke),
            tesseract_tsv.layer_words(reading))
