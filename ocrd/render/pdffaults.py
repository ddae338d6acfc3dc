"""What a PDF that will not open or render means, said in one sentence.

PDFium and poppler report failures as raw text (poppler as several "Syntax Error: …"
lines). A PDF whose trailer is there and that still cannot be read is damaged, not
"truncated" (ocrd/render/pages.py says truncated only when the bytes stop before %%EOF).
"""

from __future__ import annotations

import re

from ocrd import errors

# A rendered page smaller than this on either side is no page: poppler renders pages of
# a PDF it cannot read as 1×1 pixels, which would otherwise pass as a blank document.
MIN_PAGE_PIXELS = 16

_NOISE = re.compile(r"^(syntax error|syntax warning|internal error|i/o error|error)"
                    r"( \(\d+\))?:\s*", re.IGNORECASE)
_GENERIC = ("unable to get page count", "failed to load document", "try to reconstruct")


def pdf_error(text: str) -> errors.OcrdError:
    """The failure of a complete PDF that PDFium or poppler could not read."""
    low = text.lower()
    if "password" in low:
        return errors.Encrypted(
            "the PDF is encrypted with a password; remove it first, e.g. "
            "`qpdf --decrypt --password=PASSWORD in.pdf out.pdf`")
    detail = first_cause(text)
    return errors.Damaged("the PDF is damaged and cannot be read" +
                          (f" ({detail})" if detail else ""))


def first_cause(text: str) -> str:
    """The first specific line of a renderer's complaint, without its prefix."""
    lines = [_NOISE.sub("", line).strip().rstrip(".") for line in text.splitlines()]
    specific = [line for line in lines
                if line and not any(g in line.lower() for g in _GENERIC)]
    pick = specific[0] if specific else (lines[0] if lines else "")
    pick = re.sub(r"\s*\(PDFium: ([^)]*)\)", r": \1", pick)
    return pick[:1].lower() + pick[1:160]


def check_page_size(width: int, height: int, index: int, renderer: str,
                    page_pt: tuple[float, float] | None = None) -> None:
    """Raise for a rendered page too small to be read: PageTooSmall when the page itself
    is that small (`page_pt`, its size as the renderer read it), else Damaged (poppler
    renders pages of a PDF it cannot read as 1×1 pixels)."""
    if min(width, height) >= MIN_PAGE_PIXELS:
        return
    if page_pt is not None:
        w, h = page_pt
        raise errors.PageTooSmall(f"page {index + 1} is {w:.3g}×{h:.3g} pt, too small to "
                                  "hold text")
    raise errors.Damaged(
        f"page {index + 1} came out as {width}×{height} pixels: {renderer} cannot "
        "read it (it is damaged)")
