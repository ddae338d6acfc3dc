"""Tables: rows of cells found from wide gaps between words and from ruling lines, told
apart from columns of prose.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from ocrd.layout.measure import (
    ALNUM,
    BULLETS,
    CELL_GAP,
    HEADING,
    NUMBER,
    TABLE_ROW_GAP,
    Metrics,
    Rule,
    line_em,
    marker_like,
)
from ocrd.layout.reading import Box, Line, Look, Token, union

# a cell whose words tesseract read with less confidence than this is read again (a
# lone figure in a sparse table is often read as letters)
DOUBTFUL = 60.0
_FIGURE = re.compile(r"[-+(]?[$€£]?\d[\d.,:/ ]*%?\)?")


@dataclass
class _Segment:
    """Words of one line between wide gaps: a cell of a table row, or a whole line."""

    tokens: list[Token]
    line: int  # index into the page's lines

    @property
    def box(self) -> Box:
        return union(t.box for t in self.tokens)


@dataclass
class _Row:
    segments: list[_Segment]
    # the rest of cells that wrap: the lines under the row that go on with its cells
    wrapped: list[_Segment] = field(default_factory=list)

    @property
    def box(self) -> Box:
        return union(s.box for s in self.segments + self.wrapped)


@dataclass
class Table:
    """A grid of cells (the first row is the header) and where it lies on the page."""

    cells: list[list[str]]
    box: Box
    right_aligned: list[bool]
    # cells read with little confidence, for a second look: (row, column, box, the
    # lowest confidence of its words)
    doubtful: list[tuple[int, int, Box, float]] = field(default_factory=list)
    numeric: list[bool] = field(default_factory=list)  # columns of figures

    def read_again(self, look: Look) -> None:
        """Doubtful cells read again, each on its own: what the second look reads with
        more confidence replaces them (in a column of figures, only figures; tesseract
        reads figures better without being told that they are)."""
        if not self.doubtful:
            return
        found = look([d[2] for d in self.doubtful], "")
        for (row, column, _, conf), (text, again) in zip(self.doubtful, found, strict=True):
            if text and again > conf and (not self.numeric[column] or
                                          _FIGURE.fullmatch(text)):
                self.cells[row][column] = text


def _segments(lines: list[Line], rules: list[Rule], page: Metrics, skip: set[int],
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
            if is_dirt(tok, page):
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


def is_dirt(t: Token, page: Metrics) -> bool:
    """A mark without letters or digits read with little confidence, or too small to be
    a dash: a speck on the page."""
    if ALNUM.search(t.text):
        return False
    w, h = t.box[2] - t.box[0], t.box[3] - t.box[1]
    return 0 <= t.conf < 60 or max(w, h) < 0.2 * page.em


def _spans(rule: Rule, box: Box) -> bool:
    return rule.box[1] <= (box[1] + box[3]) / 2 <= rule.box[3]


def _on_rule(t: Token, verticals: list[Rule], page: Metrics) -> bool:
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


def page_tables(lines: list[Line], rules: list[Rule], page: Metrics,
            ) -> tuple[list[Table], set[int]]:
    """The page's tables and the lines they took. A `|` read in a line is a character of
    a cell; only where no table is found that way is it taken for a ruling line that
    tesseract read as a character (between cells too close for their gap alone)."""
    grids, gridded = _grid_tables(lines, rules, page)
    big = {i for i, line in enumerate(lines) if line_em(line) >= HEADING * page.em}
    tables, used = _find_tables(lines, rules, page, big | gridded, bars=False)
    more, taken = _find_tables(lines, rules, page, used | big | gridded, bars=True)
    return grids + tables + more, gridded | used | taken


def _grid_tables(lines: list[Line], rules: list[Rule], page: Metrics,
                 ) -> tuple[list[Table], set[int]]:
    """Tables drawn as a grid, rules across and down: every cell the words inside its
    rectangle, over as many lines as they take (cells that wrap stay in their row; a
    cell may hold a list or a paragraph). The lines most of whose words lie inside a grid
    are its."""
    tables: list[Table] = []
    used: set[int] = set()
    verticals = [r for r in rules if r.vertical]  # read as `|`: a rule, not a word
    for xs, ys, box in _grids(rules, page):
        inside: dict[int, list[Token]] = {}
        for i, line in enumerate(lines):
            if i in used:
                continue
            mine = [t for t in line.tokens if _within(t.box, box) and not is_dirt(t, page)
                    and t.text.strip("|") and not _on_rule(t, verticals, page)]
            if mine and len(mine) >= 0.5 * len(line.tokens):
                inside[i] = mine
        grid: list[list[list[Token]]] = [[[] for _ in xs[1:]] for _ in ys[1:]]
        for i in sorted(inside, key=lambda i: lines[i].box[1]):
            for t in inside[i]:
                cx, cy = (t.box[0] + t.box[2]) / 2, (t.box[1] + t.box[3]) / 2
                r = _slot(cy, ys)
                c = _slot(cx, xs)
                if r is not None and c is not None:
                    grid[r][c].append(t)
        grid = [row for row in grid if any(row)]
        if len(grid) < 2 or sum(1 for row in grid for cell in row if cell) < 2:
            continue
        cells = [[_cell_text(cell) for cell in row] for row in grid]
        right = [_right_aligned([row[c] for row in grid[1:] if row[c]])
                 for c in range(len(xs) - 1)]
        tables.append(Table(cells, box, right, *_doubtful(grid, cells)))
        used |= set(inside)
    return tables, used


def _grids(rules: list[Rule], page: Metrics,
           ) -> list[tuple[list[float], list[float], Box]]:
    """Grids of ruling lines: rules across, one under another, each two joined by two
    rules down at least (its columns' sides); (the columns' edges, the rows' edges, the
    grid's box) for each."""
    tol = 0.5 * page.em
    down = [r for r in rules if r.vertical]

    def ends_at_sides(r: Rule) -> bool:  # not an underline or a line struck through
        y = (r.box[1] + r.box[3]) / 2
        sides = [v.x for v in down if v.box[1] - tol <= y <= v.box[3] + tol]
        return any(abs(x - r.box[0]) <= tol for x in sides) and \
            any(abs(x - r.box[2]) <= tol for x in sides)

    across = sorted((r for r in rules if not r.vertical and ends_at_sides(r)),
                    key=lambda r: r.box[1])

    def joins(a: Rule, b: Rule) -> int:
        left, right = max(a.box[0], b.box[0]) - tol, min(a.box[2], b.box[2]) + tol
        return sum(1 for v in down if left <= v.x <= right
                   and v.box[1] <= a.box[1] + tol and v.box[3] >= b.box[3] - tol)

    groups: list[list[Rule]] = []
    for rule in across:
        for group in groups:
            last = group[-1]
            overlap = min(last.box[2], rule.box[2]) - max(last.box[0], rule.box[0])
            if overlap >= 0.5 * min(last.box[2] - last.box[0], rule.box[2] - rule.box[0]) \
                    and joins(last, rule) >= 2:
                group.append(rule)
                break
        else:
            groups.append([rule])
    out = []
    for group in groups:
        if len(group) < 2:
            continue
        box = (min(r.box[0] for r in group), group[0].box[1],
               max(r.box[2] for r in group), group[-1].box[3])
        xs = _edges([v.x for v in down if box[0] - tol <= v.x <= box[2] + tol
                     and v.box[1] < box[3] - tol and v.box[3] > box[1] + tol]
                    + [box[0], box[2]], tol)
        ys = _edges([(r.box[1] + r.box[3]) / 2 for r in group], tol)
        if len(ys) >= 3 and len(xs) >= 2:
            out.append((xs, ys, box))
    return out


def _edges(values: list[float], tol: float) -> list[float]:
    """Values closer than tol to the one before merged: the edges of rows or columns."""
    out: list[float] = []
    for v in sorted(values):
        if out and v - out[-1] <= tol:
            continue
        out.append(v)
    return out


def _within(box: Box, outer: Box) -> bool:
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return outer[0] <= cx <= outer[2] and outer[1] <= cy <= outer[3]


def _slot(v: float, edges: list[float]) -> int | None:
    for k in range(len(edges) - 1):
        if edges[k] <= v < edges[k + 1]:
            return k
    return None


def _cell_text(tokens: list[Token]) -> str:
    """A cell's words line by line (in the order they were read: top to bottom), each
    line's words as written."""
    return " ".join(words_text([t]) for t in tokens)


def _find_tables(lines: list[Line], rules: list[Rule], page: Metrics, skip: set[int],
                 bars: bool) -> tuple[list[Table], set[int]]:
    rows = _rows(_segments(lines, rules, page, skip, bars))
    tables: list[Table] = []
    used: set[int] = set()
    i = 0
    while i < len(rows):
        if len(rows[i].segments) < 2:
            i += 1
            continue
        run, spans, k = [rows[i]], [1], i + 1  # the run's rows, and the lines each took
        while k < len(rows):
            columns = _columns(run)
            if _continues(run, rows[k], rules, page):
                run.append(rows[k])
                spans.append(1)
            elif columns is not None and _wrapped(run[-1], rows[k], columns, page):
                run[-1] = _Row(run[-1].segments, run[-1].wrapped + rows[k].segments)
                spans[-1] += 1
            else:
                break
            k += 1
        columns = _columns(run)
        if columns is not None:
            fit = [_fits(row, columns) for row in run]
            if not fit[0]:  # a line that runs across the columns: not the table's
                i += 1
                continue
            if not all(fit):
                run, spans = run[:fit.index(False)], spans[:fit.index(False)]
        found = _grid(run, rules, page)
        if found is None:
            i += 1
            continue
        table, taken = found
        tables.append(table)
        used |= taken
        i += sum(spans)
    return tables, used


def _continues(run: list[_Row], nxt: _Row, rules: list[Rule], page: Metrics) -> bool:
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
    # (rows whose cells wrap are of different heights: the white between them is even)
    whites = [max(1, r2.box[1] - r1.box[3]) for r1, r2 in zip(run, run[1:], strict=False)]
    return len(pitches) >= 2 and gap <= 2.5 * page.em and (
        max(pitches) <= 1.25 * min(pitches) or max(*whites, gap) <= 1.25 * min(*whites, gap))


def _grid(rows: list[_Row], rules: list[Rule], page: Metrics,
          ) -> tuple[Table, set[int]] | None:
    """The rows as a table, if their cells line up in columns; None otherwise."""
    box = union(r.box for r in rows)
    ruled = _ruled(box, rules, page)
    if len(rows) < (2 if ruled else 3):
        return None
    columns = _columns(rows)
    if columns is None or len(columns) < 2:
        return None
    grid: list[list[list[Token]]] = [[[] for _ in columns] for _ in rows]
    for r, row in enumerate(rows):
        for seg in row.segments + row.wrapped:
            for tok in seg.tokens:
                grid[r][_column_of(tok.box, columns)].append(tok)
    filled = sum(1 for row in grid for cell in row if cell)
    if filled < 0.6 * len(rows) * len(columns):
        return None
    if all(len(cell) == 1 and (marker_like(cell[0]) or len(columns) == 2 and
                               cell[0].box[2] - cell[0].box[0] <= page.em)
           for row in grid if (cell := row[0])):
        return None  # a list: its markers stand apart from the items' words
    if not ruled and (_prose_columns(grid, page) or _list_columns(grid)):
        return None
    cells = [[words_text(cell) for cell in row] for row in grid]
    right = [_right_aligned([row[c] for row in grid[1:] if row[c]])
             for c in range(len(columns))]
    taken = {s.line for row in rows for s in row.segments + row.wrapped}
    return Table(cells, box, right, *_doubtful(grid, cells)), taken


def _doubtful(grid: list[list[list[Token]]], cells: list[list[str]],
              ) -> tuple[list[tuple[int, int, Box, float]], list[bool]]:
    """The cells read with little confidence (for a second look), and which columns are
    of figures (by the cells read with confidence, if there are any)."""
    doubtful = [(r, c, union(t.box for t in cell), min(t.conf for t in cell))
                for r, row in enumerate(grid) for c, cell in enumerate(row)
                if cell and 0 <= min(t.conf for t in cell) < DOUBTFUL]
    unsure = {(r, c) for r, c, _, _ in doubtful}
    numeric = []
    for c in range(len(grid[0])):
        body = [r for r in range(1, len(cells)) if cells[r][c]]
        sure = [r for r in body if (r, c) not in unsure] or body
        numeric.append(sum(1 for r in sure if _FIGURE.fullmatch(cells[r][c])) >=
                       0.6 * max(1, len(sure)))
    return doubtful, numeric


def _ruled(box: Box, rules: list[Rule], page: Metrics) -> bool:
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


def _fits(row: _Row, columns: list[tuple[int, int]]) -> bool:
    """Whether the row's cells keep to the columns: none runs across the white between
    two of them, no two in one column (a list item, "1." and its words, standing right
    above a table; a line of text under it)."""
    gaps = [(a[1], b[0]) for a, b in zip(columns, columns[1:], strict=False)]
    places = [(seg.line, _column_of(seg.box, columns)) for seg in row.segments + row.wrapped]
    return len(set(places)) == len(places) and not any(
        seg.box[0] < left and seg.box[2] > right for seg in row.segments + row.wrapped
        for left, right in gaps)


def _wrapped(row: _Row, nxt: _Row, columns: list[tuple[int, int]], page: Metrics) -> bool:
    """Whether the next line holds the rest of cells that wrap: right under the row (no
    more than a line's gap), fewer cells than columns, each inside a column, and none
    in the first (a new row names itself there)."""
    if not nxt.segments or len(nxt.segments) >= len(columns):
        return False
    if nxt.box[1] - row.box[3] > 0.6 * page.em or nxt.box[1] <= row.box[1]:
        return False
    tol = 0.5 * page.em
    for seg in nxt.segments:
        c = _column_of(seg.box, columns)
        if c == 0 or seg.box[0] < columns[c][0] - tol or seg.box[2] > columns[c][1] + \
                max(tol, 0.5 * (columns[c][1] - columns[c][0])):
            return False
    return True


def _column_of(box: Box, columns: list[tuple[int, int]]) -> int:
    mid = (box[0] + box[2]) / 2
    best, dist = 0, float("inf")
    for c, (left, right) in enumerate(columns):
        d = 0.0 if left <= mid <= right else min(abs(mid - left), abs(mid - right))
        if d < dist:
            best, dist = c, d
    return best


def _prose_columns(grid: list[list[list[Token]]], page: Metrics) -> bool:
    """Columns of running text side by side rather than a table: in every column the
    lines are long, of several words each."""
    for c in range(len(grid[0])):
        cells = [row[c] for row in grid if row[c]]
        words = statistics.median(len(cell) for cell in cells)
        width = statistics.median(cell[-1].box[2] - cell[0].box[0] for cell in cells)
        if words < 6 and (words < 4 or width < 8 * page.em):
            return False
    return True


def _list_columns(grid: list[list[list[Token]]]) -> bool:
    """Lists side by side rather than a table (a slide's columns of items): a column
    whose cells mostly begin with a list's marker ("1.", "•") followed by words."""
    for c in range(len(grid[0])):
        cells = [row[c] for row in grid if row[c]]
        led = sum(1 for cell in cells if len(cell) >= 2 and _leads(cell[0]))
        if led >= 2 and led >= 0.6 * len(cells):
            return True
    return False


def _leads(t: Token) -> bool:
    return t.text in BULLETS or bool(NUMBER.fullmatch(t.text))


def _right_aligned(cells: list[list[Token]]) -> bool:
    if len(cells) < 2:
        return False
    lefts = [c[0].box[0] for c in cells]
    rights = [c[-1].box[2] for c in cells]
    return max(rights) - min(rights) < max(lefts) - min(lefts)


def words_text(tokens: Sequence[Token]) -> str:
    """Words of one line (or cell) as written: spaces where the page has them."""
    out = []
    for k, t in enumerate(tokens):
        if k and t.spaced:
            out.append(" ")
        out.append(t.text)
    return "".join(out)
