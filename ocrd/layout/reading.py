"""What an engine hands over to find a page's structure: its words (`Token`) in lines
(`Line`), the page as read (`Reading`), boxes in the page image's pixels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

Box = tuple[int, int, int, int]  # left, top, right, bottom: pixels of the page image
# Where the page image has dark pixels within a box: the box around them and how many
# there are (None without any). It shows list markers the engine did not read as words.
Ink = Callable[[Box], "tuple[Box, int] | None"]
# A second look at small parts of the page image (list markers the engine did not read
# as words, table cells it read with little confidence): what is written in each box,
# with only the characters given ("": any), and how confident the reading is (0-100;
# "" and 0 for nothing).
Look = Callable[[list[Box], str], list[tuple[str, float]]]
# How thick the strokes of the dark pixels within a box are, in pixels (None without
# any): bold type from regular.
Stroke = Callable[[Box], "float | None"]



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
        return union(t.box for t in self.tokens)


@dataclass
class Reading:
    """A page as read: its lines in the engine's order, the ruling lines it found (thin
    boxes without text: table grids, underlines) and the page's width in pixels."""

    lines: list[Line]
    rules: list[Box] = field(default_factory=list)
    width: int = 0  # 0: not known




def union(boxes: Iterable[Box]) -> Box:
    ls, ts, rs, bs = zip(*boxes, strict=True)
    return min(ls), min(ts), max(rs), max(bs)
