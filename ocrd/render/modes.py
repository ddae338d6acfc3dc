"""Pages in their own mode: grey, or 1-bit for fax/JBIG2 scans, packed as PNM wants them.

tesseract binarises every page itself, so colour is mostly wasted on it: an RGB page is
three times the bytes of a grey one at every copy (render buffer, tmpfs, pipe) and 24
times a 1-bit one, and tesseract reads grey and 1-bit pages measurably faster than RGB,
with as many words on scans and born-digital pages (bench/colour.py).
So for an engine that reads grey (`Engine.page_mode`), PDFium renders grey, and a page
that is a 1-bit scan becomes packed 1-bit rows (PBM's layout, 1 = black). A colour photo
(an image without a scanner's resolution) stays in colour (render/pages.py): text in a
colour about as bright as its background vanishes in grey, and the engine reads it again
in colour where its grey reading is weak.
Rendering goes in bands, so a 35,000 × 35,000 px page never exists as 8-bit pixels.
"""

from __future__ import annotations

import math
from typing import Any

from PIL import Image, ImageChops

# A band of rows rendered at once (grey bytes); the page's own buffer is the only full
# copy.
BAND_BYTES = 16 * 2**20
_THRESHOLD = [255 if v >= 128 else 0 for v in range(256)]


def row_bytes(mode: str, width: int) -> int:
    if mode == "1":
        return (width + 7) // 8
    return width * (3 if mode == "RGB" else 1)


def packed_size(mode: str, width: int, height: int) -> int:
    return row_bytes(mode, width) * height


def pnm_header(mode: str, width: int, height: int) -> bytes:
    if mode == "1":
        return b"P4\n%d %d\n" % (width, height)
    return (b"P5" if mode == "L" else b"P6") + b"\n%d %d\n255\n" % (width, height)


def to_image(mode: str, width: int, height: int, data: bytes | bytearray) -> Image.Image:
    """A Pillow image of packed pixels (a grey page shares the bytes; Pillow keeps 1-bit
    pages at a byte a pixel, so make one only when needed)."""
    if mode == "L":
        return Image.frombuffer("L", (width, height), data, "raw", "L", 0, 1)
    if mode == "1":
        return Image.frombytes("1", (width, height), bytes(data), "raw", "1;I")
    return Image.frombytes("RGB", (width, height), bytes(data))


def reduced_grey(mode: str, width: int, height: int, data: bytes | bytearray,
                 factor: int) -> Image.Image:
    """The page as grey, reduced by an integer factor, a band at a time (a 1-bit page is
    never expanded whole)."""
    if mode != "1":
        img = to_image(mode, width, height, data)
        img = img if img.mode == "L" else img.convert("L")
        return img.reduce(factor) if factor > 1 else img
    rows = max(factor, (BAND_BYTES // max(1, width)) // factor * factor)
    stride = row_bytes("1", width)
    out = Image.new("L", (max(1, width // factor), max(1, height // factor)), 255)
    for y in range(0, height - factor + 1 if factor > 1 else height, rows):
        n = min(rows, height - y)
        if factor > 1:
            n -= n % factor
        band = Image.frombytes("1", (width, n), bytes(data[y * stride:(y + n) * stride]),
                               "raw", "1;I").convert("L")
        out.paste(band.reduce(factor) if factor > 1 else band, (0, y // factor))
    return out


def render_grey(page: Any, dpi: float, one_bit: bool) -> tuple[int, int, bytearray, str]:
    """Render a PDFium page in grey (or thresholded to packed 1-bit) at `dpi`, in bands:
    (width, height, pixels, mode)."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    w_pt, h_pt = page.get_size()
    width, height = math.ceil(w_pt * dpi / 72), math.ceil(h_pt * dpi / 72)
    mode = "1" if one_bit else "L"
    out = bytearray(packed_size(mode, width, height))
    band_rows = max(1, min(height, BAND_BYTES // max(1, width)))
    bitmap = pdfium.PdfBitmap.new_native(width, band_rows, pdfium_c.FPDFBitmap_Gray)
    stride = bitmap.stride
    flags = pdfium_c.FPDF_ANNOT | pdfium_c.FPDF_GRAYSCALE
    row = row_bytes(mode, width)
    try:
        for y in range(0, height, band_rows):
            n = min(band_rows, height - y)
            pdfium_c.FPDFBitmap_FillRect(bitmap, 0, 0, width, band_rows, 0xFFFFFFFF)
            pdfium_c.FPDF_RenderPageBitmap(bitmap, page, 0, -y, width, height, 0, flags)
            view = memoryview(bitmap.buffer).cast("B")[:stride * n]
            band = Image.frombuffer("L", (width, n), view, "raw", "L", stride, 1)
            if one_bit:
                out[y * row:(y + n) * row] = band.point(_THRESHOLD, "1").tobytes("raw", "1;I")
            else:
                out[y * row:(y + n) * row] = band.tobytes()
            del band, view
    finally:
        bitmap.close()
    return width, height, out, mode


_DARK = [255 if v < 128 else 0 for v in range(256)]
# how far from the paper's grey a pixel stands out as a mark: darker (ink), or lighter
# on a tinted paper (a form's white check boxes on its coloured ground)
_DARKER, _LIGHTER = 64, 40


def paper(image: Image.Image) -> int:
    """The page's paper: its most common grey."""
    counts = (image if image.mode == "L" else image.convert("L")).histogram()
    return max(range(256), key=lambda v: counts[v])


def marks_table(paper: int) -> list[int]:
    """A point table that makes the pixels standing out from paper of this grey 255,
    the others 0."""
    lighter = paper + _LIGHTER if paper + _LIGHTER < 255 else 256
    return [255 if v < paper - _DARKER or v >= lighter else 0 for v in range(256)]


def dark_box(image: Image.Image, box: tuple[int, int, int, int],
             table: list[int] | None = None,
             ) -> tuple[tuple[int, int, int, int], int] | None:
    """Where the dark pixels inside `box` of the image lie (page coordinates) and how
    many there are; None without any. `table`: what counts as dark (marks_table:
    whatever stands out from the paper)."""
    clipped = _clipped(box, image.size)
    if clipped is None:
        return None
    crop = image.crop(clipped)
    crop = crop if crop.mode == "L" else crop.convert("L")
    return _found(crop.point(_DARK if table is None else table), clipped)


def mark_box(marks: Image.Image, box: tuple[int, int, int, int],
             ) -> tuple[tuple[int, int, int, int], int] | None:
    """dark_box on a page's marks already found (255 where a mark is: marks_table)."""
    clipped = _clipped(box, marks.size)
    if clipped is None:
        return None
    return _found(marks.crop(clipped), clipped)


def _clipped(box: tuple[int, int, int, int], size: tuple[int, int]
             ) -> tuple[int, int, int, int] | None:
    """The part of `box` on an image of `size`; None when none is."""
    left, top = max(0, box[0]), max(0, box[1])
    right, bottom = min(size[0], box[2]), min(size[1], box[3])
    return None if right <= left or bottom <= top else (left, top, right, bottom)


def _found(marks: Image.Image, at: tuple[int, int, int, int]
           ) -> tuple[tuple[int, int, int, int], int] | None:
    """Where the marks (255) of a crop taken `at` lie on the page, and how many."""
    found = marks.getbbox()
    if found is None:
        return None
    left, top = at[0], at[1]
    return ((left + found[0], top + found[1], left + found[2], top + found[3]),
            marks.histogram()[255])


def stroke_width(image: Image.Image, box: tuple[int, int, int, int]) -> float | None:
    """How thick the strokes of the dark pixels inside `box` are, in pixels: twice their
    count over the count of those at their edges (a stroke w wide and l long has w·l
    pixels, 2·l of them at its edges); None without any, or where most are dark."""
    left, top = max(0, box[0]), max(0, box[1])
    right, bottom = min(image.width, box[2]), min(image.height, box[3])
    if right <= left or bottom <= top:
        return None
    crop = image.crop((left, top, right, bottom))
    dark = (crop if crop.mode == "L" else crop.convert("L")).point(_DARK)
    count = dark.histogram()[255]
    if count > 0.5 * dark.width * dark.height:
        return None  # light text on a dark ground: its strokes are the light pixels
    inner = erode3(dark).histogram()[255]
    return 2 * count / (count - inner) if count > inner else None


def erode3(image: Image.Image) -> Image.Image:
    """An L image's 3 × 3 minimum, its edges repeated beyond it: what
    ImageFilter.MinFilter(3) gives, as two passes of three shifted copies (a fraction of
    the rank filter's time)."""
    w, h = image.size
    padded = Image.new("L", (w + 2, h + 2))
    padded.paste(image, (1, 1))
    padded.paste(image.crop((0, 0, w, 1)), (1, 0))
    padded.paste(image.crop((0, h - 1, w, h)), (1, h + 1))
    padded.paste(padded.crop((1, 0, 2, h + 2)), (0, 0))
    padded.paste(padded.crop((w, 0, w + 1, h + 2)), (w + 1, 0))
    darker = ImageChops.darker
    rows = darker(darker(padded.crop((0, 0, w, h + 2)), padded.crop((1, 0, w + 1, h + 2))),
                  padded.crop((2, 0, w + 2, h + 2)))
    return darker(darker(rows.crop((0, 0, w, h)), rows.crop((0, 1, w, h + 1))),
                  rows.crop((0, 2, w, h + 2)))


def band_image(mode: str, width: int, height: int, data: bytes | bytearray,
               top: int, bottom: int) -> Image.Image:
    """Rows top..bottom of a packed page as an image (only those rows unpacked)."""
    top, bottom = max(0, top), min(height, bottom)
    stride = row_bytes(mode, width)
    rows = bytes(data[top * stride:bottom * stride])
    raw = {"1": "1;I", "L": "L", "RGB": "RGB"}[mode]
    return Image.frombytes(mode, (width, max(0, bottom - top)), rows, "raw", raw)


def ruling_lines(image: Image.Image, dpi: float) -> list[tuple[int, int, int, int]]:
    """The page's ruling lines (a table's grid, underlines) as boxes: runs of dark
    pixels at least RULE_INCHES long and at most RULE_THICK_INCHES thick, across or
    down the page. Found on the page squeezed along the line's direction, where a rule
    stays dark and text turns grey."""
    grey = image if image.mode == "L" else image.convert("L")
    dpi = dpi or 300.0
    # at 200 dpi and more, halved first (a quarter of the pixels to look at): a rule one
    # pixel thin stays darker than _HALF_DARK there
    half = 2 if dpi >= 200 and min(grey.size) >= 64 else 1
    dark = grey.reduce(half).point(_HALF_DARK) if half > 1 else grey.point(_DARK)
    dpi /= half
    step = max(2, round(dpi / 30))  # pixels squeezed into one
    longest = max(2, round(RULE_INCHES * dpi / step))
    thick = max(1, round(RULE_THICK_INCHES * dpi))
    found = _runs(dark, step, longest, thick, down=False) + [
        (top, left, bottom, right)
        for left, top, right, bottom in _runs(dark, step, longest, thick, down=True)]
    return [(a * half, b * half, c * half, d * half) for a, b, c, d in found]


RULE_INCHES = 0.4  # a ruling line is at least this long
RULE_THICK_INCHES = 0.03  # ... and at most this thick
_SOLID = [255 if v >= 224 else 0 for v in range(256)]
_HALF_DARK = [255 if v < 192 else 0 for v in range(256)]
_WHOLE = [255 if v == 255 else 0 for v in range(256)]


def _runs(dark: Image.Image, step: int, longest: int, thick: int, down: bool,
          ) -> list[tuple[int, int, int, int]]:
    """Rules of a dark-pixel mask (255 dark) across it (`down`: down it, as boxes of
    the mask turned about its diagonal): rows whose squeezed pixels stay solid for
    `longest` in a row, joined with the rows next to them."""
    if down:  # squeezed down the page, then turned: its columns become rows
        w, h = dark.height, dark.width
        if w < step * longest:
            return []
        squeezed = dark.resize((h, w // step), Image.Resampling.BOX).point(_SOLID) \
            .transpose(Image.Transpose.TRANSPOSE)
    else:
        w, h = dark.size
        if w < step * longest:
            return []
        squeezed = dark.resize((w // step, h), Image.Resampling.BOX).point(_SOLID)
    # rows that may hold a rule: squeezed again by half a rule's length, solid
    # somewhere still (a run of `longest` holds such a stretch whole; text seldom does)
    width = w // step
    half = max(1, longest // 2)
    again = squeezed.resize((max(1, width // half), h), Image.Resampling.BOX)
    rows = again.point(_WHOLE).resize((1, h), Image.Resampling.BOX).tobytes()
    found: dict[int, list[tuple[int, int]]] = {}
    for y in range(h):
        if not rows[y]:
            continue
        row = squeezed.crop((0, y, width, y + 1)).tobytes()
        start = None
        for x, v in enumerate(row + b"\0"):
            if v and start is None:
                start = x
            elif not v and start is not None:
                if x - start >= longest:
                    found.setdefault(y, []).append((start, x))
                start = None
    rules: list[tuple[int, int, int, int]] = []
    open_: list[list[int]] = []  # [x0, x1, top, bottom] of rules still growing
    for y in sorted(found):
        for x0, x1 in found[y]:
            for r in open_:
                if r[3] >= y - 1 and x0 < r[1] and r[0] < x1:
                    r[0], r[1], r[3] = min(r[0], x0), max(r[1], x1), y
                    break
            else:
                open_.append([x0, x1, y, y])
    for x0, x1, top, bottom in open_:
        if bottom - top + 1 <= thick:
            rules.append((x0 * step, top, x1 * step, bottom + 1))
    return rules
