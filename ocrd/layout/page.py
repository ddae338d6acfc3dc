"""The structure of an OCR'd page, as Markdown: paragraphs, lists, tables, headings and
columns, found in the geometry of its words (tesseract's blocks, paragraphs, lines and
word boxes) and written with the words exactly as they were read.

Lengths are measured in ems of the page's body text, so that a page scanned at any
resolution is read alike. When the geometry leaves a structure in doubt, the lines stay
as they are rather than becoming a wrong table or list.
"""

from __future__ import annotations

from ocrd.layout.blocks import Builder
from ocrd.layout.measure import ALNUM, Metrics, Rule, attach_markers
from ocrd.layout.reading import Box, Ink, Line, Look, Reading, Stroke, Token
from ocrd.layout.regions import column_edges, page_regions, reading_order, split_gutters
from ocrd.layout.tables import page_tables
from ocrd.layout.write import block_markdown


def to_markdown(reading: Reading, ink: Ink | None = None, look: Look | None = None,
                stroke: Stroke | None = None) -> str:
    """The page's Markdown: its blocks in reading order, a blank line between them.
    `ink` (where the page image is dark) finds list markers that were not read, and
    `look` reads them from the pixels, and table cells read with little confidence
    again; `stroke` tells bold lines (headings in the body's size) from the body."""
    lines = [line for line in reading.lines if line.tokens]
    if not lines:
        return ""
    turned = _upright(lines, reading.rules)
    if turned is not None:  # text read as it lies on its side: its own frame
        lines, rules_boxes = turned
        reading = Reading(lines, rules_boxes)
        ink = look = stroke = None
    page = Metrics.of(lines)
    lines = attach_markers(lines, page)
    rules = [r for box in reading.rules if (r := Rule.of(box, page.em)) is not None]
    tables, used = page_tables(lines, rules, page)
    if look is not None:
        for table in tables:
            table.read_again(look)
    lines, used = split_gutters(lines, used, page)
    regions = page_regions(lines, used, tables, page)
    ordered = reading_order(regions, page)
    column_edges(ordered, lines, reading.width)
    blocks = Builder(page, lines, ink, look, stroke).build(ordered)
    return "\n\n".join(md for b in blocks if (md := block_markdown(b, page)))


def _upright(lines: list[Line], rules: list[Box],
             ) -> tuple[list[Line], list[Box]] | None:
    """A page read with its lines running down or up (sideways text that tesseract reads
    as it lies) in the frame of its text, lines running left to right; None when the
    lines run across already."""
    tall = wide = down = 0
    for line in lines:
        for t in line.tokens:
            w, h = t.box[2] - t.box[0], t.box[3] - t.box[1]
            if len(t.text) >= 3 and ALNUM.search(t.text):
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
