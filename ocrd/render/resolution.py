"""How finely a PDF page is rendered: the engine's resolution for born-digital pages, and
for scans (a page that is essentially one image) about the image's own resolution.

A fixed dpi fails both ways: tesseract wants ~300 dpi (at 144 it loses accents), the
DeepSeek engines resize every page to 1024/768 px anyway, and a small page holding a
2400 dpi scan becomes a few hundred pixels of grey at 144 dpi. So the engine says what
it wants (`Engine.render_dpi`, `Engine.scan_dpi`), the config may override it, and a
scanned page renders at its image's resolution clamped to the scan range (and, after
that, to `limits.max_pixels`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# For size estimates where the engine is not known yet (the intake's probe orders files
# by pixels; the order, not the number, matters).
ESTIMATE_DPI = 144
# A page is a scan when one image covers at least this share of it.
SCAN_COVER = 0.5
# Look at no more objects than this (a born-digital page may have tens of thousands of
# text objects; a scan has few).
MAX_OBJECTS = 2000


@dataclass(frozen=True)
class Resolution:
    """Render resolution: `dpi` for born-digital pages; a scan renders at its image's own
    resolution within [scan_min_dpi, scan_max_dpi]."""

    dpi: float
    scan_min_dpi: float
    scan_max_dpi: float
    # the engine reads grey: pages render grey, and 1-bit scans stay 1-bit (render/modes.py)
    grey: bool = False
    # the memory budget (limits.memory_bytes; 0 = none): no page may cost more, at what
    # its engine keeps per pixel in each mode (Engine.pixel_bytes)
    page_budget: int = 0
    pixel_bytes: tuple[tuple[str, float], ...] = ()

    def cost(self, mode: str, pixels: int) -> int:
        """Bytes a page of this mode and size costs until its engine is done with it."""
        per = dict(self.pixel_bytes)
        return int(pixels * per.get(mode, max(per.values(), default=3.0)))

    def a4_pixels(self) -> int:
        """An A4 page's pixels at `dpi` (a guess at a page's size before it is rendered)."""
        return int(8.27 * self.dpi) * int(11.69 * self.dpi)

    def max_pixels(self, mode: str, limit: int) -> int:
        """The most pixels a page of this mode may have: `limit`, or fewer so that the
        page fits the budget."""
        if not self.page_budget:
            return limit
        return max(1, min(limit, self.page_budget * 1_000_000 // max(1, self.cost(mode,
                                                                                   1_000_000))))

    @property
    def fixed(self) -> bool:
        """Every page at `dpi` (no need to look for scans)."""
        return self.scan_min_dpi == self.scan_max_dpi == self.dpi

    def for_scan(self, native: float | None) -> float:
        if native is None:
            return self.dpi
        return min(max(native, self.scan_min_dpi), self.scan_max_dpi)


def choose(render: Any, engine: Any) -> Resolution:
    """The resolution from the config's `render` section (None: the engine's choice);
    its page budget comes later, from the memory budget (Converter.set_memory)."""
    lo, hi = engine.scan_dpi
    lo = render.scan_min_dpi or lo
    hi = render.scan_max_dpi or hi
    return Resolution(render.dpi or engine.render_dpi, min(lo, hi), max(lo, hi),
                      grey=engine.page_mode != "RGB",
                      pixel_bytes=tuple(sorted(engine.pixel_bytes.items())))


def scan_dpi(page: Any) -> float | None:
    """The resolution of the image that covers most of a PDFium page, if it covers at
    least SCAN_COVER of it: None for a page that is not a scan."""
    found = scan(page)
    return found[0] if found else None


def scan(page: Any) -> tuple[float, int] | None:
    """(dpi, bits per pixel) of the image that covers most of a PDFium page, if it covers
    at least SCAN_COVER of it: None for a page that is not a scan."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    w, h = page.get_size()
    area = w * h
    if area <= 0:
        return None
    best: tuple[float, float, Any] | None = None  # (covered area, dpi, image)
    try:
        count = pdfium_c.FPDFPage_CountObjects(page)
        for i in range(min(count, MAX_OBJECTS)):
            raw = pdfium_c.FPDFPage_GetObject(page, i)
            if not raw or pdfium_c.FPDFPageObj_GetType(raw) != pdfium_c.FPDF_PAGEOBJ_IMAGE:
                continue
            obj = pdfium.PdfObject(raw, page=page, pdf=page.pdf)
            left, bottom, right, top = obj.get_bounds()
            covered = (min(right, w) - max(left, 0)) * (min(top, h) - max(bottom, 0))
            if covered <= 0 or (best is not None and covered <= best[0]):
                continue
            px_w, px_h = obj.get_px_size()
            shown = (right - left) * (top - bottom)  # in points², rotation-proof
            if shown > 0 and px_w > 1 and px_h > 1:
                best = (covered, (px_w * px_h / shown) ** 0.5 * 72, obj)
        if best is None or best[0] < SCAN_COVER * area:
            return None
        return best[1], _bits(best[2])
    except pdfium.PdfiumError:
        return None


def _bits(image: Any) -> int:
    """Bits per pixel of a PDF image (1 for fax and JBIG2 scans); 0 when not known."""
    if {"CCITTFaxDecode", "JBIG2Decode"} & set(image.get_filters()):
        return 1
    return int(image.get_metadata().bits_per_pixel)
