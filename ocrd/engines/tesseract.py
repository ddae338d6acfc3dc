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

from ocrd.config.settings import EngineConfig
from ocrd.engines import orientation, tesseract_tsv
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
                         check=False).stdout
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


class TesseractEngine(Engine):
    kind = "tesseract"
    output_format = "markdown"  # the page's structure, from tesseract's layout
    # tesseract is trained on ~300 dpi text (at 144 dpi it loses accents); a scan keeps
    # its own resolution down to 200 dpi (upscaling it costs time and finds nothing more)
    render_dpi = 300
    scan_dpi = (200, 600)
    page_mode = "L"  # it binarises pages itself: colour only costs memory and time
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
        names (`tesseract --list-langs`), besides the engine's own checks."""
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
        return [*out, f"engine.tesseract.lang = {cfg.tesseract.lang!r}: {problem}"] if problem \
            else out

    async def start(self) -> None:
        if self.binary is None:
            raise EngineDead(NOT_INSTALLED)
        proc = await asyncio.create_subprocess_exec(
            self.binary, "--version", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
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
        log.info("engine_ready", engine="tesseract", version=self.version,
                 lang=self.cfg.lang, workers=self.max_concurrency)

    async def ocr(self, page: PageRequest) -> PageOutput:
        async with self._slots:
            started, t0 = time.time(), time.monotonic()
            tsv, text = await self._read(page, _pnm_parts(page))
            rotation = 0 if self.orientation else None
            turned_image = None
            if self.orientation and page.turned is None and tesseract_tsv.doubtful(tsv):
                # an upside-down page reads as confident-less garbage (a sideways one
                # tesseract reads as it lies): ask OSD, keep the better reading
                angle = await orientation.detect(self._tesseract, page,
                                                 self.cfg.orientation_confidence)
                if angle:
                    turned = replace(page, image=orientation.turn(_image(page), angle),
                                     rendered=None)
                    again = await self._read(page, _pnm_parts(turned))
                    if tesseract_tsv.confidence(again[0]) > tesseract_tsv.confidence(tsv):
                        (tsv, text), rotation = again, angle
                        turned_image = turned.image
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

    async def _read(self, page: PageRequest,
                    image: tuple[bytes, bytes | bytearray]) -> tuple[str, str]:
        """tesseract's TSV and text for the page from one run: every word with its box
        and confidence in its block, paragraph and line (the Markdown's structure, the
        searchable PDF's layer), and where the words have spaces between them."""
        args = ["-l", self.cfg.lang, "--psm", str(self.cfg.psm)]
        if page.dpi >= 70:  # PNM carries no resolution; tesseract would guess 70
            args += ["--dpi", str(round(page.dpi))]
        out = await self._tesseract(image, [*args, "tsv", "txt"])
        return tesseract_tsv.split(out.decode("utf-8", errors="replace"))

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
