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

    def for_scan(self, native: float | None) -> float:
        if native is None:
            return self.dpi
        return min(max(native, self.scan_min_dpi), self.scan_max_dpi)


def choose(render: Any, engine: Any) -> Resolution:
    """The resolution from the config's `render` section (None: the engine's choice)."""
    lo, hi = engine.scan_dpi
    lo = render.scan_min_dpi or lo
    hi = render.scan_max_dpi or hi
    return Resolution(render.dpi or engine.render_dpi, min(lo, hi), max(lo, hi))


def scan_dpi(page: Any) -> float | None:
    """The resolution of the image that covers most of a PDFium page, if it covers at
    least SCAN_COVER of it: None for a page that is not a scan."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    w, h = page.get_size()
    area = w * h
    if area <= 0:
        return None
    best: tuple[float, float] | None = None  # (covered area, dpi)
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
                best = (covered, (px_w * px_h / shown) ** 0.5 * 72)
    except pdfium.PdfiumError:
        return None
    if best is None or best[0] < SCAN_COVER * area:
        return None
    return best[1]
