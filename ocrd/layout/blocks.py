"""Lines into blocks: paragraphs (hyphenation resolved, deliberate breaks kept), lists
(bullets, numbers, letters, nested), headings by size.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ocrd.layout.measure import (
    ALIGN,
    ALNUM,
    BOLD,
    BULLET_READINGS,
    BULLETS,
    DESCENDERS,
    HEADING,
    LETTER,
    MAX_HEADING_WORDS,
    NUMBER,
    PARAGRAPH_GAP,
    READABLE,
    ROMAN,
    ROUND_BULLETS,
    TICKED,
    TITLE,
    Metrics,
    line_em,
    token_em,
)
from ocrd.layout.reading import Box, Ink, Line, Look, Stroke, Token, union
from ocrd.layout.regions import Region, is_noise
from ocrd.layout.tables import Table
from ocrd.outputs import cjk


@dataclass
class _Marker:
    kind: str  # bullet, number, letter, roman, box (a check box), lost
    text: str  # as read, e.g. "3." or "b)"; "" for a bullet or a lost marker
    value: int  # the number or letter's place (1 for "1." or "a)"); 0 for bullets
    delim: str  # "." or ")"
    left: int  # where the marker starts
    text_left: int  # where the item's words start
    token: Token | None = None  # the marker as read (None: not read at all)
    box: Box | None = None  # where a marker that was not read shows in the pixels
    checked: bool = False  # a check box (kind "box") with a tick or a cross in it


@dataclass
class TextLine:
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
class Item:
    depth: int
    marker: _Marker
    lines: list[TextLine]


@dataclass
class Block:
    kind: str  # heading, paragraph, list, table
    lines: list[TextLine] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    level: int = 0
    table: Table | None = None
    column: tuple[int, int] = (0, 0)


class Builder:
    """Walks the lines in reading order and groups them into headings, paragraphs and
    lists; tables come whole."""

    def __init__(self, page: Metrics, lines: list[Line], ink: Ink | None,
                 look: Look | None = None, stroke: Stroke | None = None) -> None:
        self.page = page
        self._lines = lines
        self._ink = ink
        self._look = look
        self._stroke = stroke
        self._body: float | None = None  # the body text's stroke width, per em
        self._bolds: dict[int, bool] = {}  # lines (by id) found bold or not
        self.blocks: list[Block] = []
        # each of tesseract's paragraphs: its lines' type sizes
        self._pars: dict[tuple[int, int], list[float]] = {}
        for line in lines:
            self._pars.setdefault((line.block, line.par), []).append(line_em(line))
        self._words = [t.box for line in lines if not is_noise(line, page)
                       for t in line.tokens]  # read as words (not dirt)

    def build(self, regions: list[Region]) -> list[Block]:
        prev: TextLine | None = None
        for k, region in enumerate(regions):
            if region.table is not None:
                self.blocks.append(Block("table", table=region.table))
                prev = None
                continue
            for i in region.lines:
                line = self._text_line(region, k, i)
                self._add(prev, line, region.column)
                prev = line
        self._lost_first_items()
        self._single_unread_items()
        self._read_lost_markers()
        self._long_headings()
        _heading_levels(self.blocks, self.page)
        return self.blocks

    def _long_headings(self) -> None:
        """Large type over more than two lines is text set large, not a heading."""
        for k, block in enumerate(self.blocks):
            if block.kind == "heading" and len(block.lines) > 2:
                self.blocks[k] = Block("paragraph", block.lines, column=block.column)

    def _single_unread_items(self) -> None:
        """A "list" of one item whose marker was not read is a paragraph after a mark
        of dirt."""
        for k, block in enumerate(self.blocks):
            if block.kind == "list" and len(block.items) == 1 and \
                    block.items[0].marker.kind == "lost":
                self.blocks[k] = Block("paragraph", block.items[0].lines,
                                        column=block.column)

    def _read_lost_markers(self) -> None:
        """Markers that were not read as words (tesseract often takes a lone "3." for
        dirt) read again from their pixels, all of the page's in one second look (digits
        and letters only): numbers and letters keep the list's numbering; what still
        reads as nothing stays an item without its marker."""
        if self._look is None or self._ink is None:
            return
        lost: list[_Marker] = []
        for block in self.blocks:
            for item in block.items if block.kind == "list" else []:
                marker = item.marker
                if marker.kind == "lost" and marker.box is None:
                    line = item.lines[0]
                    em = self.page.em
                    mark = self._mark_left_of(line.left - round(0.25 * em),
                                              line.left - round(4 * em), line)
                    if mark is not None and self._marker_shaped(mark[0], mark[1], line):
                        marker.box = mark[0]
                # a number's or a letter's height: a dot or a dash needs no second look
                if marker.kind == "lost" and marker.box is not None and \
                        marker.box[3] - marker.box[1] >= 0.5 * self.page.em:
                    lost.append(marker)
        if not lost:
            return
        found = self._look([m.box for m in lost if m.box], MARKER_CHARS)
        for marker, (text, _) in zip(lost, found, strict=True):
            read = _marker_text(text)
            if read is not None:
                marker.kind, marker.text, marker.value, marker.delim = read
        for block in self.blocks:
            if block.kind == "list":
                _digits_read_as_letters(block)

    # -- reading one line ------------------------------------------------------------

    def _text_line(self, region: Region, k: int, i: int) -> TextLine:
        line = self._lines[i]
        tokens = list(line.tokens)
        marker = _marker(tokens, self.page)
        while marker is None and len(tokens) > 1 and _speck(tokens[0], self.page):
            tokens = tokens[1:]  # dirt before the line
            marker = _marker(tokens, self.page)
        # "1. Introduction" in large type is a heading; a bullet in large type an item
        heading = (marker is None or marker.kind != "bullet") and self._heading_sized(line)
        bold = not heading and marker is None and self._bold_heading(region, i)
        if heading:
            marker = None
        if marker is None and not heading and len(tokens) > 1 and len(tokens[0].text) <= 2 \
                and tokens[1].box[0] - tokens[0].box[2] >= 0.2 * self.page.em:
            ticked = self._check_box(tokens[0].box)  # a check box read as letters
            if ticked is not None:
                marker = _Marker("box", "", 0, "", tokens[0].box[0], tokens[1].box[0],
                                 tokens[0], box=tokens[0].box, checked=ticked)
        words = tokens[1:] if marker is not None else tokens
        words = [t for t in words if not _speck(t, self.page)] or words
        box = union(t.box for t in words)
        tl = TextLine(words, line, k, box[0], box[2], box[1], box[3], line_em(line),
                       marker, column=region.column)
        if heading:
            tl.heading = 1 if tl.em >= TITLE * self.page.em else 2
        elif tl.marker is None:
            tl.marker = self._unread_marker(tl, region.column)
        if bold and tl.marker is None:  # (an item beside a mark is no heading)
            tl.heading = 2
        if tl.marker is not None and tl.marker.kind == "box" and not readable(words):
            tl.marker = None  # an icon beside the labels of a screenshot
        return tl

    def _unread_marker(self, line: TextLine, column: tuple[int, int]) -> _Marker | None:
        """A mark in the white space before an indented line that no word was read
        from: a list marker tesseract took for dirt. Marks are looked for from the line's
        start leftwards, a few ems at most; dust is passed over."""
        em = self.page.em
        right = line.left - round(0.25 * em)
        # (hanging in the margin, too: a list of check boxes is its column of text)
        limit = max(column[0] - round(2.5 * em), line.left - round(4 * em), 0)
        if self._ink is None or right - limit < 0.5 * em or self._words_in(
                (limit, line.top, right, line.bottom)):
            return None
        x = right
        while x > limit:
            mark = self._mark_left_of(x, limit, line)
            if mark is None:
                return None
            box, count = mark
            # a check box may reach above and below the line's letters: all of it
            reach = round(0.5 * em)
            whole = self._ink((box[0], line.top - reach, box[2], line.bottom + reach))
            ticked = self._check_box(whole[0]) if whole is not None else None
            if ticked is not None:
                assert whole is not None
                return _Marker("box", "", 0, "", box[0], line.left, box=whole[0],
                               checked=ticked)
            if self._marker_shaped(box, count, line) and self._stands_alone(box, line):
                return _Marker("lost", "", 0, "", box[0], line.left, box=box)
            x = box[0] - 1
        return None

    def _mark_left_of(self, x: int, limit: int, line: TextLine,
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

    def _check_box(self, box: Box) -> bool | None:
        """Whether a mark is a check box — a square a half to one and a third ems wide,
        marked all along its four sides — and whether it is ticked (a tick or a cross
        inside it: a box filled whole is a white box on a tinted form, one filled nearly
        whole an icon); None: no check box."""
        if self._ink is None:
            return None
        em = self.page.em
        left, top, right, bottom = box
        w, h = right - left, bottom - top
        if h <= 0 or not (0.75 <= w / h <= 1.33 and 0.45 * em <= max(w, h) <= 1.35 * em):
            return None
        sx, sy = max(2, round(w * 0.15)), max(2, round(h * 0.15))
        for side in ((left, top, right, top + sy), (left, bottom - sy, right, bottom),
                     (left, top, left + sx, bottom), (right - sx, top, right, bottom)):
            found = self._ink(side)
            area = (side[2] - side[0]) * (side[3] - side[1])
            if found is None or found[1] < 0.45 * area:
                return None
        dx, dy = round(w * 0.25), round(h * 0.25)
        inner = (left + dx, top + dy, right - dx, bottom - dy)
        found = self._ink(inner)
        filled = found[1] / max(1, (inner[2] - inner[0]) * (inner[3] - inner[1])) \
            if found else 0.0
        if filled >= 0.95:  # a white box on a tinted form: ticked in dark strokes
            return self._stroke is not None and self._stroke(inner) is not None
        if filled < TICKED:
            return False
        return True if filled <= 0.6 else None  # a tick or a cross; a filled icon

    def _stands_alone(self, box: Box, line: TextLine) -> bool:
        """White above and below the mark: not the edge of a picture beside the text."""
        assert self._ink is not None
        reach = round(0.25 * self.page.em)
        around = self._ink((box[0], line.top - reach, box[2], line.bottom + reach))
        return around is not None and around[0][1] >= box[1] - 1 and \
            around[0][3] <= box[3] + 1

    def _marker_shaped(self, box: Box, count: int, line: TextLine) -> bool:
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
        """A heading: a short line of large words, in a paragraph of such lines, that
        reads as words (not dirt read as letters)."""
        sizes = [s for t in line.tokens if (s := token_em(t))]
        if not 0 < len(sizes) <= MAX_HEADING_WORDS:
            return False
        em = self.page.em
        return all(size >= HEADING * em for size in self._pars[(line.block, line.par)]) \
            and readable(line.tokens)

    def _bold_heading(self, region: Region, i: int) -> bool:
        """A heading in the body's size, set apart by its weight: a short line of words
        (a page number is none) whose strokes are BOLD times as thick as the body's (for
        their size), that starts where a paragraph may start, with no bold line right
        before or after it in its block (a paragraph set bold, a sidebar's lines)."""
        line = self._lines[i]
        if self._stroke is None or not self._short_words(line):
            return False
        at = region.lines.index(i)
        if at > 0:  # right under a line of its own paragraph that runs full: text
            before = self._lines[region.lines[at - 1]]
            if (before.block, before.par) == (line.block, line.par) and \
                    before.box[2] >= region.box[2] - 2 * self.page.em:
                return False
        if not self._bold(line):
            return False
        return not any(self._bold(other) for other in self._neighbours(line))

    def _neighbours(self, line: Line) -> list[Line]:
        """The lines right above and below a line (side by side with it, less than two
        lines' pitch away), whatever block tesseract put them in."""
        box, pitch = line.box, 2 * self.page.pitch
        out = []
        for other in self._lines:
            b = other.box
            if other is not line and b[0] < box[2] and box[0] < b[2] and (
                    0 <= box[1] - b[1] <= pitch or 0 < b[1] - box[1] <= pitch):
                out.append(other)
        return out

    def _short_words(self, line: Line) -> bool:
        words = [t for t in line.tokens if ALNUM.search(t.text)]
        return 0 < len(words) <= MAX_HEADING_WORDS and readable(line.tokens) and any(
            sum(c.isalpha() for c in t.text) >= 3 for t in words)

    def _bold(self, line: Line) -> bool:
        assert self._stroke is not None
        if id(line) not in self._bolds:
            body = self._body_stroke()
            words = [t for t in line.tokens if ALNUM.search(t.text)]
            weight = self._stroke(union(t.box for t in words)) if words else None
            self._bolds[id(line)] = body is not None and weight is not None and \
                weight / line_em(line) >= BOLD * body
        return self._bolds[id(line)]

    def _body_stroke(self) -> float | None:
        """The body text's stroke width for its size (the median of some of its lines
        of many words), once per page."""
        if self._body is None and self._stroke is not None:
            em = self.page.em
            body = [ln for ln in self._lines if len(ln.tokens) >= 6
                    and abs(line_em(ln) - em) <= 0.1 * em]
            step = max(1, len(body) // 7)  # a few spread over the page will do
            weights = [w / line_em(ln) for ln in body[::step]
                       if (w := self._stroke(ln.box)) is not None]
            self._body = statistics.median(weights) if weights else 0.0
        return self._body or None

    # -- grouping ----------------------------------------------------------------------

    def _add(self, prev: TextLine | None, line: TextLine, column: tuple[int, int]) -> None:
        cur = self.blocks[-1] if self.blocks else None
        if line.heading and self._runs_on(cur, prev, line, column):
            line.heading = 0  # a list item or paragraph set large goes on here
        if line.heading:
            if (cur is not None and cur.kind == "heading" and prev is not None
                    and prev.heading == line.heading and prev.region == line.region
                    and line.top - prev.bottom < 0.8 * line.em):
                cur.lines.append(line)
                return
            self.blocks.append(Block("heading", [line], level=line.heading, column=column))
            return
        if line.marker is not None and self._marker_runs_on(cur, prev, line, column):
            assert line.marker.token is not None
            line.tokens.insert(0, line.marker.token)
            line.left, line.marker = line.marker.left, None
        if line.marker is not None:
            depth = self._depth(cur, line.marker) if cur is not None and cur.kind == "list" \
                else None
            if cur is not None and depth is not None and not (
                    depth == 0 and _other_kind(cur, line.marker)):
                cur.items.append(Item(depth, line.marker, [line]))
            else:
                self.blocks.append(Block("list", items=[Item(0, line.marker, [line])],
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
                    cur.items.append(Item(depth, lost, [line]))
                return
        if (cur is not None and cur.kind == "paragraph" and prev is not None
                and self._same_paragraph(prev, line, column)):
            cur.lines.append(line)
            return
        self.blocks.append(Block("paragraph", [line], column=column))

    def _marker_runs_on(self, cur: Block | None, prev: TextLine | None,
                        line: TextLine, column: tuple[int, int]) -> bool:
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
                and not deliberate(prev, line, column, self.page))

    def _runs_on(self, cur: Block | None, prev: TextLine | None, line: TextLine,
                 column: tuple[int, int]) -> bool:
        """Whether a large line goes on with the text before it, in the same type size:
        right below, where that text's words start, after a line that was full."""
        if cur is None or prev is None or cur.kind not in ("list", "paragraph"):
            return False
        if abs(line.em - prev.em) > 0.12 * prev.em or deliberate(prev, line, column,
                                                                   self.page):
            return False
        left = cur.items[-1].marker.text_left if cur.kind == "list" else prev.left
        step = line.base - prev.base
        return abs(line.left - left) <= ALIGN * self.page.em and \
            0 < step <= self.page.pitch * line.em / self.page.em + PARAGRAPH_GAP * line.em

    def _depth(self, block: Block, marker: _Marker) -> int:
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

    def _continues_list(self, block: Block, prev: TextLine, line: TextLine,
                        column: tuple[int, int]) -> int | None:
        """-1: the line goes on with the list's last item; d >= 0: a new item of depth d
        whose marker was not read; None: the list has ended."""
        tol = ALIGN * self.page.em
        item = block.items[-1]
        if line.top - prev.bottom > 2.5 * self.page.em:
            return None
        if abs(line.left - item.marker.text_left) <= tol and not deliberate(
                prev, line, column, self.page):
            return -1
        for it in reversed(block.items):
            if abs(line.left - it.marker.text_left) <= tol and it.marker.kind != "lost" \
                    and it.marker.left < line.left - tol:
                return it.depth
        return None

    def _same_paragraph(self, prev: TextLine, line: TextLine,
                        column: tuple[int, int]) -> bool:
        em = self.page.em
        if prev.column != line.column and line.left > prev.right:
            # the next column: a sentence that goes on there, lowercase, from a full line
            return (line.tokens[0].text[:1].islower()
                    and abs(line.left - line.column[0]) <= ALIGN * em
                    and not deliberate(prev, line, prev.column, self.page))
        step = line.base - prev.base
        if step <= 0 or step > self.page.pitch + PARAGRAPH_GAP * em:
            return False  # space above the line: a new paragraph
        indent = line.left - prev.left
        if prev.region != line.region:
            # a block of tesseract's starts here; but the text runs on when the line
            # before is full and this one neither indented nor set apart
            return abs(indent) < ALIGN * em and not deliberate(prev, line, column,
                                                                 self.page)
        if prev.line.par != line.line.par:
            # tesseract makes a paragraph of every short line: lines of one line each,
            # without space or indent between them, are lines of one (kept as lines)
            single = len(self._pars[(prev.line.block, prev.line.par)]) == 1
            return abs(indent) < ALIGN * em and (single or not deliberate(
                prev, line, column, self.page))
        # a first-line indent after a short line starts a paragraph
        return not (indent > 1.2 * em and deliberate(prev, line, column, self.page))

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
                if items and not deliberate(items[-1].lines[-1], ln, before.column,
                                             self.page):
                    items[-1].lines.append(ln)
                else:
                    lost = _Marker("lost", "", 0, "", ln.left, ln.left)
                    items.append(Item(first.depth, lost, [ln]))
            block.items[:0] = items
            del self.blocks[k - 1]


def _other_kind(block: Block, marker: _Marker) -> bool:
    """Numbers right after bullets (or bullets after numbers) at a list's own depth, or
    a "1." after items whose markers were not read: a list of another kind begins."""
    if marker.kind == "lost":
        return False
    if _ordered(marker) and marker.value == 1 and any(it.depth == 0 for it in block.items):
        return True
    kinds = [_ordered(it.marker) for it in block.items if it.depth == 0
             and it.marker.kind != "lost"]
    return bool(kinds) and _ordered(marker) != kinds[-1]


def _ordered(marker: _Marker) -> bool:
    return marker.kind in ("number", "letter", "roman")


def _baseline(tokens: list[Token]) -> float:
    bottoms = [t.box[3] for t in tokens if ALNUM.search(t.text)
               and not any(c in DESCENDERS for c in t.text)]
    return statistics.median(bottoms or [t.box[3] for t in tokens])


def _heading_levels(blocks: list[Block], page: Metrics) -> None:
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


def _speck(t: Token, page: Metrics) -> bool:
    """Dust read as a mark: no letter or digit, smaller than lowercase letters and
    read with little confidence (a full stop or a CJK comma read well is text)."""
    return (not ALNUM.search(t.text) and not any(cjk.is_cjk(c) for c in t.text)
            and max(t.box[2] - t.box[0], t.box[3] - t.box[1]) < 0.4 * page.em
            and 0 <= t.conf < 60)


# what a list marker is written with: digits, letters and their delimiters
MARKER_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.)("
# letters that a digit alone is often read as
_DIGIT_LOOKALIKES = {"l": 1, "I": 1, "L": 1, "i": 1, "O": 0, "o": 0, "S": 5, "s": 5,
                     "Z": 2, "z": 2, "B": 8, "G": 6, "b": 6, "g": 9, "q": 9, "T": 7, "A": 4}


def _digits_read_as_letters(block: Block) -> None:
    """In a numbered list, a marker read as a letter that a digit is often taken for
    ("L." among "2.", "3.", "4."): the number that stands in its place."""
    for depth in {it.depth for it in block.items}:
        siblings = [it.marker for it in block.items if it.depth == depth]
        numbers = [(k, m.value) for k, m in enumerate(siblings) if m.kind == "number"]
        starts = {v - k for k, v in numbers}
        if len(numbers) < 2 or len(starts) != 1:
            continue
        start = starts.pop()
        for k, m in enumerate(siblings):
            letter = m.text.strip("(").rstrip(".)")
            if m.kind in ("letter", "roman") and _DIGIT_LOOKALIKES.get(letter) == \
                    (start + k) % 10:
                m.kind, m.value = "number", start + k
                m.text = m.text.replace(letter, str(start + k))


_VOWELS = frozenset("aeiouyäöüàâéèêëîïôûåøæœ")


def readable(tokens: list[Token]) -> bool:
    """Whether a line reads as words, not as dirt or marks read as letters: read with
    some confidence, and a word in it of letters that a word may be made of (a vowel
    among them, capitals only at its start or throughout; three letters at least), or a
    figure."""
    confs = [t.conf for t in tokens if t.conf >= 0]
    if confs and statistics.mean(confs) < READABLE:
        return False
    for t in tokens:
        word = t.text.strip(".,:;!?()[]\"'“”‘’")
        if any(c.isdigit() for c in word) and len(word) >= 2:
            return True
        if len(word) >= 3 and word.isalpha() and (word.isupper() or word[1:].islower()) \
                and (any(c.lower() in _VOWELS for c in word) or not word.isascii()):
            return True
    return False


def _marker_text(text: str) -> tuple[str, str, int, str] | None:
    """What a second look read where a marker stands, as a marker's (kind, text, value,
    delimiter): a number or a letter with its full stop or bracket; None for anything
    else (a bullet reads as nothing, or as a stray letter without a delimiter)."""
    text = "".join(text.split())
    if m := NUMBER.fullmatch(text):
        return "number", m[1], int(m[2]), m[3]
    if m := LETTER.fullmatch(text):
        return "letter", m[1], ord(m[2].lower()) - 96, m[3]
    if (m := ROMAN.fullmatch(text)) and m[2]:
        return "roman", m[1], 0, m[3]
    return None


def _marker(tokens: list[Token], page: Metrics) -> _Marker | None:
    """The list marker that starts a line, if there is one."""
    if len(tokens) < 2:
        return None
    first, second = tokens[0], tokens[1]
    text = first.text
    gap = second.box[0] - first.box[2]
    left, text_left = first.box[0], second.box[0]
    w, h = first.box[2] - first.box[0], first.box[3] - first.box[1]
    if text in ROUND_BULLETS and gap > 0 and max(w, h) >= 0.15 * page.em:
        return _Marker("bullet", "", 0, "", left, text_left, first)
    if not ALNUM.search(second.text) and not second.text.startswith(tuple("(\"'‘’“”«")):
        return None
    if text in BULLETS and gap > 0 and max(w, h) >= (0.2 if text in "-–—" else 0.15) * page.em:
        return _Marker("bullet", "", 0, "", left, text_left, first)
    if m := NUMBER.fullmatch(text):
        return _Marker("number", m[1], int(m[2]), m[3], left, text_left, first)
    if (m := LETTER.fullmatch(text)) and (m[3] == ")" or gap >= 0.5 * page.em):
        return _Marker("letter", m[1], ord(m[2].lower()) - 96, m[3], left, text_left, first)
    if (m := ROMAN.fullmatch(text)) and m[2]:
        return _Marker("roman", m[1], 0, m[3], left, text_left, first)
    if len(text) <= 2 and (sum(c.isalnum() for c in text) <= 1 or text in BULLET_READINGS) \
            and _bullet_shaped(first, tokens[1:], page):
        return _Marker("bullet", "", 0, "", left, text_left, first)
    return None


def _bullet_shaped(mark: Token, words: list[Token], page: Metrics) -> bool:
    """A bullet read as some small character: a solid dot smaller than the line's
    lowercase letters, at their middle, with more than a word space after it (not dust
    anywhere, not a one-letter word)."""
    if not any(ALNUM.search(t.text) for t in words):
        return False
    em = min(max(page.em, line_em(Line(words))), 1.6 * page.em)  # the line's type size
    w, h = mark.box[2] - mark.box[0], mark.box[3] - mark.box[1]
    gap = words[0].box[0] - mark.box[2]
    if not (0.15 * em <= min(w, h) and max(w, h) <= 0.47 * em and
            max(w, h) <= 2.2 * min(w, h) and gap >= 0.28 * em):
        return False
    baseline = _baseline(words[:4])  # near the mark: a skewed line climbs
    middle = (mark.box[1] + mark.box[3]) / 2
    return baseline - 0.75 * em <= middle <= baseline - 0.05 * em


def deliberate(prev: TextLine, line: TextLine, column: tuple[int, int],
                page: Metrics) -> bool:
    """Whether the page breaks `prev` on purpose: the next line's first word would
    have fitted at its end."""
    if not line.tokens:
        return True
    first = line.tokens[0]
    if prev.tokens and hyphenated(prev.tokens[-1].text, first.text):
        return False  # nobody breaks a word on purpose
    scale = max(1.0, prev.em / page.em)  # a word space in the line's own type size
    need = page.space * scale + (first.box[2] - first.box[0])
    # with room to spare: a typist returns the carriage before the margin
    slack = (2 * page.space + 0.3 * page.em) * scale
    return prev.right + need < column[1] - slack


def hyphenated(before: str, after: str) -> bool:
    """A word split at the line end: a letter, a hyphen, and lowercase going on."""
    return (len(before) >= 3 and before[-1] in "-‐\u00ad¬" and before[-2].isalpha()
            and after[:1].islower())
