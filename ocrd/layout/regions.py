"""Regions and reading order: the engine's blocks cut around tables, read column by
column where the page has columns of text.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ocrd.layout.measure import ALIGN, ALNUM, GUTTER, HEADING, Metrics, line_em
from ocrd.layout.reading import Box, Line, union
from ocrd.layout.tables import Table, is_dirt


@dataclass
class Region:
    """Lines of one block of text (or one table) that are read together."""

    lines: list[int]  # indexes into the page's lines
    box: Box
    table: Table | None = None
    column: tuple[int, int] = (0, 0)  # left and right edge of its column of text
    heading: bool = False  # a line or two of large type: it goes with what follows


def page_regions(lines: list[Line], used: set[int], tables: list[Table],
             page: Metrics) -> list[Region]:
    """Tesseract's blocks without the lines that went into tables, cut where a table
    lies between their lines; and the tables."""
    out: list[Region] = []
    by_block: dict[int, list[int]] = {}
    for i, line in enumerate(lines):
        if i not in used and not is_noise(line, page):
            by_block.setdefault(line.block, []).append(i)
    for idxs in by_block.values():
        run: list[int] = []
        for i in idxs:
            if run and any(lines[run[-1]].box[3] <= t.box[1] and t.box[3] <= lines[i].box[1]
                           for t in tables):
                out.append(Region(run, union(lines[k].box for k in run)))
                run = []
            run.append(i)
        if run:
            out.append(Region(run, union(lines[k].box for k in run)))
    out.extend(Region([], t.box, t) for t in tables)
    for r in out:
        r.heading = 0 < len(r.lines) <= 2 and all(
            line_em(lines[i]) >= HEADING * page.em for i in r.lines)
    return out


_COLUMN_WORDS = 3  # words on either side of a gutter for a line to be cut there


def split_gutters(lines: list[Line], used: set[int], page: Metrics,
                  ) -> tuple[list[Line], set[int]]:
    """Lines that tesseract read across two columns of text, cut at the gutter: a gap
    wide as a gutter, open on lines that follow each other, the text right of it
    starting at the same place on each; on two of them at least, words enough on both
    sides for lines of text (a row of label and value, or of cells, keeps its order).
    The right-hand parts become a block of their own (the reading order then reads the
    columns one after the other). Returns the lines and the new indexes of `used`."""
    wide = max(GUTTER * page.em, 3 * page.space)
    tol = ALIGN * page.em
    # (line, gap's left, gap's right, the token after it, words enough on both sides)
    gaps: list[tuple[int, int, int, int, bool]] = []
    for i, line in enumerate(lines):
        if i in used:
            continue
        n = len(line.tokens)
        for k in range(1, n):
            a, b = line.tokens[k - 1].box, line.tokens[k].box
            if b[0] - a[2] >= wide:
                gaps.append((i, a[2], b[0], k, min(k, n - k) >= _COLUMN_WORDS))
    groups: list[list[tuple[int, int, int, int, bool]]] = []
    for g in sorted(gaps, key=lambda g: g[2]):  # by where the text right of it starts
        if groups and g[2] - groups[-1][0][2] <= tol:
            groups[-1].append(g)
        else:
            groups.append([g])
    cut: dict[int, int] = {}
    for group in groups:
        group.sort(key=lambda g: lines[g[0]].box[1])
        run = [group[0]]
        for g in [*group[1:], None]:
            if g is not None and lines[g[0]].box[1] - lines[run[-1][0]].box[1] <= \
                    3 * page.pitch:
                run.append(g)
                continue
            strong = {r[0] for r in run if r[4]}
            if len(strong) >= 2 and max(r[1] for r in run) < min(r[2] for r in run):
                for r in run:
                    cut.setdefault(r[0], r[3])
            if g is not None:
                run = [g]
    if not cut:
        return lines, used
    top = max(line.block for line in lines) + 1
    out: list[Line] = []
    moved: set[int] = set()
    for i, line in enumerate(lines):
        if i in used:
            moved.add(len(out))
        if i in cut:
            k = cut[i]
            out.append(Line(line.tokens[:k], line.block, line.par))
            out.append(Line(line.tokens[k:], top + line.block, line.par))
        else:
            out.append(line)
    return out, moved


def is_noise(line: Line, page: Metrics) -> bool:
    """A line of specks: no letter or digit read with any confidence, and no mark read
    with confidence either."""
    return not any(t.conf >= 30 if ALNUM.search(t.text) else not is_dirt(t, page)
                   for t in line.tokens)


def reading_order(regions: list[Region], page: Metrics) -> list[Region]:
    """Regions read column by column: recursive cuts through the white space between
    them, down the page first where a gutter runs through (a band of the page whose
    columns continue below keeps its gutter)."""
    out: list[Region] = []
    if regions:
        _order(regions, page, out, (min(r.box[0] for r in regions),
                                    max(r.box[2] for r in regions)))
    return out


def column_edges(regions: list[Region], lines: list[Line], width: int) -> None:
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


def _order(regions: list[Region], page: Metrics, out: list[Region],
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


def _with_column(regions: list[Region], column: tuple[int, int]) -> list[Region]:
    for r in regions:
        r.column = column
    return regions


def _split(regions: list[Region], axis: int, min_gap: float) -> list[list[Region]]:
    """Regions parted by clear strips across the whole set (axis 0: vertical strips,
    left to right; axis 1: horizontal ones, top to bottom)."""
    order = sorted(regions, key=lambda r: r.box[axis])
    parts: list[list[Region]] = [[order[0]]]
    reach = order[0].box[axis + 2]
    for r in order[1:]:
        if r.box[axis] - reach > min_gap:
            parts.append([r])
        else:
            parts[-1].append(r)
        reach = max(reach, r.box[axis + 2])
    return parts


def _merge_bands(bands: list[list[Region]], page: Metrics) -> list[list[Region]]:
    """Neighbouring bands joined while a gutter still runs through both, so that
    columns whose paragraphs happen to end on the same height stay columns; a band of
    headings alone goes with the band it heads."""
    gutter = GUTTER * page.em

    def joins(a: list[Region], b: list[Region]) -> bool:
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
