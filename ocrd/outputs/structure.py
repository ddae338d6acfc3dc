"""The structure of an OCR'd page, as Markdown: paragraphs, lists, tables, headings and
columns, found in the geometry of its words (tesseract's blocks, paragraphs, lines and
word boxes) and written with the words exactly as they were read.

Lengths are measured in ems of the page's body text, so that a page scanned at any
resolution is read alike. When the geometry leaves a structure in doubt, the lines stay
as they are rather than becoming a wrong table or list.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ocrd.outputs import cjk
from ocrd.outputs.markdown import escape_line

Box = tuple[int, int, int, int]  # left, top, right, bottom: pixels of the page image
# Where the page image has dark pixels within a box: the box around them and how many
# there are (None without any). It shows list markers the engine did not read as words.
Ink = Callable[[Box], "tuple[Box, int] | None"]

# -- what the engine hands over -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Token:
    """A word as the engine read it."""

    text: str
    box: Box
    conf: float = 100.0  # 0-100; below 0: not given
    spaced: bool = True  # written with a space before it (False: CJK run on)


@dataclass(slots=True)
class Line:
    """One line of words as the engine's layout found it, in its block and paragraph."""

    tokens: list[Token]
    block: int = 0
    par: int = 0

    @property
    def box(self) -> Box:
        return _union(t.box for t in self.tokens)


@dataclass
class Reading:
    """A page as read: its lines in the engine's order, the ruling lines it found (thin
    boxes without text: table grids, underlines) and the page's width in pixels."""

    lines: list[Line]
    rules: list[Box] = field(default_factory=list)
    width: int = 0  # 0: not known


# -- tuning (in ems of body text) ---------------------------------------------------------

CELL_GAP = 0.65  # a gap this wide inside a line may part table cells
GUTTER = 1.0  # a clear strip this wide between regions parts columns of text
HEADING = 1.25  # a line this much larger than body text is a heading
TITLE = 1.7  # ... and this much larger, the page's title (#) when all have one size
MAX_HEADING_WORDS = 12
TABLE_ROW_GAP = 1.2  # rows of a table follow each other at most this far apart
PARAGRAPH_GAP = 0.45  # this much more space than between lines starts a paragraph
ALIGN = 0.6  # lines start "at the same place" within this

BULLETS = frozenset("•·●○◦▪■□‣⁃∙◆◇►▸➢➤✓✔-–—*+")
_ROUND_BULLETS = BULLETS - frozenset("-–—*+")  # never anything but a bullet
# what tesseract makes of a small round bullet
_BULLET_READINGS = frozenset({"e", "o", "°", "«", "»", "¢", "©", "®", "*", "+", "e»", "©)",
                              "eo", "oe", ".", "·"})
_JUNK = r"[.,:;'’`]?"  # a speck read before or after the marker
_NUMBER = re.compile(r"[_'‘’`]?(\(?(\d{1,3})([.):]))" + _JUNK)
_LETTER = re.compile(r"[_'‘’`]?(\(?([a-zA-Z])([.)]))" + _JUNK)
_ROMAN = re.compile(r"[_'‘’`]?(\(?((?:x{0,3})(?:ix|iv|v?i{0,3}))([.)]))" + _JUNK,
                    re.IGNORECASE)
_TALL_MARKS = frozenset("()[]{}|/\\$@")  # reach above capitals and below the baseline
_DESCENDERS = frozenset("gjpqy")
_ALNUM = re.compile(r"\w")
_COMPOUND = re.compile(r"[^\W\d_]+-[^\W\d_]+")


def to_markdown(reading: Reading, ink: Ink | None = None) -> str:
    """The page's Markdown: its blocks in reading order, a blank line between them.
    `ink` (where the page image is dark) finds list markers that were not read."""
    lines = [line for line in reading.lines if line.tokens]
    if not lines:
        return ""
    turned = _upright(lines, reading.rules)
    if turned is not None:  # text read as it lies on its side: its own frame
        lines, rules_boxes = turned
        reading = Reading(lines, rules_boxes)
        ink = None
    page = _Metrics.of(lines)
    lines = _attach_markers(lines, page)
    rules = [r for box in reading.rules if (r := _Rule.of(box, page.em)) is not None]
    tables, used = _tables(lines, rules, page)
    regions = _regions(lines, used, tables, page)
    ordered = _reading_order(regions, page)
    _column_edges(ordered, lines, reading.width)
    return "\n\n".join(_Builder(page, lines, ink).build(ordered))


def _upright(lines: list[Line], rules: list[Box],
             ) -> tuple[list[Line], list[Box]] | None:
    """A page read with its lines running down or up (sideways text that tesseract reads
    as it lies) in the frame of its text, lines running left to right; None when the
    lines run across already."""
    tall = wide = down = 0
    for line in lines:
        for t in line.tokens:
            w, h = t.box[2] - t.box[0], t.box[3] - t.box[1]
            if len(t.text) >= 3 and _ALNUM.search(t.text):
                tall += h > 1.5 * w
                wide += w > h
        if len(line.tokens) >= 2:
            down += 1 if line.tokens[-1].box[1] > line.tokens[0].box[1] else -1
    if tall <= wide:
        return None

    def turn(b: Box) -> Box:  # a quarter turn back (running down) or forward (up)
        return (b[1], -b[2], b[3], -b[0]) if down >= 0 else (-b[3], b[0], -b[1], b[2])

    return ([Line([Token(t.text, turn(t.box), t.conf, t.spaced) for t in line.tokens],
                  line.block, line.par) for line in lines], [turn(b) for b in rules])


# -- measuring the page ------------------------------------------------------------------


def _union(boxes: Iterable[Box]) -> Box:
    ls, ts, rs, bs = zip(*boxes, strict=True)
    return min(ls), min(ts), max(rs), max(bs)


def _token_em(t: Token) -> float | None:
    """The font size a word's box suggests: its height over the share of an em that its
    letters span (from the highest top to the lowest descender); None for words with
    brackets or without letters, whose boxes say little."""
    text = t.text
    if not _ALNUM.search(text) or any(c in _TALL_MARKS for c in text):
        return None
    h = t.box[3] - t.box[1]
    if any(ord(c) > 0x2E80 for c in text):
        return h / 0.9
    top = max((_top(c) for c in text if c.isalnum()), default=0.5)
    bottom = 0.21 if any(c in _DESCENDERS for c in text) else 0.0
    return h / (top + bottom)


def _top(c: str) -> float:
    """How far above the baseline a character reaches, in ems (typical of Latin text
    faces: x-height 0.5, ascenders and capitals 0.7)."""
    if c.isupper() or c.isdigit() or c in "bdfhklß":
        return 0.7
    if c in "ijt":
        return 0.64
    return 0.5 if c.isascii() else 0.7


def _line_em(line: Line) -> float:
    """The line's font size: a low quartile of its words' sizes (dirt read into a word
    only makes its box taller)."""
    sizes = sorted(s for t in line.tokens if (s := _token_em(t)))
    if not sizes:
        return float(max(t.box[3] - t.box[1] for t in line.tokens))
    return sizes[len(sizes) // 4]


@dataclass
class _Metrics:
    """The page's measures, from its body text."""

    em: float  # body text's font size, pixels
    space: float  # a word space, pixels
    pitch: float  # body text's line pitch, pixels
    # words written with a hyphen inside them somewhere on the page ("machine-encoded"):
    # split at a line's end, they keep it
    compounds: frozenset[str] = frozenset()

    @classmethod
    def of(cls, lines: list[Line]) -> _Metrics:
        body = [_line_em(ln) for ln in lines if sum(1 for t in ln.tokens
                                                    if _ALNUM.search(t.text)) >= 3]
        em = statistics.median(body) if body else statistics.median(_line_em(ln)
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
class _Rule:
    """A ruling line: across (under a table's header, between its rows) or down
    (between its columns)."""

    box: Box
    vertical: bool

    @classmethod
    def of(cls, box: Box, em: float) -> _Rule | None:
        w, h = box[2] - box[0], box[3] - box[1]
        if h <= 0.5 * em and w >= max(2 * em, 4 * h):
            return cls(box, False)
        if w <= 0.5 * em and h >= max(1.2 * em, 4 * w):
            return cls(box, True)
        return None

    @property
    def x(self) -> float:
        return (self.box[0] + self.box[2]) / 2


def _marker_like(t: Token) -> bool:
    text = t.text
    return (text in BULLETS or text in _BULLET_READINGS or not _ALNUM.search(text)
            or bool(_NUMBER.fullmatch(text) or _LETTER.fullmatch(text)))


def _attach_markers(lines: list[Line], page: _Metrics) -> list[Line]:
    """List markers that tesseract read as a block of their own (a column of `1.`,
    `2.` beside the items): each goes back to the start of the line it stands beside."""
    out = list(lines)
    gone: set[int] = set()
    for i, line in enumerate(lines):
        if len(line.tokens) > 6 or not all(_marker_like(t) for t in line.tokens):
            continue
        targets = [_beside(t, lines, i, page) for t in line.tokens]
        if None in targets or len(set(targets)) != len(targets):
            continue
        for tok, k in zip(line.tokens, targets, strict=True):
            assert k is not None
            out[k] = Line([tok, *out[k].tokens], out[k].block, out[k].par)
        gone.add(i)
    return [ln for k, ln in enumerate(out) if k not in gone]


def _beside(tok: Token, lines: list[Line], skip: int, page: _Metrics) -> int | None:
    """The line whose words start just right of the token, on its height."""
    best, dist = None, 4 * page.em
    for k, line in enumerate(lines):
        first = line.tokens[0]
        d = first.box[0] - tok.box[2]
        overlap = min(tok.box[3], first.box[3]) - max(tok.box[1], first.box[1])
        if k != skip and 0 < d < dist and overlap >= 0.5 * (tok.box[3] - tok.box[1]) \
                and not all(_marker_like(t) for t in line.tokens):
            best, dist = k, d
    return best


# -- tables ------------------------------------------------------------------------------


@dataclass
class _Segment:
    """Words of one line between wide gaps: a cell of a table row, or a whole line."""

    tokens: list[Token]
    line: int  # index into the page's lines

    @property
    def box(self) -> Box:
        return _union(t.box for t in self.tokens)


@dataclass
class _Row:
    segments: list[_Segment]

    @property
    def box(self) -> Box:
        return _union(s.box for s in self.segments)


@dataclass
class Table:
    """A grid of cells (the first row is the header) and where it lies on the page."""

    cells: list[list[str]]
    box: Box
    right_aligned: list[bool]


def _segments(lines: list[Line], rules: list[_Rule], page: _Metrics, skip: set[int],
              bars: bool) -> list[_Segment]:
    """Each line cut at gaps wide enough to part cells, where it crosses a vertical rule
    (and with `bars`, at a `|`); dirt left out."""
    verticals = [r for r in rules if r.vertical]
    # wider than two word spaces: a typewriter's spaces are half an em and more
    cell_gap = max(CELL_GAP * page.em, 2 * page.space)
    out = []
    for i, line in enumerate(lines):
        if i in skip:
            continue
        cur: list[Token] = []
        last: Token | None = None
        for tok in line.tokens:
            if _dirt(tok, page):
                continue
            if bars and tok.text.strip("|") == "" or _on_rule(tok, verticals, page):
                if cur:
                    out.append(_Segment(cur, i))
                cur, last = [], None
                continue
            if last is not None and (tok.box[0] - last.box[2] >= cell_gap or any(
                    last.box[2] <= r.x <= tok.box[0] and _spans(r, tok.box)
                    for r in verticals)):
                out.append(_Segment(cur, i))
                cur = []
            cur.append(tok)
            last = tok
        if cur:
            out.append(_Segment(cur, i))
    return out


def _dirt(t: Token, page: _Metrics) -> bool:
    """A mark without letters or digits read with little confidence, or too small to be
    a dash: a speck on the page."""
    if _ALNUM.search(t.text):
        return False
    w, h = t.box[2] - t.box[0], t.box[3] - t.box[1]
    return 0 <= t.conf < 60 or max(w, h) < 0.2 * page.em


def _spans(rule: _Rule, box: Box) -> bool:
    return rule.box[1] <= (box[1] + box[3]) / 2 <= rule.box[3]


def _on_rule(t: Token, verticals: list[_Rule], page: _Metrics) -> bool:
    """A vertical rule read as a character (`|`, `I`, `l`, ...)."""
    if len(t.text) > 1 or t.text.isalnum() and t.text not in "Il1":
        return False
    mid = (t.box[0] + t.box[2]) / 2
    return any(abs(mid - r.x) <= 0.4 * page.em and _spans(r, t.box) for r in verticals)


def _rows(segments: list[_Segment]) -> list[_Row]:
    """Segments side by side on the same height, top to bottom."""
    rows: list[_Row] = []
    for seg in sorted(segments, key=lambda s: (s.box[1] + s.box[3]) / 2):
        top, bottom = seg.box[1], seg.box[3]
        for row in reversed(rows[-4:]):
            rt, rb = row.box[1], row.box[3]
            overlap = min(bottom, rb) - max(top, rt)
            if overlap >= 0.5 * min(bottom - top, rb - rt) and not any(
                    s.box[0] < seg.box[2] and seg.box[0] < s.box[2] for s in row.segments):
                row.segments.append(seg)
                row.segments.sort(key=lambda s: s.box[0])
                break
        else:
            rows.append(_Row([seg]))
    return rows


def _tables(lines: list[Line], rules: list[_Rule], page: _Metrics,
            ) -> tuple[list[Table], set[int]]:
    """The page's tables and the lines they took. A `|` read in a line is a character of
    a cell; only where no table is found that way is it taken for a ruling line that
    tesseract read as a character (between cells too close for their gap alone)."""
    big = {i for i, line in enumerate(lines) if _line_em(line) >= HEADING * page.em}
    tables, used = _find_tables(lines, rules, page, big, bars=False)
    more, taken = _find_tables(lines, rules, page, used | big, bars=True)
    return tables + more, used | taken


def _find_tables(lines: list[Line], rules: list[_Rule], page: _Metrics, skip: set[int],
                 bars: bool) -> tuple[list[Table], set[int]]:
    rows = _rows(_segments(lines, rules, page, skip, bars))
    tables: list[Table] = []
    used: set[int] = set()
    i = 0
    while i < len(rows):
        if len(rows[i].segments) < 2:
            i += 1
            continue
        j = i
        while j + 1 < len(rows) and _continues(rows[i:j + 1], rows[j + 1], rules, page):
            j += 1
        found = _grid(rows[i:j + 1], rules, page)
        if found is None:
            i += 1
            continue
        table, taken = found
        tables.append(table)
        used |= taken
        i = j + 1
    return tables, used


def _continues(run: list[_Row], nxt: _Row, rules: list[_Rule], page: _Metrics) -> bool:
    """Whether the next row goes on with the run: two cells or more, overlapping it,
    close below it (or further, inside the same ruled grid, or as far as the run's rows
    are from each other when they are spaced evenly)."""
    if len(nxt.segments) < 2:
        return False
    a, b = run[-1].box, nxt.box
    if not (a[0] < b[2] and b[0] < a[2]):
        return False
    gap = b[1] - a[3]
    if gap <= TABLE_ROW_GAP * page.em:
        return True
    grid = [r for r in rules if r.vertical and r.box[1] <= a[1] and b[3] <= r.box[3]
            and min(a[0], b[0]) - page.em <= r.x <= max(a[2], b[2]) + page.em]
    if len(grid) >= 2 and gap <= 3 * page.em:
        return True
    steps = [r.box[1] for r in run] + [b[1]]
    pitches = [y1 - y0 for y0, y1 in zip(steps, steps[1:], strict=False)]
    return len(pitches) >= 2 and gap <= 2.5 * page.em and \
        max(pitches) <= 1.25 * min(pitches)


def _grid(rows: list[_Row], rules: list[_Rule], page: _Metrics,
          ) -> tuple[Table, set[int]] | None:
    """The rows as a table, if their cells line up in columns; None otherwise."""
    box = _union(r.box for r in rows)
    ruled = _ruled(box, rules, page)
    if len(rows) < (2 if ruled else 3):
        return None
    columns = _columns(rows)
    if columns is None or len(columns) < 2:
        return None
    grid: list[list[list[Token]]] = [[[] for _ in columns] for _ in rows]
    for r, row in enumerate(rows):
        for seg in row.segments:
            for tok in seg.tokens:
                grid[r][_column_of(tok.box, columns)].append(tok)
    filled = sum(1 for row in grid for cell in row if cell)
    if filled < 0.6 * len(rows) * len(columns):
        return None
    if all(len(cell) == 1 and (_marker_like(cell[0]) or len(columns) == 2 and
                               cell[0].box[2] - cell[0].box[0] <= page.em)
           for row in grid if (cell := row[0])):
        return None  # a list: its markers stand apart from the items' words
    if not ruled and _prose_columns(grid, page):
        return None
    cells = [[_words(cell) for cell in row] for row in grid]
    right = [_right_aligned([row[c] for row in grid[1:] if row[c]])
             for c in range(len(columns))]
    taken = {s.line for row in rows for s in row.segments}
    return Table(cells, box, right), taken


def _ruled(box: Box, rules: list[_Rule], page: _Metrics) -> bool:
    """Whether vertical rules part the area's columns (a grid drawn around the cells)."""
    inside = [r for r in rules if r.vertical and box[0] - page.em <= r.x <= box[2] + page.em
              and r.box[1] <= box[3] and box[1] <= r.box[3]]
    return len(inside) >= 3


def _columns(rows: list[_Row]) -> list[tuple[int, int]] | None:
    """Column extents from the rows with the most common number of cells (two or more);
    None when those rows do not line up."""
    counts = [len(r.segments) for r in rows if len(r.segments) >= 2]
    if not counts:
        return None
    k = max(set(counts), key=lambda n: (counts.count(n), n))
    full = [r for r in rows if len(r.segments) == k]
    if len(full) < 2:
        return None
    columns = []
    for c in range(k):
        left = min(r.segments[c].box[0] for r in full)
        right = max(r.segments[c].box[2] for r in full)
        columns.append((left, right))
    if any(a[1] >= b[0] for a, b in zip(columns, columns[1:], strict=False)):
        return None
    return columns


def _column_of(box: Box, columns: list[tuple[int, int]]) -> int:
    mid = (box[0] + box[2]) / 2
    best, dist = 0, float("inf")
    for c, (left, right) in enumerate(columns):
        d = 0.0 if left <= mid <= right else min(abs(mid - left), abs(mid - right))
        if d < dist:
            best, dist = c, d
    return best


def _prose_columns(grid: list[list[list[Token]]], page: _Metrics) -> bool:
    """Columns of running text side by side rather than a table: in every column the
    lines are long, of several words each."""
    for c in range(len(grid[0])):
        cells = [row[c] for row in grid if row[c]]
        words = statistics.median(len(cell) for cell in cells)
        width = statistics.median(cell[-1].box[2] - cell[0].box[0] for cell in cells)
        if words < 6 and (words < 4 or width < 8 * page.em):
            return False
    return True


def _right_aligned(cells: list[list[Token]]) -> bool:
    if len(cells) < 2:
        return False
    lefts = [c[0].box[0] for c in cells]
    rights = [c[-1].box[2] for c in cells]
    return max(rights) - min(rights) < max(lefts) - min(lefts)


def _words(tokens: Sequence[Token]) -> str:
    """Words of one line (or cell) as written: spaces where the page has them."""
    out = []
    for k, t in enumerate(tokens):
        if k and t.spaced:
            out.append(" ")
        out.append(t.text)
    return "".join(out)


# -- regions and reading order -----------------------------------------------------------


@dataclass
class _Region:
    """Lines of one block of text (or one table) that are read together."""

    lines: list[int]  # indexes into the page's lines
    box: Box
    table: Table | None = None
    column: tuple[int, int] = (0, 0)  # left and right edge of its column of text
    heading: bool = False  # a line or two of large type: it goes with what follows


def _regions(lines: list[Line], used: set[int], tables: list[Table],
             page: _Metrics) -> list[_Region]:
    """Tesseract's blocks without the lines that went into tables, cut where a table
    lies between their lines; and the tables."""
    out: list[_Region] = []
    by_block: dict[int, list[int]] = {}
    for i, line in enumerate(lines):
        if i not in used and not _noise(line, page):
            by_block.setdefault(line.block, []).append(i)
    for idxs in by_block.values():
        run: list[int] = []
        for i in idxs:
            if run and any(lines[run[-1]].box[3] <= t.box[1] and t.box[3] <= lines[i].box[1]
                           for t in tables):
                out.append(_Region(run, _union(lines[k].box for k in run)))
                run = []
            run.append(i)
        if run:
            out.append(_Region(run, _union(lines[k].box for k in run)))
    out.extend(_Region([], t.box, t) for t in tables)
    for r in out:
        r.heading = 0 < len(r.lines) <= 2 and all(
            _line_em(lines[i]) >= HEADING * page.em for i in r.lines)
    return out


def _noise(line: Line, page: _Metrics) -> bool:
    """A line of specks: no letter or digit read with any confidence, and no mark read
    with confidence either."""
    return not any(t.conf >= 30 if _ALNUM.search(t.text) else not _dirt(t, page)
                   for t in line.tokens)


def _reading_order(regions: list[_Region], page: _Metrics) -> list[_Region]:
    """Regions read column by column: recursive cuts through the white space between
    them, down the page first where a gutter runs through (a band of the page whose
    columns continue below keeps its gutter)."""
    out: list[_Region] = []
    if regions:
        _order(regions, page, out, (min(r.box[0] for r in regions),
                                    max(r.box[2] for r in regions)))
    return out


def _column_edges(regions: list[_Region], lines: list[Line], width: int) -> None:
    """Each column's right edge where its lines of text end: the longest lines, not a
    heading or a table that reaches further. Text that spans the page ends no earlier
    than its margins say (as wide on the right as on the left): lines that all stop
    well short of it were broken on purpose."""
    rights: dict[tuple[int, int], list[int]] = {}
    lefts: list[int] = []
    for r in regions:
        if r.table is None:
            rights.setdefault(r.column, []).extend(lines[i].box[2] for i in r.lines)
            lefts.extend(lines[i].box[0] for i in r.lines)
    page = (min(r.box[0] for r in regions), max(r.box[2] for r in regions)) if regions \
        else (0, 0)
    margin = statistics.median(lefts) if lefts else 0  # where most lines start
    for r in regions:
        ends = sorted(rights.get(r.column, []))
        if not ends:
            continue
        edge = ends[(len(ends) * 9) // 10]
        if r.column == page and width > 0 and width > margin:
            edge = max(edge, round(width - margin))
        r.column = (r.column[0], edge)


def _order(regions: list[_Region], page: _Metrics, out: list[_Region],
           column: tuple[int, int]) -> None:
    """Append the regions to `out` in reading order, each with its column's edges."""
    if len(regions) <= 1:
        out.extend(_with_column(regions, column))
        return
    columns = _split(regions, 0, GUTTER * page.em)
    if len(columns) > 1:
        for part in columns:
            _order(part, page, out, (min(r.box[0] for r in part), max(r.box[2] for r in part)))
        return
    bands = _split(regions, 1, -0.25 * page.em)  # dirt can make boxes touch
    if len(bands) == 1:
        out.extend(_with_column(sorted(regions, key=lambda r: (r.box[1], r.box[0])),
                                column))
        return
    groups = _merge_bands(bands, page)
    for group in groups if len(groups) > 1 else bands:  # one group: no gutter after all
        _order(group, page, out, column)


def _with_column(regions: list[_Region], column: tuple[int, int]) -> list[_Region]:
    for r in regions:
        r.column = column
    return regions


def _split(regions: list[_Region], axis: int, min_gap: float) -> list[list[_Region]]:
    """Regions parted by clear strips across the whole set (axis 0: vertical strips,
    left to right; axis 1: horizontal ones, top to bottom)."""
    order = sorted(regions, key=lambda r: r.box[axis])
    parts: list[list[_Region]] = [[order[0]]]
    reach = order[0].box[axis + 2]
    for r in order[1:]:
        if r.box[axis] - reach > min_gap:
            parts.append([r])
        else:
            parts[-1].append(r)
        reach = max(reach, r.box[axis + 2])
    return parts


def _merge_bands(bands: list[list[_Region]], page: _Metrics) -> list[list[_Region]]:
    """Neighbouring bands joined while a gutter still runs through both, so that
    columns whose paragraphs happen to end on the same height stay columns; a band of
    headings alone goes with the band it heads."""
    gutter = GUTTER * page.em

    def joins(a: list[_Region], b: list[_Region]) -> bool:
        return (len(_split(a, 0, gutter)) > 1 or len(_split(b, 0, gutter)) > 1) and \
            len(_split(a + b, 0, gutter)) > 1

    groups = [list(bands[0])]
    for k, band in enumerate(bands[1:], 1):
        heads = all(r.heading for r in band)
        following = bands[k + 1] if k + 1 < len(bands) else None
        if joins(groups[-1], band) and not (
                heads and (following is None or not joins(band, following))):
            groups[-1] = groups[-1] + band
        else:
            groups.append(list(band))
    return groups


# -- lines into blocks -------------------------------------------------------------------


@dataclass
class _Marker:
    kind: str  # bullet, number, letter, roman, lost
    text: str  # as read, e.g. "3." or "b)"; "" for a bullet or a lost marker
    value: int  # the number or letter's place (1 for "1." or "a)"); 0 for bullets
    delim: str  # "." or ")"
    left: int  # where the marker starts
    text_left: int  # where the item's words start
    token: Token | None = None  # the marker as read (None: not read at all)


@dataclass
class _TextLine:
    tokens: list[Token]  # without the marker
    line: Line
    region: int
    left: int
    right: int
    top: int
    bottom: int
    em: float
    marker: _Marker | None = None
    heading: int = 0  # 1 or 2 for a heading line
    column: tuple[int, int] = (0, 0)

    @property
    def base(self) -> float:
        """The baseline: where most words stand (dirt above or below moves a box's
        top or bottom, not this)."""
        return _baseline(self.tokens)


@dataclass
class _Item:
    depth: int
    marker: _Marker
    lines: list[_TextLine]


@dataclass
class _Block:
    kind: str  # heading, paragraph, list, table
    lines: list[_TextLine] = field(default_factory=list)
    items: list[_Item] = field(default_factory=list)
    level: int = 0
    table: Table | None = None
    column: tuple[int, int] = (0, 0)


class _Builder:
    """Walks the lines in reading order and groups them into headings, paragraphs and
    lists; tables come whole."""

    def __init__(self, page: _Metrics, lines: list[Line], ink: Ink | None) -> None:
        self.page = page
        self._lines = lines
        self._ink = ink
        self.blocks: list[_Block] = []
        # each of tesseract's paragraphs: its lines' type sizes
        self._pars: dict[tuple[int, int], list[float]] = {}
        for line in lines:
            self._pars.setdefault((line.block, line.par), []).append(_line_em(line))
        self._words = [t.box for line in lines if not _noise(line, page)
                       for t in line.tokens]  # read as words (not dirt)

    def build(self, regions: list[_Region]) -> list[str]:
        prev: _TextLine | None = None
        for k, region in enumerate(regions):
            if region.table is not None:
                self.blocks.append(_Block("table", table=region.table))
                prev = None
                continue
            for i in region.lines:
                line = self._text_line(region, k, i)
                self._add(prev, line, region.column)
                prev = line
        self._lost_first_items()
        self._single_unread_items()
        self._long_headings()
        _heading_levels(self.blocks, self.page)
        return [md for b in self.blocks if (md := _block_markdown(b, self.page))]

    def _long_headings(self) -> None:
        """Large type over more than two lines is text set large, not a heading."""
        for k, block in enumerate(self.blocks):
            if block.kind == "heading" and len(block.lines) > 2:
                self.blocks[k] = _Block("paragraph", block.lines, column=block.column)

    def _single_unread_items(self) -> None:
        """A "list" of one item whose marker was not read is a paragraph after a mark
        of dirt."""
        for k, block in enumerate(self.blocks):
            if block.kind == "list" and len(block.items) == 1 and \
                    block.items[0].marker.kind == "lost":
                self.blocks[k] = _Block("paragraph", block.items[0].lines,
                                        column=block.column)

    # -- reading one line ------------------------------------------------------------

    def _text_line(self, region: _Region, k: int, i: int) -> _TextLine:
        line = self._lines[i]
        tokens = list(line.tokens)
        marker = _marker(tokens, self.page)
        while marker is None and len(tokens) > 1 and _speck(tokens[0], self.page):
            tokens = tokens[1:]  # dirt before the line
            marker = _marker(tokens, self.page)
        # "1. Introduction" in large type is a heading; a bullet in large type an item
        heading = (marker is None or marker.kind != "bullet") and self._heading_sized(line)
        if heading:
            marker = None
        words = tokens[1:] if marker is not None else tokens
        words = [t for t in words if not _speck(t, self.page)] or words
        box = _union(t.box for t in words)
        tl = _TextLine(words, line, k, box[0], box[2], box[1], box[3], _line_em(line),
                       marker, column=region.column)
        if heading:
            tl.heading = 1 if tl.em >= TITLE * self.page.em else 2
        elif tl.marker is None:
            tl.marker = self._unread_marker(tl, region.column)
        return tl

    def _unread_marker(self, line: _TextLine, column: tuple[int, int]) -> _Marker | None:
        """A mark in the white space before an indented line that no word was read
        from: a list marker tesseract took for dirt. Marks are looked for from the line's
        start leftwards, a few ems at most; dust is passed over."""
        em = self.page.em
        right = line.left - round(0.25 * em)
        limit = max(column[0] - round(0.5 * em), line.left - round(4 * em))
        if self._ink is None or right - limit < 0.5 * em or self._words_in(
                (limit, line.top, right, line.bottom)):
            return None
        x = right
        while x > limit:
            mark = self._mark_left_of(x, limit, line)
            if mark is None:
                return None
            box, count = mark
            if self._marker_shaped(box, count, line) and self._stands_alone(box, line):
                return _Marker("lost", "", 0, "", box[0], line.left)
            x = box[0] - 1
        return None

    def _mark_left_of(self, x: int, limit: int, line: _TextLine,
                      ) -> tuple[Box, int] | None:
        """The nearest mark left of x: ink, followed leftwards across gaps narrower
        than those between a marker and its words."""
        assert self._ink is not None
        em = self.page.em
        step = max(1, round(0.25 * em))
        found = None
        while x > limit and found is None:
            found = self._ink((max(limit, x - step), line.top, x, line.bottom))
            x -= step
        if found is None:
            return None
        box = found[0]
        while box[0] > limit:
            more = self._ink((max(limit, box[0] - step), line.top, box[0], line.bottom))
            if more is None or more[0][2] < box[0] - 0.15 * em:
                break
            box = (more[0][0], box[1], box[2], box[3])
        return self._ink((box[0], line.top, box[2], line.bottom))

    def _stands_alone(self, box: Box, line: _TextLine) -> bool:
        """White above and below the mark: not the edge of a picture beside the text."""
        assert self._ink is not None
        reach = round(0.25 * self.page.em)
        around = self._ink((box[0], line.top - reach, box[2], line.bottom + reach))
        return around is not None and around[0][1] >= box[1] - 1 and \
            around[0][3] <= box[3] + 1

    def _marker_shaped(self, box: Box, count: int, line: _TextLine) -> bool:
        """A bullet, a dash or a number's glyphs: solid, a fifth of an em or more; not
        dust."""
        em = self.page.em
        w, h = box[2] - box[0], box[3] - box[1]
        middle = (box[1] + box[3]) / 2
        bar = w >= 0.2 * em and w >= 2.5 * h and count >= 0.5 * w * h  # a dash
        solid = count >= (0.15 * em) ** 2 or bar
        return (line.top <= middle <= line.bottom and 0.2 * em <= max(w, h) <= 2.5 * em
                and h <= 1.0 * em and solid and count >= 0.15 * max(1, w * h))

    def _words_in(self, zone: Box) -> bool:
        """Whether a word lies in the zone (dirt, or a marker read as nothing sensible,
        does not count)."""
        return any(b[0] < zone[2] and zone[0] < b[2] and b[1] < zone[3] and zone[1] < b[3]
                   for b in self._words)

    def _heading_sized(self, line: Line) -> bool:
        """A heading: a short line of large words, in a paragraph of such lines."""
        sizes = [s for t in line.tokens if (s := _token_em(t))]
        if not 0 < len(sizes) <= MAX_HEADING_WORDS:
            return False
        em = self.page.em
        return all(size >= HEADING * em for size in self._pars[(line.block, line.par)])

    # -- grouping ----------------------------------------------------------------------

    def _add(self, prev: _TextLine | None, line: _TextLine, column: tuple[int, int]) -> None:
        cur = self.blocks[-1] if self.blocks else None
        if line.heading and self._runs_on(cur, prev, line, column):
            line.heading = 0  # a list item or paragraph set large goes on here
        if line.heading:
            if (cur is not None and cur.kind == "heading" and prev is not None
                    and prev.heading == line.heading and prev.region == line.region
                    and line.top - prev.bottom < 0.8 * line.em):
                cur.lines.append(line)
                return
            self.blocks.append(_Block("heading", [line], level=line.heading, column=column))
            return
        if line.marker is not None and self._marker_runs_on(cur, prev, line, column):
            assert line.marker.token is not None
            line.tokens.insert(0, line.marker.token)
            line.left, line.marker = line.marker.left, None
        if line.marker is not None:
            if cur is not None and cur.kind == "list":
                cur.items.append(_Item(self._depth(cur, line.marker), line.marker, [line]))
            else:
                self.blocks.append(_Block("list", items=[_Item(0, line.marker, [line])],
                                          column=column))
            return
        if cur is not None and cur.kind == "list" and prev is not None:
            depth = self._continues_list(cur, prev, line, column)
            if depth is not None:
                item = cur.items[-1]
                if depth < 0:
                    item.lines.append(line)
                else:
                    lost = _Marker("lost", "", 0, "", line.left, line.left)
                    cur.items.append(_Item(depth, lost, [line]))
                return
        if (cur is not None and cur.kind == "paragraph" and prev is not None
                and self._same_paragraph(prev, line, column)):
            cur.lines.append(line)
            return
        self.blocks.append(_Block("paragraph", [line], column=column))

    def _marker_runs_on(self, cur: _Block | None, prev: _TextLine | None,
                        line: _TextLine, column: tuple[int, int]) -> bool:
        """A dash, or a number other than a list's first, that starts a line of running
        text after a full one: the sentence's own ("… on page / 3. …"), not a list's."""
        marker = line.marker
        if marker is None or not (
                marker.token is not None and marker.token.text in "-–—"
                or marker.kind in ("number", "letter", "roman") and marker.value != 1):
            return False
        return (cur is not None and cur.kind == "paragraph" and prev is not None
                and prev.region == line.region
                and abs(marker.left - prev.left) <= ALIGN * self.page.em
                and not _deliberate(prev, line, column, self.page))

    def _runs_on(self, cur: _Block | None, prev: _TextLine | None, line: _TextLine,
                 column: tuple[int, int]) -> bool:
        """Whether a large line goes on with the text before it, in the same type size:
        right below, where that text's words start, after a line that was full."""
        if cur is None or prev is None or cur.kind not in ("list", "paragraph"):
            return False
        if abs(line.em - prev.em) > 0.12 * prev.em or _deliberate(prev, line, column,
                                                                   self.page):
            return False
        left = cur.items[-1].marker.text_left if cur.kind == "list" else prev.left
        step = line.base - prev.base
        return abs(line.left - left) <= ALIGN * self.page.em and \
            0 < step <= self.page.pitch * line.em / self.page.em + PARAGRAPH_GAP * line.em

    def _depth(self, block: _Block, marker: _Marker) -> int:
        """The nesting depth of a new item: by where its marker stands among the
        list's earlier items."""
        tol = ALIGN * self.page.em
        stack: list[_Marker] = []
        for item in block.items:
            while stack and item.marker.left < stack[-1].left - tol:
                stack.pop()
            if stack and abs(item.marker.left - stack[-1].left) <= tol:
                stack[-1] = item.marker
            elif not stack or item.marker.left > stack[-1].left + tol:
                stack.append(item.marker)
        while stack and marker.left < stack[-1].left - tol:
            stack.pop()
        if stack and abs(marker.left - stack[-1].left) <= tol:
            return len(stack) - 1
        if stack and marker.left > stack[-1].left + tol:
            return len(stack)
        return max(0, len(stack) - 1)

    def _continues_list(self, block: _Block, prev: _TextLine, line: _TextLine,
                        column: tuple[int, int]) -> int | None:
        """-1: the line goes on with the list's last item; d >= 0: a new item of depth d
        whose marker was not read; None: the list has ended."""
        tol = ALIGN * self.page.em
        item = block.items[-1]
        if line.top - prev.bottom > 2.5 * self.page.em:
            return None
        if abs(line.left - item.marker.text_left) <= tol and not _deliberate(
                prev, line, column, self.page):
            return -1
        for it in reversed(block.items):
            if abs(line.left - it.marker.text_left) <= tol and it.marker.kind != "lost" \
                    and it.marker.left < line.left - tol:
                return it.depth
        return None

    def _same_paragraph(self, prev: _TextLine, line: _TextLine,
                        column: tuple[int, int]) -> bool:
        em = self.page.em
        if prev.column != line.column and line.left > prev.right:
            # the next column: a sentence that goes on there, lowercase, from a full line
            return (line.tokens[0].text[:1].islower()
                    and abs(line.left - line.column[0]) <= ALIGN * em
                    and not _deliberate(prev, line, prev.column, self.page))
        step = line.base - prev.base
        if step <= 0 or step > self.page.pitch + PARAGRAPH_GAP * em:
            return False  # space above the line: a new paragraph
        indent = line.left - prev.left
        if prev.region != line.region:
            # a block of tesseract's starts here; but the text runs on when the line
            # before is full and this one neither indented nor set apart
            return abs(indent) < ALIGN * em and not _deliberate(prev, line, column,
                                                                 self.page)
        if prev.line.par != line.line.par:
            # tesseract makes a paragraph of every short line: lines of one line each,
            # without space or indent between them, are lines of one (kept as lines)
            single = len(self._pars[(prev.line.block, prev.line.par)]) == 1
            return abs(indent) < ALIGN * em and (single or not _deliberate(
                prev, line, column, self.page))
        # a first-line indent after a short line starts a paragraph
        return not (indent > 1.2 * em and _deliberate(prev, line, column, self.page))

    def _lost_first_items(self) -> None:
        """A short paragraph right before a list, standing where the list's words
        start: items whose markers were not read."""
        tol = ALIGN * self.page.em
        for k in range(len(self.blocks) - 1, 0, -1):
            block, before = self.blocks[k], self.blocks[k - 1]
            if block.kind != "list" or before.kind != "paragraph":
                continue
            first = block.items[0]
            if first.marker.kind == "lost":
                continue
            if not all(abs(ln.left - first.marker.text_left) <= tol for ln in before.lines):
                continue
            if not first.marker.left < before.lines[0].left - tol:
                continue
            items = []
            for ln in before.lines:
                if items and not _deliberate(items[-1].lines[-1], ln, before.column,
                                             self.page):
                    items[-1].lines.append(ln)
                else:
                    lost = _Marker("lost", "", 0, "", ln.left, ln.left)
                    items.append(_Item(first.depth, lost, [ln]))
            block.items[:0] = items
            del self.blocks[k - 1]


def _baseline(tokens: list[Token]) -> float:
    bottoms = [t.box[3] for t in tokens if _ALNUM.search(t.text)
               and not any(c in _DESCENDERS for c in t.text)]
    return statistics.median(bottoms or [t.box[3] for t in tokens])


def _heading_levels(blocks: list[_Block], page: _Metrics) -> None:
    """Heading levels by size among the page's headings: the largest are `#`, the next
    `##`, smaller ones `###`; a page whose headings all have one size gets `#` only for
    a size that is the page's title."""
    heads = [b for b in blocks if b.kind == "heading"]
    sizes = sorted({round(statistics.median(ln.em for ln in b.lines)) for b in heads},
                   reverse=True)
    tiers: list[float] = []
    for size in sizes:
        if not tiers or size < 0.88 * tiers[-1]:
            tiers.append(size)
    for b in heads:
        size = statistics.median(ln.em for ln in b.lines)
        tier = next((k for k, top in enumerate(tiers) if size >= 0.88 * top), len(tiers) - 1)
        if len(tiers) == 1:
            b.level = 1 if size >= TITLE * page.em else 2
        else:
            b.level = min(tier + 1, 3)


def _speck(t: Token, page: _Metrics) -> bool:
    """Dust read as a mark: no letter or digit, smaller than lowercase letters and
    read with little confidence (a full stop or a CJK comma read well is text)."""
    return (not _ALNUM.search(t.text) and not any(cjk.is_cjk(c) for c in t.text)
            and max(t.box[2] - t.box[0], t.box[3] - t.box[1]) < 0.4 * page.em
            and 0 <= t.conf < 60)


def _marker(tokens: list[Token], page: _Metrics) -> _Marker | None:
    """The list marker that starts a line, if there is one."""
    if len(tokens) < 2:
        return None
    first, second = tokens[0], tokens[1]
    text = first.text
    gap = second.box[0] - first.box[2]
    left, text_left = first.box[0], second.box[0]
    w, h = first.box[2] - first.box[0], first.box[3] - first.box[1]
    if text in _ROUND_BULLETS and gap > 0 and max(w, h) >= 0.15 * page.em:
        return _Marker("bullet", "", 0, "", left, text_left, first)
    if not _ALNUM.search(second.text) and not second.text.startswith(tuple("(\"'‘’“”«")):
        return None
    if text in BULLETS and gap > 0 and max(w, h) >= (0.2 if text in "-–—" else 0.15) * page.em:
        return _Marker("bullet", "", 0, "", left, text_left, first)
    if m := _NUMBER.fullmatch(text):
        return _Marker("number", m[1], int(m[2]), m[3], left, text_left, first)
    if (m := _LETTER.fullmatch(text)) and (m[3] == ")" or gap >= 0.5 * page.em):
        return _Marker("letter", m[1], ord(m[2].lower()) - 96, m[3], left, text_left, first)
    if (m := _ROMAN.fullmatch(text)) and m[2]:
        return _Marker("roman", m[1], 0, m[3], left, text_left, first)
    if len(text) <= 2 and (sum(c.isalnum() for c in text) <= 1 or text in _BULLET_READINGS) \
            and _bullet_shaped(first, tokens[1:], page):
        return _Marker("bullet", "", 0, "", left, text_left, first)
    return None


def _bullet_shaped(mark: Token, words: list[Token], page: _Metrics) -> bool:
    """A bullet read as some small character: a solid dot smaller than the line's
    lowercase letters, at their middle, with more than a word space after it (not dust
    anywhere, not a one-letter word)."""
    if not any(_ALNUM.search(t.text) for t in words):
        return False
    em = min(max(page.em, _line_em(Line(words))), 1.6 * page.em)  # the line's type size
    w, h = mark.box[2] - mark.box[0], mark.box[3] - mark.box[1]
    gap = words[0].box[0] - mark.box[2]
    if not (0.15 * em <= min(w, h) and max(w, h) <= 0.47 * em and
            max(w, h) <= 2.2 * min(w, h) and gap >= 0.28 * em):
        return False
    baseline = _baseline(words[:4])  # near the mark: a skewed line climbs
    middle = (mark.box[1] + mark.box[3]) / 2
    return baseline - 0.75 * em <= middle <= baseline - 0.05 * em


def _deliberate(prev: _TextLine, line: _TextLine, column: tuple[int, int],
                page: _Metrics) -> bool:
    """Whether the page breaks `prev` on purpose: the next line's first word would
    have fitted at its end."""
    if not line.tokens:
        return True
    first = line.tokens[0]
    if prev.tokens and _hyphenated(prev.tokens[-1].text, first.text):
        return False  # nobody breaks a word on purpose
    scale = max(1.0, prev.em / page.em)  # a word space in the line's own type size
    need = page.space * scale + (first.box[2] - first.box[0])
    # with room to spare: a typist returns the carriage before the margin
    slack = (2 * page.space + 0.3 * page.em) * scale
    return prev.right + need < column[1] - slack


# -- Markdown ----------------------------------------------------------------------------


def _block_markdown(block: _Block, page: _Metrics) -> str:
    if block.kind == "table":
        assert block.table is not None
        return _table_markdown(block.table)
    if block.kind == "heading":
        text = _join([ln for ln in block.lines], block.column, page, hard=False)
        return "#" * block.level + " " + _heading_text(escape_line(text))
    if block.kind == "list":
        return _list_markdown(block, page)
    return _paragraph_markdown(block.lines, block.column, page, "")


def _heading_text(text: str) -> str:
    # a run of # at the end would be read as the heading's closing sequence
    return re.sub(r"(?<=\s)#", r"\\#", text)


def _join(lines: list[_TextLine], column: tuple[int, int], page: _Metrics,
          hard: bool = True) -> str:
    """Lines as one text, joined as prose (hyphenation at line ends resolved); with
    `hard`, deliberate breaks come back as newlines."""
    parts: list[str] = []
    for k, line in enumerate(lines):
        text = _words(line.tokens)
        if k:
            prev = lines[k - 1]
            if hard and _deliberate(prev, line, column, page):
                parts.append("\n")
            elif _hyphenated(parts[-1], text) and not _compound(parts[-1], text, page):
                parts[-1] = parts[-1][:-1]
            elif parts[-1].endswith(("-", "‐")) and text[:1].isalpha():
                pass  # a hyphen that belongs to the word: "Anglo-" + "Saxon"
            elif not cjk.tight(parts[-1], text):
                parts.append(" ")
        parts.append(text)
    return "".join(parts)


def _compound(before: str, after: str, page: _Metrics) -> bool:
    """A word that the page writes with its hyphen elsewhere."""
    head = before.rsplit(" ", 1)[-1][:-1].lower()
    tail = after.split(" ", 1)[0].lower().strip(".,;:!?")
    return f"{head}-{tail}" in page.compounds


def _hyphenated(before: str, after: str) -> bool:
    """A word split at the line end: a letter, a hyphen, and lowercase going on."""
    return (len(before) >= 3 and before[-1] in "-‐\u00ad¬" and before[-2].isalpha()
            and after[:1].islower())


def _paragraph_markdown(lines: list[_TextLine], column: tuple[int, int],
                        page: _Metrics, indent: str) -> str:
    text = _join(lines, column, page)
    return f"\\\n{indent}".join(escape_line(part) for part in text.split("\n"))


def _list_markdown(block: _Block, page: _Metrics) -> str:
    out: list[str] = []
    _list_level(block.items, 0, "", block.column, page, out)
    return "\n".join(out)


def _list_level(items: list[_Item], depth: int, indent: str, column: tuple[int, int],
                page: _Metrics, out: list[str]) -> None:
    """The items of one depth (and, under each, its deeper items)."""
    k = 0
    siblings = [i for i in items if i.depth == depth]
    numbering = _numbering(siblings)
    while k < len(items):
        item = items[k]
        if item.depth < depth:
            break
        if item.depth > depth:  # deeper than expected: read as this depth
            item.depth = depth
        n = siblings.index(item)
        if numbering is not None:
            start, delim = numbering
            mark = f"{start + n}{delim} "
            words = _join(item.lines, column, page)
        else:
            mark = "- "
            words = _join(item.lines, column, page)
            if item.marker.kind in ("number", "letter", "roman"):
                words = f"{item.marker.text} {words}"
        inner = indent + " " * len(mark)
        body = f"\\\n{inner}".join(escape_line(p) for p in words.split("\n"))
        out.append(f"{indent}{mark}{body}")
        k += 1
        children = []
        while k < len(items) and items[k].depth > depth:
            children.append(items[k])
            k += 1
        if children:
            first = min(c.depth for c in children)
            numbered = _numbering([c for c in children if c.depth == first])
            if numbered is not None and numbered[0] != 1:
                out.append("")  # only a list numbered from 1 may interrupt a paragraph
            _list_level(children, first, inner, column, page, out)


def _numbering(items: list[_Item]) -> tuple[int, str] | None:
    """(first number, delimiter) when the items are numbered 1, 2, 3 … (some numbers
    may not have been read); None for bullets, letters or numbers out of order."""
    starts = set()
    delim = "."
    seen = False
    for n, item in enumerate(items):
        m = item.marker
        if m.kind == "number":
            starts.add(m.value - n)
            delim = m.delim if m.delim in ".)" else "."
            seen = True
        elif m.kind != "lost":
            return None
    if not seen or len(starts) != 1:
        return None
    start = starts.pop()
    return (start, delim) if start >= 0 else None


def _table_markdown(table: Table) -> str:
    def row(cells: list[str]) -> str:
        return "| " + " | ".join(escape_line(c) for c in cells) + " |"

    rule = "| " + " | ".join("---:" if r else "---" for r in table.right_aligned) + " |"
    return "\n".join([row(table.cells[0]), rule, *(row(r) for r in table.cells[1:])])
