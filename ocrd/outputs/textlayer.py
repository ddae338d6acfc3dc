"""A page's invisible text layer, built from the engine's geometry as soon as the page is
done: tesseract's word boxes, DeepSeek-OCR-2's grounding boxes (each block's text line
by line inside its box), or — without geometry — the page's text in one box over the page.

Each layer is a PDF content stream, zlib-compressed and kept until the document is
written (ocrd/outputs/textpdf.py): a few KB a page, never the words as Python objects. Its
coordinates are the *displayed* page normalised to 0..1 (y up); the writer puts the one
`cm` in front that maps them onto the page, whatever its size, crop box or rotation.

Text is shown in render mode 3 (invisible) with a glyph-less font: every character is
one CID of a document-wide table whose ToUnicode map gives back exactly the Unicode the
engine wrote (accents, ligatures, CJK, characters beyond the BMP), and every glyph is
stretched (Tz) so that a word spans its box. Text goes into the stream as hex, so model
output can never become PDF syntax.
"""

from __future__ import annotations

import base64
import re
import unicodedata
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ocrd.outputs import markdown
from ocrd.outputs.page import PageOutput, Word, unturn
from ocrd.render.deskew import Skew

# tesseract's glyph-less font (tessdata/pdf.ttf, Apache-2.0 like ocrd): one empty glyph,
# 500 units wide on a 1000-unit em, ascent 1000, descent 0.
GLYPHLESS_TTF = base64.b64decode(
    "AAEAAAAKAIAAAwAgT1MvMlbeyJQAAAEoAAAAYGNtYXAACgA0AAABkAAAAB5nbHlmFSJBJAAAAbgAAAAYaGVhZAt4"
    "8WUAAACsAAAANmhoZWEMAgQCAAAA5AAAACRobXR4BAAAAAAAAYgAAAAIbG9jYQAMAAAAAAGwAAAABm1heHAABAAF"
    "AAABCAAAACBuYW1l8usW2gAAAdAAAABLcG9zdAABAAEAAAIcAAAAIAABAAAAAQAAsJRxEF8PPPUEBwgAAAAAAM+a"
    "/G4AAAAA1MOn8gAAAAAEAAgAAAAAEAACAAAAAAAAAAEAAAgA//8AAAQAAAAAAAQAAAEAAAAAAAAAAAAAAAAAAAAC"
    "AAEAAAACAAQAAQAAAAAAAQAAAAAAAAAAAAAAAAAAAAAAAwAAAZAABQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAUA"
    "AQABAAAAAAAAAAAAAAAAAAAAAAAAAAAAR09PRwBAAAAAAAAB//8AAAABAAGAAAAAAAAAAAAAAAAAAAABAAAAAAAA"
    "BAAAAAAAAAIAAQAAAAAAFAADAAAAAAAUAAYACgAAAAAAAAAAAAAAAAAMAAAAAQAAAAAEAAgAAAMAADEhESEEAPwA"
    "CAAAAAADACoAAAADAAAABQAWAAAAAQAAAAAABQALABYAAwABBAkABQAWAAAAVgBlAHIAcwBpAG8AbgAgADEALgAw"
    "VmVyc2lvbiAxLjAAAAEAAAAAAAAAAAAAAAAAAQAAAAAAAAAAAAAAAAAAAAA=")
GLYPH_WIDTH = 0.5  # of the font size: the font's /DW 500
FONT_NAME = "/OcrdText"  # the resource name used inside every layer stream
MAX_CID = 0xFFFF
_GRID = 999  # DeepSeek-OCR-2's boxes are normalised to 0..999
# a page's text without geometry: lines at most this tall (of the page height)
_FALLBACK_LINE = 1 / 50
_FALLBACK_BOX = (0.02, 0.02, 0.98, 0.98)
_TABLE_BREAK = re.compile(r"</(?:tr|thead|tbody|tfoot|table)\s*>|<br\s*/?>", re.IGNORECASE)
_TAG = re.compile(r"<[^<>]{0,200}>")


class FontMap:
    """The document's characters → CIDs (1, 2, … in order of first use; 0 is .notdef)."""

    def __init__(self) -> None:
        self.cids: dict[str, int] = {}
        self.shown = 0  # characters laid so far, spaces excluded

    def encode(self, text: str) -> str:
        """The text as a hex string of 2-byte CIDs (without the angle brackets)."""
        out = []
        self.shown += sum(1 for ch in text if not ch.isspace())
        for ch in text:
            cid = self.cids.get(ch)
            if cid is None:
                if len(self.cids) >= MAX_CID - 1:  # 65,534 distinct characters: enough
                    cid = self.cids.setdefault("\ufffd", len(self.cids) + 1)
                else:
                    cid = self.cids[ch] = len(self.cids) + 1
            out.append(f"{cid:04X}")
        return "".join(out)

    def to_unicode(self) -> bytes:
        """The ToUnicode CMap: each CID back to its character (UTF-16BE, pairs included)."""
        lines = ["/CIDInit /ProcSet findresource begin", "12 dict begin", "begincmap",
                 "/CIDSystemInfo << /Registry (Adobe) /Ordering (UCS) /Supplement 0 >> def",
                 "/CMapName /Adobe-Identity-UCS def", "/CMapType 2 def",
                 "1 begincodespacerange", "<0000> <FFFF>", "endcodespacerange"]
        items = sorted((cid, ch) for ch, cid in self.cids.items())
        for start in range(0, len(items), 100):  # at most 100 entries a section
            chunk = items[start:start + 100]
            lines.append(f"{len(chunk)} beginbfchar")
            lines.extend(f"<{cid:04X}> <{ch.encode('utf-16-be').hex().upper()}>"
                         for cid, ch in chunk)
            lines.append("endbfchar")
        lines += ["endcmap", "CMapName currentdict /CMap defineresource pop", "end", "end"]
        return ("\n".join(lines) + "\n").encode("ascii")


@dataclass(frozen=True)
class PageLayer:
    """One page's text layer: how it was placed and its compressed content stream."""

    placement: str  # "words", "blocks", "page" (no geometry) or "none" (no text)
    stream: bytes  # zlib; coordinates: the displayed page as 0..1, y up
    chars: int  # characters laid (spaces excluded)


def _n(v: float) -> str:
    return f"{v:.5f}".rstrip("0").rstrip(".") or "0"


def _rtl(text: str) -> bool:
    return any(unicodedata.bidirectional(ch) in ("R", "AL") for ch in text)


def _show(fonts: FontMap, text: str, x0: float, y0: float, x1: float, y1: float) -> str:
    """Operators that lay `text` over the box (0..1, y up): baseline on its bottom edge,
    font size its height, glyphs stretched to its width. Right-to-left text runs from the
    box's right edge leftwards (as tesseract's PDF renderer lays it), so that the
    characters keep their logical order."""
    h = y1 - y0
    n = len(text)
    if h <= 0 or x1 <= x0 or n == 0:
        return ""
    tz = 100 * (x1 - x0) / (GLYPH_WIDTH * h * n)
    matrix = f"-1 0 0 1 {_n(x1)} {_n(y0)}" if _rtl(text) else f"1 0 0 1 {_n(x0)} {_n(y0)}"
    return f"{FONT_NAME} {_n(h)} Tf {_n(tz)} Tz {matrix} Tm <{fonts.encode(text)}> Tj\n"


def _clean(text: str) -> str:
    # control characters carry nothing a reader searches for
    return "".join(ch for ch in text if unicodedata.category(ch) not in ("Cc", "Cf")
                   or ch in "\u200c\u200d").strip()


def words_layer(fonts: FontMap, words: Iterable[Word], width: int, height: int,
                skew: Skew | None = None) -> str:
    """Each word over its box (pixels of the page image the engine saw; of a page that
    was straightened first, `skew`: the box goes back around the word's place on the
    page as scanned, `width` × `height`). A word of a skewed page is laid level, not
    tilted as it stands: poppler (pdftotext, Evince, the search tools built on it) cuts
    tilted text into pieces of words, as it does tesseract's own PDF of a skewed page;
    level, every reader finds each word whole."""
    ops = []
    for word in words:
        text = _clean(word.text)
        if not text:
            continue
        left, top, right, bottom = skew.to_original(word.box) if skew is not None \
            else word.box
        ops.append(_show(fonts, text, left / width, 1 - bottom / height,
                         right / width, 1 - top / height))
    return "".join(ops)


def lines_layer(fonts: FontMap, lines: Sequence[str], box: tuple[float, float, float, float],
                max_line: float | None = None, aspect: float | None = None) -> str:
    """Lines of text stacked top to bottom inside box (0..1, y up); the longest spans the
    box's width, the others in proportion to their length. With `max_line` (a page's
    text without geometry) lines are at most that tall and glyphs keep their natural
    width on a page of that `aspect` (width ÷ height), within the box: stretched across
    the page, the spaces would read as column gaps."""
    lines = [text for line in lines if (text := _clean(line))]
    if not lines:
        return ""
    x0, y0, x1, y1 = box
    step = (y1 - y0) / len(lines)
    if max_line is not None:
        step = min(step, max_line)
    longest = max(len(line) for line in lines)
    ops = []
    for k, line in enumerate(lines):
        top = y1 - k * step
        right = x0 + (x1 - x0) * len(line) / longest
        if aspect:
            right = min(x1, x0 + len(line) * GLYPH_WIDTH * step / aspect)
        ops.append(_show(fonts, line, x0, top - step, right, top))
    return "".join(ops)


def block_text(content: str) -> list[str]:
    """A grounding block's content as plain lines: table cells apart, tags removed."""
    content = _TABLE_BREAK.sub("\n", content)
    content = _TAG.sub(" ", content)
    return [re.sub(r"\s+", " ", line).strip() for line in content.splitlines()]


def _grid_box(boxes: list[tuple[float, float, float, float]], skew: Skew | None = None,
              ) -> tuple[float, ...] | None:
    """The union of a block's boxes on the 0..999 grid, as 0..1 with y up (of the page
    as scanned, for a page that was straightened first: each box's corners go back
    where they lie there)."""
    def clamp(v: float) -> float:
        return min(max(v, 0.0), 1.0)
    if skew is not None and skew.angle:
        (tw, th), (w, h) = skew.turned, skew.size
        corners = [skew.point(x / _GRID * tw, y / _GRID * th) for b in boxes
                   for x in (b[0], b[2]) for y in (b[1], b[3])]
        xs = [clamp(x / w) for x, _ in corners]
        ys = [clamp(y / h) for _, y in corners]
    else:
        xs = [clamp(v / _GRID) for b in boxes for v in (b[0], b[2])]
        ys = [clamp(v / _GRID) for b in boxes for v in (b[1], b[3])]
    if max(xs) - min(xs) <= 0 or max(ys) - min(ys) <= 0:
        return None
    return (min(xs), 1 - max(ys), max(xs), 1 - min(ys))


def grid_boxes(boxes: list, rotation: int | None) -> list:
    """A grounding block's boxes (0..999 of the image the model read) on the page as
    given, when the page was turned clockwise by `rotation` before it was read."""
    if not rotation:
        return boxes
    return [unturn(tuple(round(v) for v in b), rotation, (_GRID, _GRID)) for b in boxes]


def blocks_layer(fonts: FontMap, raw: str, rotation: int | None = None,
                 skew: Skew | None = None) -> tuple[str, list[str]]:
    """Every text block of DeepSeek-OCR-2's tag stream inside its box (on the page as
    given: `rotation` turns the boxes of a page read turned back, `skew` puts those of a
    straightened page onto the scan); figures are left out.
    Returns the operators and the lines of text that came without a box."""
    ops, loose = [], []
    for label, boxes, content in markdown.text_blocks(raw):
        if label == "image":
            continue
        lines = block_text(content)
        box = _grid_box(grid_boxes(boxes, rotation), skew) if boxes else None
        if box is None:
            loose.extend(lines)
        else:
            ops.append(lines_layer(fonts, lines, box))
    return "".join(ops), [line for line in loose if line]


def page_layer(fonts: FontMap, out: PageOutput, width: int, height: int,
               grounding: bool) -> PageLayer:
    """The page's layer from what the engine gave: its words, its grounding blocks, or
    else its text in one box over the page. `width` × `height`: the page as scanned
    (the engine's boxes may be on a straightened copy of it: `out.skew`)."""
    before = fonts.shown
    loose: list[str] = []
    if out.words is not None:
        placement, ops = "words", words_layer(fonts, out.words, width, height, out.skew)
    elif grounding:
        ops, loose = blocks_layer(fonts, out.text, out.rotation, out.skew)
        placement = "blocks" if ops else "page"
    else:
        placement, ops, loose = "page", "", out.text.splitlines()
    if loose:  # text without a box: over the page rather than nowhere
        ops += lines_layer(fonts, loose, _FALLBACK_BOX, _FALLBACK_LINE, width / height)
    if not ops:
        placement = "none"
    body = f"BT\n3 Tr\n{ops}ET\n" if ops else ""
    return PageLayer(placement, zlib.compress(body.encode("ascii"), 6), fonts.shown - before)
