"""Which way up a page is, by tesseract's orientation and script detection (`--psm 0`,
the `osd` language data): an upside-down page read as it lies gives hundreds of garbage
words marked `ok`. The engine asks OSD only when a reading is doubtful (its words' mean
confidence is low: tesseract_tsv.doubtful), turns the page and reads it again; the turn
is recorded per page in the sidecar (`rotation`).

OSD looks at character shapes, not at their size: it runs on a copy reduced to about
OSD_LONG_SIDE pixels, which costs a fraction of reading the page.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from PIL import Image

from ocrd.engines.base import PageRequest
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


def turn(image: Image.Image, angle: int) -> Image.Image:
    return image.transpose(_TURN[angle]) if angle in _TURN else image
