"""Which way up a page is, by tesseract's orientation and script detection (`--psm 0`,
the `osd` language data): an upside-down page read as it lies gives hundreds of garbage
words marked `ok`. The engine asks only when a reading is doubtful (its words' mean
confidence is low: tesseract_tsv.doubtful) or lies sideways (tesseract read its lines
top to bottom: `sideways`), turns the page and reads it again; the turn is recorded per
page in the sidecar (`rotation`).

OSD looks at character shapes, not at their size: it runs on a copy reduced to about
OSD_LONG_SIDE pixels, which costs a fraction of reading the page. On a page with few
words it has too little to go on (it refuses, or answers with little confidence): there
the text region alone is looked at — OSD on it, else each turn of it read and the
readings compared by their confidence (`upright_region`), a few small runs of tesseract.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Awaitable, Callable

from PIL import Image

from ocrd.engines import tesseract_tsv
from ocrd.engines.base import PageRequest
from ocrd.outputs.page import Word
from ocrd.render import modes

# px: the copy's long side stays at least this (an A4 page at ~140 dpi or more; at 100
# dpi OSD misjudged sideways pages)
OSD_LONG_SIDE = 1600
_ROTATE = re.compile(rb"^Rotate:\s*(\d+)", re.MULTILINE)
_CONFIDENCE = re.compile(rb"^Orientation confidence:\s*([\d.]+)", re.MULTILINE)
# OSD's "Rotate: N" is the clockwise turn that makes the page upright; Pillow's
# transpositions turn counter-clockwise
_TURN = {90: Image.Transpose.ROTATE_270, 180: Image.Transpose.ROTATE_180,
         270: Image.Transpose.ROTATE_90}

# Runs tesseract on a PNM image (header, pixels) with extra arguments; returns stdout,
# raises RuntimeError when tesseract fails.
Runner = Callable[[tuple[bytes, bytes], list[str]], Awaitable[bytes]]


def osd_input(page: PageRequest) -> tuple[bytes, int]:
    """The page as a small greyscale PGM for OSD, and the factor it was reduced by."""
    if page.rendered is not None:
        r = page.rendered
        factor = max(1, max(r.width, r.height) // OSD_LONG_SIDE)
        grey = modes.reduced_grey(r.mode, r.width, r.height, r.data, factor)
    else:
        assert page.image is not None
        factor = max(1, max(page.image.size) // OSD_LONG_SIDE)
        grey = page.image.convert("L") if page.image.mode != "L" else page.image
        grey = grey.reduce(factor) if factor > 1 else grey
    return modes.pnm_header("L", *grey.size) + grey.tobytes(), factor


def parse(out: bytes, min_confidence: float) -> int:
    """OSD's correction (0, 90, 180, 270), or 0 when it is not confident enough."""
    rotate, confidence = _ROTATE.search(out), _CONFIDENCE.search(out)
    if rotate is None or confidence is None:
        return 0
    angle = int(rotate.group(1)) % 360
    if angle not in _TURN or float(confidence.group(1)) < min_confidence:
        return 0
    return angle


async def detect(run: Runner, page: PageRequest, min_confidence: float) -> int:
    """How many degrees clockwise to turn the page so that it reads upright. A page OSD
    cannot judge (too little text: tesseract then exits non-zero) stays as it is."""
    data, factor = osd_input(page)
    small_dpi = (page.dpi or 300) / factor
    args = ["--psm", "0", "-l", "osd", "--dpi", str(max(70, round(small_dpi)))]
    try:
        out = await run((data, b""), args)
    except RuntimeError:
        return 0
    return parse(out, min_confidence)


# A page with at most this many words is one OSD may not judge: its text region is
# looked at on its own.
FEW_WORDS = 80
# A turn of the text region is taken when its reading's mean word confidence beats every
# other turn's by this much, is at least REGION_READS_WELL, and it has REGION_WORDS words
# read well: text read the right way up stands out (90-97 against 30-60 for the other
# turns, on real lines; 75 against 30-40 typewritten), while a script the language does
# not know reads as a word or two of garbage whichever way it is turned.
BETTER_BY = 25.0
REGION_READS_WELL = 70.0
REGION_WORDS = 2
# A page that lay sideways reads upright with at least this mean confidence.
READ_WELL = 60.0
# Words of at least this many characters whose boxes are this much taller than wide are
# lines read top to bottom: a page lying sideways.
_TALL = 1.5
_MIN_CHARS = 3


def sideways(tsv: str) -> bool:
    """Whether tesseract read most of the page's words as lines running top to bottom
    (it does so on a page lying sideways, and then reads it as it lies)."""
    boxes = [(w.box[2] - w.box[0], w.box[3] - w.box[1]) for w in _words(tsv)
             if len(w.text) >= _MIN_CHARS]
    tall = sum(h > _TALL * w for w, h in boxes)
    return len(boxes) >= 2 and tall > len(boxes) / 2


def _words(tsv: str) -> list[Word]:
    return tesseract_tsv.parse(tsv)[1]


def text_region(tsv: str, size: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """The box around the page's words (with a margin of about a line), None without
    words; `size`: the page's width and height."""
    words = _words(tsv)
    if not words:
        return None
    line = statistics.median(min(w.box[2] - w.box[0], w.box[3] - w.box[1]) for w in words)
    pad = max(8, int(line))
    return (max(0, min(w.box[0] for w in words) - pad), max(0, min(w.box[1] for w in words) - pad),
            min(size[0], max(w.box[2] for w in words) + pad),
            min(size[1], max(w.box[3] for w in words) + pad))


def region_image(page: PageRequest, box: tuple[int, int, int, int]) -> Image.Image:
    """That part of the page, grey (only its rows of a packed page are unpacked)."""
    left, top, right, bottom = box
    if page.rendered is not None:
        r = page.rendered
        band = modes.band_image(r.mode, r.width, r.height, r.data, top, bottom)
        part = band.crop((left, 0, right, band.height))
    else:
        assert page.image is not None
        part = page.image.crop(box)
    return part if part.mode == "L" else part.convert("L")


async def upright_region(run: Runner, page: PageRequest, tsv: str, lang: str,
                         min_confidence: float) -> int:
    """How many degrees clockwise to turn a page of few words so that it reads upright,
    judged on its text region alone: OSD on it, else each turn of it read (as one block
    of text) and the readings compared by their words' confidence. 0: as it lies."""
    box = text_region(tsv, (page.rendered.width, page.rendered.height)
                      if page.rendered is not None else page.image.size)  # type: ignore[union-attr]
    if box is None:
        return 0
    region = region_image(page, box)
    dpi = str(max(70, round(page.dpi or 300)))
    pgm = modes.pnm_header("L", *region.size) + region.tobytes()
    try:
        angle = parse(await run((pgm, b""), ["--psm", "0", "-l", "osd", "--dpi", dpi]),
                      min_confidence)
    except RuntimeError:  # too few characters for OSD
        angle = 0
    if angle:
        return angle
    scores: dict[int, float] = {}
    well: dict[int, int] = {}
    for turn_by in (0, 90, 180, 270):
        turned = turn(region, turn_by)
        data = modes.pnm_header("L", *turned.size) + turned.tobytes()
        try:
            out = await run((data, b""), ["-l", lang, "--psm", "6", "--dpi", dpi, "-c",
                                          "tessedit_create_tsv=1"])
        except RuntimeError:
            out = b""
        tsv_turned = out.decode("utf-8", errors="replace")
        scores[turn_by] = tesseract_tsv.confidence(tsv_turned)
        well[turn_by] = tesseract_tsv.read_well(tsv_turned)
    best = max(scores, key=lambda a: scores[a])
    others = max(v for a, v in scores.items() if a != best)
    if best and scores[best] >= REGION_READS_WELL and well[best] >= REGION_WORDS \
            and scores[best] >= others + BETTER_BY:
        return best
    return 0


def turn(image: Image.Image, angle: int) -> Image.Image:
    return image.transpose(_TURN[angle]) if angle in _TURN else image
