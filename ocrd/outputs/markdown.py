"""Turn one page of OCR output into Markdown: DeepSeek-OCR-2's grounding tag stream (with figure
crops) or tesseract's plain text. Never raises on model output, however cut or broken it is.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

from PIL import Image


@dataclass
class Figure:
    name: str  # file name inside the assets folder, e.g. "p0003-1.png"
    image: Image.Image
    box: tuple[int, int, int, int]  # pixel box (left, top, right, bottom) in the page image


@dataclass
class PageMarkdown:
    markdown: str  # the page's Markdown, no trailing page separator
    figures: list[Figure] = field(default_factory=list)
    malformed: bool = False  # the tag stream was cut or broken and had to be repaired


# The model normalises boxes to 0..999 whatever the page size.
_GRID = 999
# A little overshoot is rounding; far beyond the grid the box is noise, not a misplaced figure.
_ABSURD = 10 * _GRID
# Box lists longer than this are a loop inside the det tag; parsing them buys nothing.
_MAX_DET_CHARS = 4096

_TAG = re.compile(r"(<\|/?(?:ref|det)\|>|<\|grounding\|>)")
_GROUNDING_TAGS = ("<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "<|grounding|>")
# Tokenizer specials use fullwidth bars; the ASCII spelling is accepted too in case a
# server detokenizes differently.
_SPECIAL = re.compile(r"<｜[^｜<>\n]{0,40}｜>|<\|(?:[^|<>\n]{0,10}[▁_]of[▁_]sentence|▁?pad▁?)\|>")
_SPECIAL_CUT = re.compile(r"<｜[^｜<>\s]{0,40}$")
_LABEL = re.compile(r"[A-Za-z_ ]{1,32}")
_BLANK_RUNS = re.compile(r"\n{3,}")

_TABLE_TAG = re.compile(r"<(/?)(table|thead|tbody|tfoot|tr|td|th)\b([^<>]*)>", re.IGNORECASE)
_HTML_CUT = re.compile(r"</?[A-Za-z][^<>]*$")
# Opening one of these implicitly ends the listed open elements (HTML's table content model).
_IMPLIED_CLOSE: dict[str, frozenset[str]] = {
    "td": frozenset({"td", "th"}),
    "th": frozenset({"td", "th"}),
    "tr": frozenset({"td", "th", "tr"}),
    "thead": frozenset({"td", "th", "tr", "thead", "tbody", "tfoot"}),
    "tbody": frozenset({"td", "th", "tr", "thead", "tbody", "tfoot"}),
    "tfoot": frozenset({"td", "th", "tr", "thead", "tbody", "tfoot"}),
    "table": frozenset(),
}

# PNG can hold these modes as they are; anything else (CMYK, YCbCr, ...) goes to RGB.
_PNG_MODES = frozenset({"1", "L", "LA", "P", "RGB", "RGBA", "I", "I;16"})


@dataclass
class _Block:
    label: str | None  # None: text outside any ref/det block
    boxes: list[tuple[float, float, float, float]] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)

    @property
    def content(self) -> str:
        return "".join(self.parts)


def grounding_to_markdown(
    raw: str, page_image: Image.Image | Callable[[], Image.Image] | None, page_no: int,
    assets_link: str,
) -> PageMarkdown:
    """Convert one page of DeepSeek-OCR-2 output (special tokens kept) into Markdown.

    `image` blocks become crops of `page_image` named `p{page_no:04d}-{k}.png`, linked as
    `![](quote(assets_link)/NAME)`; all other tags are removed and their content kept.
    `page_image` may be a function that makes the image: called once, at the first figure
    (most pages have none, and the pipeline keeps pages packed until then).
    """
    if callable(page_image):
        make, made = page_image, []

        def image() -> Image.Image | None:
            if not made:
                made.append(make())
            return made[0]
    else:
        def image() -> Image.Image | None:
            return page_image  # type: ignore[return-value]

    text, malformed = _strip_special_tokens(raw)
    blocks, broken = _parse_blocks(text)
    malformed = malformed or broken

    # quoted as bytes: a folder name that is not UTF-8 becomes %XX escapes
    link_base = quote(os.fsencode(assets_link.rstrip("/"))) if assets_link else ""
    figures: list[Figure] = []
    parts: list[str] = []
    for block in blocks:
        content, repaired = _balance_tables(block.content.strip())
        malformed = malformed or repaired
        if block.label == "image":
            for box in block.boxes:
                figure = _crop(image(), box, page_no, len(figures) + 1)
                if figure is None:
                    continue
                figures.append(figure)
                target = f"{link_base}/{figure.name}" if link_base else figure.name
                parts.append(f"![]({target})")
        elif block.label in ("title", "sub_title") and content:
            content = _heading(content, "#" if block.label == "title" else "##")
        if content:
            parts.append(content)

    markdown = "\n\n".join(parts)
    markdown = markdown.replace("\\coloneqq", ":=").replace("\\eqqcolon", "=:")
    markdown, leftovers = _remove_leftover_tags(markdown)
    markdown = _tidy(markdown)
    return PageMarkdown(markdown=markdown, figures=figures, malformed=malformed or leftovers)


def text_blocks(raw: str) -> list[tuple[str | None, list[tuple[float, ...]], str]]:
    """The page's blocks as (label, boxes on the 0..999 grid, content as the model wrote
    it), for the searchable PDF's text layer; same parsing as grounding_to_markdown."""
    text, _ = _strip_special_tokens(raw)
    return [(b.label, list(b.boxes), b.content) for b in _parse_blocks(text)[0]]


def text_to_markdown(text: str) -> str:
    """Turn plain OCR text into Markdown that renders as the same plain text: each line
    through `escape_line`, the one escaping rule; blank lines between paragraphs kept."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n").replace("\v", "\n")
    lines = [escape_line(line) for line in text.split("\n")]
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip("\n")


def escape_line(text: str) -> str:
    """A line of the page's text as Markdown that renders as exactly that text: one
    physical line (a paragraph, a list item's or a heading's words, a table cell).

    Everywhere: the characters that open inline markup in CommonMark, GFM or the usual
    editors (backslash, backtick, `* _ [ ] | ~ $`), `<` before a tag, comment or
    autolink, and `&` before an entity. At the line's start: what Markdown would read
    as structure (headings, quotes, list markers, rules, setext underlines). Leading
    blanks are dropped (four of them would start a code block); the words themselves
    are not changed.
    """
    return _escape_line_start(_INLINE.sub(r"\\\g<0>", text.strip()))


def _strip_special_tokens(raw: str) -> tuple[str, bool]:
    text = _SPECIAL.sub("", raw)
    cut = _SPECIAL_CUT.search(text)
    if cut:
        text = text[: cut.start()]
    malformed = cut is not None
    # The stream can also end inside a ref/det tag ("<|re", "<|/de").
    for size in range(min(len(text), 12), 1, -1):
        tail = text[-size:]
        if any(tag.startswith(tail) and tag != tail for tag in _GROUNDING_TAGS):
            text = text[:-size]
            malformed = True
            break
    return text, malformed


def _parse_blocks(text: str) -> tuple[list[_Block], bool]:
    """Split the tag stream into blocks; the second value says whether it had to be repaired."""
    blocks: list[_Block] = []
    current = _Block(label=None)
    blocks.append(current)
    malformed = False
    inside = "content"  # where the parser is: content | label | after_ref | det
    buffer: list[str] = []

    def start_block(label: str | None) -> _Block:
        block = _Block(label=label)
        blocks.append(block)
        return block

    def end_label() -> str | None:
        """Close a label; text that cannot be a label is kept as loose text instead."""
        nonlocal current
        label = "".join(buffer).strip()
        buffer.clear()
        if _LABEL.fullmatch(label):
            return label.lower()
        if label:
            current = start_block(None)
            current.parts.append(label)
        return None

    for piece in _TAG.split(text):
        if not piece:
            continue
        is_tag = piece in _GROUNDING_TAGS
        if piece == "<|grounding|>":
            continue  # the prompt's mode switch, echoed; carries nothing

        if inside == "label":
            if not is_tag:
                buffer.append(piece)
                continue
            if piece == "<|/ref|>":
                current = start_block(end_label())
                inside = "after_ref"
                continue
            malformed = True
            if piece == "<|det|>":  # "<|/ref|>" went missing
                current = start_block(end_label())
                inside = "det"
            elif piece == "<|ref|>":  # the previous label never closed
                end_label()
            # a stray "<|/det|>" inside a label is dropped
            continue

        if inside == "det":
            if not is_tag:
                buffer.append(piece)
                continue
            if piece == "<|/det|>":
                boxes = _parse_boxes("".join(buffer))
                buffer.clear()
                if boxes is None:
                    malformed = True
                else:
                    current.boxes = boxes
                inside = "content"
                continue
            malformed = True
            buffer.clear()
            if piece == "<|/ref|>":
                continue
            inside = "content"  # the det never closed; handle this tag as a fresh start

        if inside == "after_ref":
            if not is_tag:
                if piece.strip():
                    malformed = True  # a block without a box: keep its text all the same
                    current.parts.append(piece)
                    inside = "content"
                continue
            if piece == "<|det|>":
                inside = "det"
                continue
            malformed = True
            inside = "content"

        # inside == "content"
        if not is_tag:
            current.parts.append(piece)
        elif piece == "<|ref|>":
            inside = "label"
        elif piece == "<|det|>":  # a box without a label
            malformed = True
            current = start_block(None)
            inside = "det"
        else:  # closing tag with nothing open
            malformed = True

    if inside != "content":
        # Cut inside a label or a box: what was collected there is a tag fragment, not text.
        malformed = True
        if inside == "label":
            end_label()
    return blocks, malformed


def _parse_boxes(det: str) -> list[tuple[float, float, float, float]] | None:
    """Read `[[x1, y1, x2, y2], ...]` safely; None when it is not a box list."""
    det = det.strip()
    if not det or len(det) > _MAX_DET_CHARS:
        return None
    try:
        value = json.loads(det)
    except (ValueError, RecursionError):
        try:
            value = ast.literal_eval(det)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    if isinstance(value, tuple | list) and len(value) == 4 and all(map(_is_number, value)):
        value = [value]  # a single flat box
    if not isinstance(value, tuple | list):
        return None
    boxes = [
        (float(b[0]), float(b[1]), float(b[2]), float(b[3]))
        for b in value
        if isinstance(b, tuple | list) and len(b) == 4 and all(map(_is_number, b))
    ]
    # One junk entry makes the whole list suspect: the caller flags the page either way.
    return boxes if boxes and len(boxes) == len(value) else None


def _is_number(value: object) -> bool:
    # The range check also rejects NaN and infinities, and never converts a huge int to float.
    return isinstance(value, int | float) and not isinstance(value, bool) and abs(value) <= _ABSURD


def _crop(
    page_image: Image.Image | None,
    box: tuple[float, float, float, float],
    page_no: int,
    index: int,
) -> Figure | None:
    if page_image is None:
        return None
    width, height = page_image.size
    x1, y1, x2, y2 = box
    left, right = sorted((x1, x2))
    top, bottom = sorted((y1, y2))
    pixels = (
        _scale(left, width),
        _scale(top, height),
        _scale(right, width),
        _scale(bottom, height),
    )
    if pixels[2] - pixels[0] < 1 or pixels[3] - pixels[1] < 1:
        return None
    try:
        image = page_image.crop(pixels)
        if image.mode not in _PNG_MODES:
            image = image.convert("RGB")
    except (OSError, ValueError):
        # A page image that cannot be read costs the figure, not the page.
        return None
    return Figure(name=f"p{page_no:04d}-{index}.png", image=image, box=pixels)


def _scale(coordinate: float, size: int) -> int:
    return min(max(round(coordinate * size / _GRID), 0), size)


def _heading(content: str, marks: str) -> str:
    if content.startswith("#"):
        return content
    # A Markdown heading is one line; the model sometimes wraps long titles.
    return f"{marks} {' '.join(content.split())}"


def _balance_tables(html: str) -> tuple[str, bool]:
    """Close table elements left open (a loop cut inside a table); drop stray closing tags."""
    if "<" not in html or not _TABLE_TAG.search(html):
        return html, False
    out: list[str] = []
    stack: list[str] = []
    repaired = False
    pos = 0
    for match in _TABLE_TAG.finditer(html):
        out.append(html[pos : match.start()])
        pos = match.end()
        name = match.group(2).lower()
        if match.group(1):  # closing tag
            if name not in stack:
                repaired = True
                continue
            while (top := stack.pop()) != name:
                out.append(f"</{top}>")
                repaired = True
        else:
            while stack and stack[-1] in _IMPLIED_CLOSE[name]:
                out.append(f"</{stack.pop()}>")
                repaired = True
            stack.append(name)
        out.append(match.group(0))
    tail = html[pos:]
    if stack:
        repaired = True
        cut = _HTML_CUT.search(tail)
        if cut:
            tail = tail[: cut.start()]
        out.append(tail)
        out.extend(f"</{name}>" for name in reversed(stack))
    else:
        out.append(tail)
    return "".join(out), repaired


def _remove_leftover_tags(text: str) -> tuple[str, bool]:
    """Remove tag text that only appeared once fragments around removed tags joined up."""
    original = text
    while True:
        before = text
        for tag in _GROUNDING_TAGS:
            text = text.replace(tag, "")
        text = text.replace("<｜", "")
        if text == before:
            return text, text != original


def _tidy(markdown: str) -> str:
    lines = [line.rstrip() for line in markdown.split("\n")]
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip("\n")


_INLINE = re.compile(r"[\\`*_\[\]|~$]|<(?=[A-Za-z/!?])|&(?=#?[A-Za-z0-9]+;)")
_NUMBERED = re.compile(r"(\d{1,9})([.)])(?=[ \t]|$)")
# what is left to read as structure at a line's start once _INLINE has escaped its marks
_STRUCTURE = re.compile(
    r"""
      [#>]                       # heading, block quote
    | [-+](?=[ \t]|$)            # bullet
    | [=-]+[ \t]*$               # setext underline
    | (?:-[ \t]*){3,}$           # thematic break
    """,
    re.VERBOSE,
)


def _escape_line_start(line: str) -> str:
    numbered = _NUMBERED.match(line)
    if numbered:
        return f"{numbered.group(1)}\\{line[numbered.end(1) :]}"
    if _STRUCTURE.match(line):
        return "\\" + line
    return line
