"""What a PDF that will not open or render means, said in one sentence.

PDFium and poppler report failures as raw text (poppler as several "Syntax Error: …"
lines). A PDF whose trailer is there and that still cannot be read is damaged, not
"truncated" (ocrd/render/pages.py says truncated only when the bytes stop before %%EOF).

A page that renders white is blank only if it is: PDFium draws nothing for a content
stream it cannot decode (poppler says "Bad FCHECK in flate stream"), or for content that
is missing (a file cut off before it), and says nothing. `unreadable_content` looks
for that evidence (qpdf decodes the page's streams) when a page comes out white.
"""

from __future__ import annotations

import io
import re
from typing import Any

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


class UnreadableContent(errors.Damaged):
    """A page that renders white because what it draws is missing or cannot be decoded:
    damaged, not blank (and another renderer would draw the same nothing)."""


class CutOffContent(errors.Truncated):
    """A page of a PDF cut off before its end (read from the copy qpdf repaired) whose
    content is not in the file: truncated, not blank."""


# Filters qpdf decodes itself: a stream with only these can be checked by decoding it.
_DECODABLE = {"/FlateDecode", "/LZWDecode", "/ASCII85Decode", "/ASCIIHexDecode",
              "/RunLengthDecode", "/Fl", "/LZW", "/A85", "/AHx", "/RL"}
# Form XObjects looked into, nested at most this deep (a form may draw itself).
_FORM_DEPTH = 4


def unreadable_content(source: Any, index: int, repaired: bool = False) -> str | None:
    """Why page `index` (0-based) of the PDF `source` (a file object or bytes) may look
    blank without being blank: a stream it draws (its content streams, the forms and
    images they use) cannot be decoded, or — in a PDF qpdf had to repair (`repaired`) —
    its content is missing. None: nothing found."""
    import pikepdf

    missing = "its content is missing (the file was cut off or damaged before it)"
    try:
        with pikepdf.open(io.BytesIO(source) if isinstance(source, bytes) else source) as pdf:
            if not 0 <= index < len(pdf.pages):
                return None
            page = pdf.pages[index].obj
            contents = page.get("/Contents")
            if contents is None:  # qpdf drops a key whose object is not in the file
                return missing if repaired else None
            streams = list(contents) if isinstance(contents, pikepdf.Array) else [contents]
            for stream in streams:
                if not isinstance(stream, pikepdf.Stream):
                    return missing
                why = _undecodable(stream)
                if why:
                    return f"its content stream cannot be decoded ({why})"
            resources = inherited(page, "/Resources")
            return _resources_problem(resources, 0) or \
                _missing_resource(pdf.pages[index], resources)
    except Exception:  # noqa: BLE001 - the check is evidence only: no answer, no claim
        return None


def inherited(page: Any, key: str) -> Any:
    """A page's `key` (pikepdf), its own or the nearest of its /Parent page tree nodes'
    (PDF 1.7, 7.7.3.4: /Resources, /MediaBox, /CropBox, /Rotate); None when none has it
    (or the tree is 64 deep: a loop)."""
    node, hops = page, 0
    while node is not None and hops < 64:
        if key in node:
            return node[key]
        node, hops = node.get("/Parent"), hops + 1
    return None


def _missing_resource(page: Any, resources: Any) -> str | None:
    """A font or an image/form the page's content uses that its resources lack (what
    is not in a file cut off, or damaged, is dropped when qpdf reads it): PDFium then
    draws nothing of it. Content that cannot be parsed is that page's damage too."""
    import pikepdf

    try:
        instructions = pikepdf.parse_content_stream(page)
    except Exception as e:  # noqa: BLE001 - qpdf's and the decoder's failures alike
        return f"its content cannot be read ({str(e).strip()[:80] or type(e).__name__})"
    res = resources if isinstance(resources, pikepdf.Dictionary) else pikepdf.Dictionary()
    fonts, xobjects = res.get("/Font"), res.get("/XObject")
    for operands, op in instructions:
        name = str(op)
        if name == "Tf" and operands and not (
                isinstance(fonts, pikepdf.Dictionary) and operands[0] in fonts):
            return "its content uses a font that is not in the file"
        if name == "Do" and operands and not (
                isinstance(xobjects, pikepdf.Dictionary) and operands[0] in xobjects):
            return "its content draws an image or form that is not in the file"
    return None


def _resources_problem(resources: Any, depth: int) -> str | None:
    import pikepdf

    if not isinstance(resources, pikepdf.Dictionary) or depth > _FORM_DEPTH:
        return None
    xobjects = resources.get("/XObject")
    if not isinstance(xobjects, pikepdf.Dictionary):
        return None
    for name, xobject in xobjects.items():
        if not isinstance(xobject, pikepdf.Stream):
            continue
        why = _undecodable(xobject)
        if why:
            kind = "image" if xobject.get("/Subtype") == "/Image" else "form"
            return f"its {kind} {name} cannot be decoded ({why})"
        if xobject.get("/Subtype") == "/Form":
            why = _resources_problem(xobject.get("/Resources"), depth + 1)
            if why:
                return why
    return None


def _undecodable(stream: Any) -> str | None:
    """Why qpdf cannot decode the stream; None when it can, or cannot tell (a filter it
    does not decode, such as DCT or JBIG2)."""
    import pikepdf

    filters = stream.get("/Filter")
    names = [str(f) for f in filters] if isinstance(filters, pikepdf.Array) else \
        [str(filters)] if filters is not None else []
    if not all(n in _DECODABLE for n in names):
        return None
    try:
        stream.read_bytes()
    except pikepdf.PdfError as e:
        text = str(e)
        return text.rsplit(": ", 1)[-1][:120] if ": " in text else text[:120]
    return None


# A page of a repaired PDF with less ink than this share of its pixels is looked into
# too: what is missing from a file cut off may leave a rule or a logo drawn.
NEARLY_WHITE = 0.01


def looks_white(mode: str, width: int, height: int, data: Any, stride: int = 0,
                repaired: bool = False) -> bool:
    """Whether a rendered page has no mark at all (every pixel white); of a `repaired`
    PDF, whether it has next to none (NEARLY_WHITE)."""
    from PIL import Image

    if mode == "1":  # packed, 1 = black
        whole = bytes(data)
        if not repaired:
            return whole.count(0) == len(whole)
        image = Image.frombytes("1", (width, height), whole, "raw", "1;I")
    else:
        raw = "RGB" if mode == "RGB" else "L"
        image = Image.frombuffer(raw, (width, height), data, "raw", raw, stride, 1)
    if not repaired:
        extrema = image.getextrema()
        lows = [lo for lo, _hi in extrema] if mode == "RGB" else [extrema[0]]
        return min(lows) >= 255
    grey = image if image.mode == "L" else image.convert("L")
    histogram = grey.histogram()
    return sum(histogram[:128]) < NEARLY_WHITE * max(1, width * height)
