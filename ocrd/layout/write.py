"""The blocks as Markdown: paragraphs, headings, lists and tables, the words escaped
exactly as they were read.
"""

from __future__ import annotations

import re

from ocrd.layout.blocks import Block, Item, TextLine, deliberate, hyphenated
from ocrd.layout.measure import Metrics
from ocrd.layout.tables import Table, words_text
from ocrd.outputs import cjk
from ocrd.outputs.markdown import escape_line


def block_markdown(block: Block, page: Metrics) -> str:
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


def _join(lines: list[TextLine], column: tuple[int, int], page: Metrics,
          hard: bool = True) -> str:
    """Lines as one text, joined as prose (hyphenation at line ends resolved); with
    `hard`, deliberate breaks come back as newlines."""
    parts: list[str] = []
    for k, line in enumerate(lines):
        text = words_text(line.tokens)
        if k:
            prev = lines[k - 1]
            if hard and deliberate(prev, line, column, page):
                parts.append("\n")
            elif hyphenated(parts[-1], text) and not _compound(parts[-1], text, page):
                parts[-1] = parts[-1][:-1]
            elif parts[-1].endswith(("-", "‐")) and text[:1].isalpha():
                pass  # a hyphen that belongs to the word: "Anglo-" + "Saxon"
            elif not cjk.tight(parts[-1], text):
                parts.append(" ")
        parts.append(text)
    return "".join(parts)


def _compound(before: str, after: str, page: Metrics) -> bool:
    """A word that the page writes with its hyphen elsewhere."""
    head = before.rsplit(" ", 1)[-1][:-1].lower()
    tail = after.split(" ", 1)[0].lower().strip(".,;:!?")
    return f"{head}-{tail}" in page.compounds


def _paragraph_markdown(lines: list[TextLine], column: tuple[int, int],
                        page: Metrics, indent: str) -> str:
    text = _join(lines, column, page)
    return f"\\\n{indent}".join(escape_line(part) for part in text.split("\n"))


def _list_markdown(block: Block, page: Metrics) -> str:
    out: list[str] = []
    _list_level(block.items, 0, "", block.column, page, out)
    return "\n".join(out)


def _list_level(items: list[Item], depth: int, indent: str, column: tuple[int, int],
                page: Metrics, out: list[str]) -> None:
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
            elif item.marker.kind == "box":  # a task list's item
                mark = "- [x] " if item.marker.checked else "- [ ] "
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


def _numbering(items: list[Item]) -> tuple[int, str] | None:
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
