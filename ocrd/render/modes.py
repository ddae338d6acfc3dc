"""Pages in their own mode: grey, or 1-bit for fax/JBIG2 scans, packed as PNM wants them.

tesseract binarises every page itself, so colour is mostly wasted on it: an RGB page is
three times the bytes of a grey one at every copy (render buffer, tmpfs, pipe) and 24
times a 1-bit one, and tesseract reads grey and 1-bit pages measurably faster than RGB,
with as many words on scans and born-digital pages (bench/colour.py; bench/RESULTS.md).
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

from PIL import Image

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


def dark_box(image: Image.Image, box: tuple[int, int, int, int],
             ) -> tuple[tuple[int, int, int, int], int] | None:
    """Where the dark pixels inside `box` of the image lie (page coordinates) and how
    many there are; None without any."""
    left, top, right, bottom = box
    left, top = max(0, left), max(0, top)
    right, bottom = min(image.width, right), min(image.height, bottom)
    if right <= left or bottom <= top:
        return None
    crop = image.crop((left, top, right, bottom))
    crop = crop if crop.mode == "L" else crop.convert("L")
    dark = crop.point(_DARK)
    found = dark.getbbox()
    if found is None:
        return None
    return ((left + found[0], top + found[1], left + found[2], top + found[3]),
            dark.histogram()[255])


def band_image(mode: str, width: int, height: int, data: bytes | bytearray,
               top: int, bottom: int) -> Image.Image:
    """Rows top..bottom of a packed page as an image (only those rows unpacked)."""
    top, bottom = max(0, top), min(height, bottom)
    stride = row_bytes(mode, width)
    rows = bytes(data[top * stride:bottom * stride])
    raw = {"1": "1;I", "L": "L", "RGB": "RGB"}[mode]
    return Image.frombytes(mode, (width, max(0, bottom - top)), rows, "raw", raw)
