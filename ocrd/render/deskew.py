"""A page that went into the scanner askew, straightened before any engine reads it.

The skew is measured from the page's text lines: the page's dark pixels are summed row
by row in narrow vertical strips, and the strips are slid against each other as lines
tilted by each angle would lie. Where the ink gathers into the fewest rows, the lines
run straight; the angle is then refined to a tenth of a degree where the rows' sums
change most sharply from one row to the next (projection profiles, after Postl and
Bloomberg). ±MAX_ANGLE degrees are searched, on a copy of the page reduced to about
ESTIMATE_DPI, with wide dark areas (a dark scanner lid, a photograph) left out. The
page's edges against a dark lid would be the other witness: text lines are right far
more often, and against a white lid there are no edges to see (bench/deskew.py).

The straightened page is the same picture turned about its centre, on a canvas grown to
hold all of it (`Skew`): every box the engine finds on it maps back to the page as
scanned with `Skew.to_original`, exactly (the affine transform the pixels went through),
so that the searchable PDF's words lie on the original scan, which stays untouched.
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
from array import array
from dataclasses import dataclass, replace

from PIL import Image, ImageChops, ImageFilter

from ocrd.render import modes, pages, pixels
from ocrd.render.pages import DocInfo
from ocrd.render.pixels import RenderedPage
from ocrd.render.resolution import Resolution

MAX_ANGLE = 15.0  # degrees either way
STEP = 0.1  # degrees: the finest step of the search
# below this, a page is read as it lies: tesseract reads lines this close to level
# as well as level ones, and turning costs a pass over the page's pixels
MIN_ANGLE = 0.3
ESTIMATE_DPI = 100  # the reduced copy's resolution
# vertical strips whose row sums are slid against each other: narrow enough that a line
# turned by MAX_ANGLE rises less than a letter's height across one
STRIPS = 64
_COARSE = 0.5  # degrees: the first pass's step
_INK = [255 if v < 128 else 0 for v in range(256)]  # dark pixels of a grey page
_GROUND = [255 if v < 80 else 0 for v in range(256)]  # ... and, reduced, wide dark areas
_NOT_PAPER = [255 if v < 224 else 0 for v in range(256)]  # anything but white paper
# share of the reduced page's pixels that are dark: less is a blank page (nothing to
# measure), more a photograph or a dark scan (rows of text do not stand out)
MIN_INK, MAX_INK = 0.002, 0.35
# how much sharper the rows must be at the best angle than on average over the search:
# pictures and blank pages score alike at every angle
MIN_CONTRAST = 1.15


@dataclass(frozen=True)
class Skew:
    """How a page was straightened: turned by `angle` degrees (clockwise, undoing a
    counter-clockwise skew) about its centre onto a canvas of `turned` size, from a page
    of `size` (width, height in pixels)."""

    angle: float  # the page's skew: its lines rise by this much to the right, degrees
    size: tuple[int, int]  # the page as scanned
    turned: tuple[int, int]  # the page as straightened (what the engine read)

    def matrix(self) -> tuple[float, float, float, float, float, float]:
        """(a, b, c, d, e, f): a point (x, y) of the straightened page lies at
        (a·x + b·y + c, d·x + e·y + f) on the page as scanned (y down)."""
        t = math.radians(self.angle)
        a, b, d, e = math.cos(t), math.sin(t), -math.sin(t), math.cos(t)
        cx, cy = self.size[0] / 2, self.size[1] / 2
        ox, oy = self.turned[0] / 2, self.turned[1] / 2
        return a, b, cx - a * ox - b * oy, d, e, cy - d * ox - e * oy

    def point(self, x: float, y: float) -> tuple[float, float]:
        """A point of the straightened page on the page as scanned."""
        a, b, c, d, e, f = self.matrix()
        return a * x + b * y + c, d * x + e * y + f

    def to_original(self, box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        """A box found on the straightened page, on the page as scanned: the same size,
        around the same point of the picture (there it lies tilted by `angle`)."""
        left, top, right, bottom = box
        x, y = self.point((left + right) / 2, (top + bottom) / 2)
        w, h = right - left, bottom - top
        return (round(x - w / 2), round(y - h / 2), round(x - w / 2) + w,
                round(y - h / 2) + h)


def turned_size(width: int, height: int, angle: float) -> tuple[int, int]:
    """The canvas that holds a page of this size turned by `angle` degrees."""
    t = math.radians(abs(angle))
    c, s = math.cos(t), math.sin(t)
    return math.ceil(width * c + height * s - 1e-6), math.ceil(width * s + height * c - 1e-6)


def measure(page: RenderedPage) -> float | None:
    """The page's skew in degrees (its lines rise to the right: positive), to STEP; None
    when it has no lines of text to tell by (blank, a photograph)."""
    return text_angle(reduced(page))


def reduced(page: RenderedPage) -> Image.Image:
    """The page in grey at about ESTIMATE_DPI (a page of unknown resolution is taken
    for 300 dpi)."""
    factor = max(1, round((page.dpi or 300) / ESTIMATE_DPI))
    return modes.reduced_grey(page.mode, page.width, page.height, page.data, factor)


def text_angle(grey: Image.Image) -> float | None:
    """The angle of the text lines of a grey page image (see the module's doc)."""
    w, h = grey.size
    if w < STRIPS or h < 16:
        return None
    grey = grey if grey.mode == "L" else grey.convert("L")
    ink = ImageChops.subtract(grey.point(_INK), _ground(grey)).convert("F")
    dark = _mean(ink.resize((1, 1), Image.Resampling.BOX)) / 255
    if not MIN_INK <= dark <= MAX_INK:
        return None
    strips = ink.resize((STRIPS, h), Image.Resampling.BOX)
    strip_w = w / STRIPS
    cache: dict[tuple[float, bool], float] = {}

    def score(angle: float, sharp: bool) -> float:
        key = (round(angle, 1), sharp)
        if key not in cache:  # the coarse steps in whole rows, the fine ones between
            rows = _profile(strips, math.tan(math.radians(key[0])) * strip_w,
                            Image.Resampling.BILINEAR if sharp else Image.Resampling.NEAREST)
            cache[key] = _sharpness(rows) if sharp else sum(map(operator.mul, rows, rows))
        return cache[key]

    # first where the ink gathers into the fewest rows (a few short lines fool the
    # sharpness at an angle where one line's end meets the next one's start), then
    # where the rows' edges are sharpest, within a coarse step of it
    coarse = [k * _COARSE for k in range(-round(MAX_ANGLE / _COARSE),
                                         round(MAX_ANGLE / _COARSE) + 1)]
    first = max(coarse, key=lambda a: (score(a, False), -abs(a)))
    fine = [round(first + k * STEP, 1) for k in range(-round(_COARSE / STEP),
                                                      round(_COARSE / STEP) + 1)]
    best = max((a for a in fine if abs(a) <= MAX_ANGLE),
               key=lambda a: (score(a, True), -abs(a)))
    while best in (fine[0], fine[-1]) and abs(best) < MAX_ANGLE:  # on the edge: on
        ahead = round(best + (STEP if best == fine[-1] else -STEP), 1)
        if score(ahead, True) <= score(best, True):
            break
        fine = [*fine, ahead] if ahead > best else [ahead, *fine]
        best = ahead
    # pictures and blank pages are as sharp at every angle (the rows sampled whole)
    rows = _profile(strips, math.tan(math.radians(best)) * strip_w,
                    Image.Resampling.NEAREST)
    average = sum(_sharpness(_profile(strips, math.tan(math.radians(a)) * strip_w,
                                      Image.Resampling.NEAREST))
                  for a in coarse[::4]) / len(coarse[::4])
    if average <= 0 or _sharpness(rows) < MIN_CONTRAST * average:
        return None
    return round(best, 1) + 0.0  # never -0.0


def _ground(grey: Image.Image) -> Image.Image:
    """Where the page is dark over wide areas (a dark scanner lid around the paper, a
    photograph): 255 there. Text, reduced eightfold, turns light grey; those stay dark."""
    w, h = grey.size
    if w < 16 or h < 16:
        return Image.new("L", grey.size, 0)
    coarse = grey.reduce(8).point(_GROUND)
    # grown by a cell each way, so that the ground's own edge goes too
    return coarse.filter(ImageFilter.MaxFilter(3)).resize(grey.size,
                                                          Image.Resampling.NEAREST)


def _profile(strips: Image.Image, shift: float, resample: Image.Resampling) -> array:
    """The rows' sums when each strip is slid by `shift` rows per strip (lines that rise
    to the right lie lower in the strips on the left)."""
    n, h = strips.size
    middle = n / 2
    # output (x, y) samples (x, y + shift·(middle - x)): a line rising to the right
    # stands higher on the right, so the strips right of the middle are moved down
    sheared = strips.transform((n, h), Image.Transform.AFFINE,
                               (1, 0, 0, -shift, 1, shift * middle), resample)
    return array("f", sheared.resize((1, h), Image.Resampling.BOX).tobytes())


def _sharpness(rows: array) -> float:
    """How sharply the rows' sums change from one row to the next."""
    steps = list(map(operator.sub, rows[1:], rows[:-1]))
    return sum(map(operator.mul, steps, steps))


def _mean(one: Image.Image) -> float:
    return array("f", one.convert("F").tobytes())[0]


def straighten(page: RenderedPage, angle: float, max_pixels: int,
               content: tuple[int, int, int, int] | None = None,
               ) -> tuple[RenderedPage, Skew]:
    """The page turned to undo its skew, in its own mode, on a canvas grown to hold all
    of it (no larger than `max_pixels`: then it keeps its size and loses its corners);
    the Skew that maps the straightened page back. With `content` (the part of the page
    that is not blank paper), only that part is turned, on a canvas grown only as far as
    it needs: the rest stays white."""
    size = (page.width, page.height)
    turned = turned_size(page.width, page.height, angle)
    landed: list[tuple[float, float]] = []  # the content's corners, from the middle
    if content is not None:
        t = math.radians(angle)
        for x in (content[0], content[2]):
            for y in (content[1], content[3]):
                dx, dy = x - size[0] / 2, y - size[1] / 2
                landed.append((dx * math.cos(t) - dy * math.sin(t),
                               dx * math.sin(t) + dy * math.cos(t)))
        # a canvas of the page's own size where the content fits on it (margins hold a
        # few degrees of turn): no more pixels for the engine, nor for the memory budget
        turned = (min(turned[0], max(size[0], math.ceil(2 * max(abs(x) for x, _ in landed)))),
                  min(turned[1], max(size[1], math.ceil(2 * max(abs(y) for _, y in landed)))))
    if turned[0] * turned[1] > max_pixels:
        turned = size
    skew = Skew(angle, size, turned)
    image = page.to_image()
    white: int | tuple[int, int, int] = (255, 255, 255) if image.mode == "RGB" else 255
    resample = Image.Resampling.NEAREST if image.mode == "1" else Image.Resampling.BILINEAR
    a, b, c, d, e, f = skew.matrix()
    part = (0, 0, *turned)
    if landed:  # only where the content lands on the canvas
        xs = [turned[0] / 2 + x for x, _ in landed]
        ys = [turned[1] / 2 + y for _, y in landed]
        part = (max(0, math.floor(min(xs))), max(0, math.floor(min(ys))),
                min(turned[0], math.ceil(max(xs))), min(turned[1], math.ceil(max(ys))))
    ox, oy = part[0], part[1]
    piece = image.transform((part[2] - ox, part[3] - oy), Image.Transform.AFFINE,
                            (a, b, a * ox + b * oy + c, d, e, d * ox + e * oy + f),
                            resample, fillcolor=white)
    del image
    if part == (0, 0, *turned):
        out = piece
    else:
        out = Image.new(piece.mode, turned, white)
        out.paste(piece, (ox, oy))
    data = out.tobytes("raw", "1;I") if out.mode == "1" else out.tobytes()
    return RenderedPage(page.index, out.width, out.height, data, page.dpi,
                        mode=page.mode), skew


def deskewed(page: RenderedPage, max_pixels: int) -> tuple[RenderedPage, Skew | None]:
    """The page straightened if it lies askew by MIN_ANGLE or more; and how (a Skew of
    angle 0 for a page that lies straight; None when there is nothing to tell by)."""
    grey = reduced(page)
    angle = text_angle(grey)
    if angle is None:
        return page, None
    if abs(angle) < MIN_ANGLE:
        return page, Skew(0.0, (page.width, page.height), (page.width, page.height))
    # what is not blank paper, with a margin: only that needs turning
    found = grey.point(_NOT_PAPER).getbbox()
    content = None
    if found is not None:
        scale = page.width / grey.width
        pad = 4
        content = (max(0, math.floor((found[0] - pad) * scale)),
                   max(0, math.floor((found[1] - pad) * scale)),
                   min(page.width, math.ceil((found[2] + pad) * scale)),
                   min(page.height, math.ceil((found[3] + pad) * scale)))
    return straighten(page, angle, max_pixels, content)


def render_straight_page(path: str, info: DocInfo, index: int, dpi: float | Resolution,
                         max_pixels: int, straighten_pages: bool,
                         ) -> tuple[RenderedPage, Skew | None]:
    """A render worker's page, straightened when `straighten_pages` (render.deskew):
    `pages.render_page`'s page, and how it was straightened (None: not measured). A
    failure to straighten costs the straightening, never the page."""
    page = pages.render_page(path, info, index, dpi, max_pixels)
    if not straighten_pages:
        return page, None
    cap = dpi.max_pixels(page.mode, max_pixels) if isinstance(dpi, Resolution) \
        else max_pixels
    shared = page.shared
    try:
        if shared is not None:  # in the worker's tmpfs file: measured from there
            page = replace(page, data=pixels.pixels(page), shared=None)
        out, skew = deskewed(page, cap)
    except (MemoryError, ValueError, OSError):
        return (page if shared is None else replace(page, data=b"", shared=shared)), None
    if shared is not None:
        if out is page:  # not turned: the pixels leave as they came
            return replace(page, data=b"", shared=shared), skew
        with contextlib.suppress(OSError):
            os.unlink(shared)
    return out, skew
