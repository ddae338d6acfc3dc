"""The page's measures, from its body text (`Metrics`: em, word space, line pitch), the
rules it is read by (in ems, so that a page at any resolution is read alike), ruling
lines, and list markers read as a block of their own put back beside their items.
"""

from __future__ import annotations

import functools
import re
import statistics
from dataclasses import dataclass

from ocrd.layout.reading import Box, Line, Token

CELL_GAP = 0.65  # a gap this wide inside a line may part table cells
GUTTER = 1.0  # a clear strip this wide between regions parts columns of text
HEADING = 1.25  # a line this much larger than body text is a heading
TITLE = 1.7  # ... and this much larger, the page's title (#) when all have one size
MAX_HEADING_WORDS = 12
BOLD = 1.3  # strokes this much thicker than the body's (for their size): bold type
READABLE = 60.0  # mean word confidence below which a line reads as dirt, not words
TICKED = 0.12  # share of a check box's inside marked: ticked (and at most 1 - this)
TABLE_ROW_GAP = 1.2  # rows of a table follow each other at most this far apart
PARAGRAPH_GAP = 0.45  # this much more space than between lines starts a paragraph
ALIGN = 0.6  # lines start "at the same place" within this

BULLETS = frozenset("•·●○◦▪■□‣⁃∙◆◇►▸➢➤✓✔-–—*+")
ROUND_BULLETS = BULLETS - frozenset("-–—*+")  # never anything but a bullet
# what tesseract makes of a small round bullet
BULLET_READINGS = frozenset({"e", "o", "°", "«", "»", "¢", "©", "®", "*", "+", "e»", "©)",
                              "eo", "oe", ".", "·"})
_JUNK = r"[.,:;'’`]?"  # a speck read before or after the marker
NUMBER = re.compile(r"[_'‘’`]?(\(?(\d{1,3})([.):]))" + _JUNK)
LETTER = re.compile(r"[_'‘’`]?(\(?([a-zA-Z])([.)]))" + _JUNK)
ROMAN = re.compile(r"[_'‘’`]?(\(?((?:x{0,3})(?:ix|iv|v?i{0,3}))([.)]))" + _JUNK,
                    re.IGNORECASE)
_TALL_MARKS = frozenset("()[]{}|/\\$@")  # reach above capitals and below the baseline
DESCENDERS = frozenset("gjpqy")
ALNUM = re.compile(r"\w")
_COMPOUND = re.compile(r"[^\W\d_]+-[^\W\d_]+")





def token_em(t: Token) -> float | None:
    """The font size a word's box suggests: its height over the share of an em that its
    letters span (from the highest top to the lowest descender); None for words with
    brackets or without letters, whose boxes say little."""
    return _em(t.text, t.box[3] - t.box[1])


@functools.lru_cache(maxsize=1 << 14)  # the layout asks for each word's many times
def _em(text: str, h: int) -> float | None:
    if not ALNUM.search(text) or any(c in _TALL_MARKS for c in text):
        return None
    if any(ord(c) > 0x2E80 for c in text):
        return h / 0.9
    top = max((_top(c) for c in text if c.isalnum()), default=0.5)
    bottom = 0.21 if any(c in DESCENDERS for c in text) else 0.0
    return h / (top + bottom)


def _top(c: str) -> float:
    """How far above the baseline a character reaches, in ems (typical of Latin text
    faces: x-height 0.5, ascenders and capitals 0.7)."""
    if c.isupper() or c.isdigit() or c in "bdfhklß":
        return 0.7
    if c in "ijt":
        return 0.64
    return 0.5 if c.isascii() else 0.7


def line_em(line: Line) -> float:
    """The line's font size: a low quartile of its words' sizes (dirt read into a word
    only makes its box taller)."""
    sizes = sorted(s for t in line.tokens if (s := token_em(t)))
    if not sizes:
        return float(max(t.box[3] - t.box[1] for t in line.tokens))
    return sizes[len(sizes) // 4]


@dataclass
class Metrics:
    """The page's measures, from its body text."""

    em: float  # body text's font size, pixels
    space: float  # a word space, pixels
    pitch: float  # body text's line pitch, pixels
    # words written with a hyphen inside them somewhere on the page ("machine-encoded"):
    # split at a line's end, they keep it
    compounds: frozenset[str] = frozenset()

    @classmethod
    def of(cls, lines: list[Line]) -> Metrics:
        body = [line_em(ln) for ln in lines if sum(1 for t in ln.tokens
                                                    if ALNUM.search(t.text)) >= 3]
        em = statistics.median(body) if body else statistics.median(line_em(ln)
                                                                    for ln in lines)
        gaps = [b.box[0] - a.box[2] for ln in lines
                for a, b in zip(ln.tokens, ln.tokens[1:], strict=False)
                if b.spaced and 0 < b.box[0] - a.box[2] < em]
        space = statistics.median(gaps) if gaps else em * 0.3
        pitches = []
        for a, b in zip(lines, lines[1:], strict=False):
            if (a.block, a.par) == (b.block, b.par):
                step = b.box[1] - a.box[1]
                if 0.8 * em < step < 2.5 * em:
                    pitches.append(step)
        pitch = statistics.median(pitches) if pitches else em * 1.25
        compounds = frozenset(w for ln in lines for t in ln.tokens
                              if _COMPOUND.fullmatch(w := t.text.lower().strip(".,;:!?")))
        return cls(max(em, 1.0), max(space, 1.0), max(pitch, 1.0), compounds)


@dataclass(frozen=True)
class Rule:
    """A ruling line: across (under a table's header, between its rows) or down
    (between its columns)."""

    box: Box
    vertical: bool

    @classmethod
    def of(cls, box: Box, em: float) -> Rule | None:
        w, h = box[2] - box[0], box[3] - box[1]
        if h <= 0.5 * em and w >= max(2 * em, 4 * h):
            return cls(box, False)
        if w <= 0.5 * em and h >= max(1.2 * em, 4 * w):
            return cls(box, True)
        return None

    @property
    def x(self) -> float:
        return (self.box[0] + self.box[2]) / 2


def marker_like(t: Token) -> bool:
    text = t.text
    return (text in BULLETS or text in BULLET_READINGS or not ALNUM.search(text)
            or bool(NUMBER.fullmatch(text) or LETTER.fullmatch(text)))


def box_like(t: Token, page: Metrics) -> bool:
    """A check box read as a letter or two ("O", "C1"): a square half an em wide or more."""
    w, h = t.box[2] - t.box[0], t.box[3] - t.box[1]
    return len(t.text) <= 2 and h > 0 and 0.75 <= w / h <= 1.33 and \
        0.45 * page.em <= max(w, h) <= 1.35 * page.em


def attach_markers(lines: list[Line], page: Metrics) -> list[Line]:
    """List markers that tesseract read as a block of their own (a column of `1.`,
    `2.` beside the items, a check box read as "O"): each goes back to the start of the
    line it stands beside."""
    out = list(lines)
    gone: set[int] = set()
    for i, line in enumerate(lines):
        if len(line.tokens) > 6 or not all(marker_like(t) or box_like(t, page)
                                           for t in line.tokens):
            continue
        targets = [_beside(t, lines, i, page) for t in line.tokens]
        if None in targets or len(set(targets)) != len(targets):
            continue
        for tok, k in zip(line.tokens, targets, strict=True):
            assert k is not None
            out[k] = Line([tok, *out[k].tokens], out[k].block, out[k].par)
        gone.add(i)
    return [ln for k, ln in enumerate(out) if k not in gone]


def _beside(tok: Token, lines: list[Line], skip: int, page: Metrics) -> int | None:
    """The line whose words start just right of the token, on its height."""
    best, dist = None, 4 * page.em
    for k, line in enumerate(lines):
        first = line.tokens[0]
        d = first.box[0] - tok.box[2]
        overlap = min(tok.box[3], first.box[3]) - max(tok.box[1], first.box[1])
        if k != skip and 0 < d < dist and overlap >= 0.5 * (tok.box[3] - tok.box[1]) \
                and not all(marker_like(t) for t in line.tokens):
            best, dist = k, d
    return best
