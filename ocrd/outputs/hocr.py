"""hOCR (outputs: hocr): every page's text with where it lies, in the format that
OCRmyPDF, archives' viewers and proofreading tools read — NAME.hocr, one XHTML file with
an `ocr_page` per page, each `ocrx_word` with its box and (where the engine gives one)
its confidence, in pixels of the page as rendered (`scan_res` says at what resolution;
`ppageno` which page of the original).

The geometry is the engine's, as for the searchable PDF's text layer (textlayer.py):
tesseract's words (in its blocks and lines), DeepSeek-OCR-2's grounding blocks (lines
stacked in each block's box, words spread over the line by their length), or — without
geometry — the page's lines over the page. Each page is made when it finishes and kept
compressed until the document is written. The text is the engine's, escaped: model
output never becomes markup.
"""

from __future__ import annotations

import html
import re
import unicodedata
import zlib
from collections.abc import Iterable, Sequence
from typing import Any, BinaryIO

from ocrd import __version__
from ocrd.outputs import markdown
from ocrd.outputs.page import PageOutput, Word
from ocrd.outputs.textlayer import block_text, grid_boxes
from ocrd.outputs.writers import Document, OutputSettings, Writer
from ocrd.render.pixels import RenderedPage

_GRID = 999  # DeepSeek-OCR-2's boxes are normalised to 0..999
# a page's text without geometry: lines at most this tall (of the page height), inside
_FALLBACK_LINE = 1 / 50
_FALLBACK_MARGIN = 0.02
# characters XML 1.0 does not allow (controls, surrogates, U+FFFE/FFFF)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")

HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"
    "http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">
<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">
 <head>
  <title></title>
  <meta http-equiv="Content-Type" content="text/html;charset=utf-8"/>
  <meta name="ocr-system" content="ocrd {version}"/>
  <meta name="ocr-number-of-pages" content="{pages}"/>
  <meta name="ocr-capabilities" content="ocr_page ocr_carea ocr_par ocr_line ocrx_word ocrp_wconf"/>
 </head>
 <body>
"""
TAIL = " </body>\n</html>\n"

Box = tuple[int, int, int, int]


def text(value: str) -> str:
    """Engine text as XML character data: what XML cannot hold dropped, the rest
    escaped, runs of white space one space."""
    value = _NOT_XML.sub("", value)
    value = "".join(ch for ch in value if unicodedata.category(ch) != "Cc" or ch in "\t\n")
    return html.escape(re.sub(r"\s+", " ", value).strip(), quote=True)


def _title(box: Box, **props: Any) -> str:
    extra = "".join(f"; {k} {v}" for k, v in props.items() if v is not None)
    return f"bbox {box[0]} {box[1]} {box[2]} {box[3]}{extra}"


def _union(boxes: Iterable[Box]) -> Box:
    ls, ts, rs, bs = zip(*boxes, strict=True)
    return min(ls), min(ts), max(rs), max(bs)


class _Page:
    """One page's hOCR, element by element (ids numbered per page)."""

    def __init__(self, number: int, width: int, height: int, dpi: float) -> None:
        self.n, self.width, self.height = number, width, height
        self.dpi = round(dpi) if dpi else None
        self.parts: list[str] = []
        self.counts = {"block": 0, "par": 0, "line": 0, "word": 0}

    def _id(self, kind: str) -> str:
        self.counts[kind] += 1
        return f"{kind}_{self.n}_{self.counts[kind]}"

    def clamp(self, box: Box) -> Box:
        left, top = max(0, min(box[0], self.width)), max(0, min(box[1], self.height))
        return (left, top, max(left, min(box[2], self.width)),
                max(top, min(box[3], self.height)))

    def block(self, lines: list[list[tuple[str, Box, int | None]]]) -> None:
        """A block of lines, each a list of (word, box, confidence)."""
        lines = [[(w, self.clamp(b), c) for w, b, c in line if text(w)] for line in lines]
        lines = [line for line in lines if line]
        if not lines:
            return
        box = _union(b for line in lines for _, b, _ in line)
        self.parts.append(f'   <div class="ocr_carea" id="{self._id("block")}" '
                          f'title="{_title(box)}">\n'
                          f'    <p class="ocr_par" id="{self._id("par")}" '
                          f'title="{_title(box)}">\n')
        for line in lines:
            lbox = _union(b for _, b, _ in line)
            self.parts.append(f'     <span class="ocr_line" id="{self._id("line")}" '
                              f'title="{_title(lbox, baseline="0 0", x_size=lbox[3] - lbox[1])}">')
            self.parts.append(" ".join(
                f'<span class="ocrx_word" id="{self._id("word")}" '
                f'title="{_title(b, x_wconf=c)}">{text(w)}</span>' for w, b, c in line))
            self.parts.append("</span>\n")
        self.parts.append("    </p>\n   </div>\n")

    def markup(self) -> str:
        res = f"; scan_res {self.dpi} {self.dpi}" if self.dpi else ""
        return (f'  <div class="ocr_page" id="page_{self.n}" title="bbox 0 0 {self.width} '
                f'{self.height}; ppageno {self.n - 1}{res}">\n' + "".join(self.parts)
                + "  </div>\n")


def _spread(line: str, box: Box) -> list[tuple[str, Box, None]]:
    """A line's words over its box, each as wide as its share of the characters."""
    words = line.split()
    total = sum(len(w) for w in words) + max(0, len(words) - 1)
    if not words or total == 0:
        return []
    left, top, right, bottom = box
    per = (right - left) / total
    out, x = [], float(left)
    for w in words:
        end = x + per * len(w)
        out.append((w, (round(x), top, max(round(x) + 1, round(end)), bottom), None))
        x = end + per
    return out


def _stacked(lines: Sequence[str], box: Box, max_height: float | None = None
             ) -> list[list[tuple[str, Box, None]]]:
    """Lines stacked top to bottom in box, each spread over the box's width in
    proportion to its length (the longest spans it)."""
    lines = [re.sub(r"\s+", " ", line).strip() for line in lines]
    lines = [line for line in lines if line]
    if not lines:
        return []
    left, top, right, bottom = box
    step = (bottom - top) / len(lines)
    if max_height is not None:
        step = min(step, max_height)
    longest = max(len(line) for line in lines)
    out = []
    for k, line in enumerate(lines):
        y0 = top + k * step
        x1 = left + (right - left) * len(line) / longest
        out.append(_spread(line, (left, round(y0), round(x1), round(y0 + step))))
    return out


def page_hocr(number: int, out: PageOutput, rendered: RenderedPage,
              grounding: bool) -> str:
    """One page's `ocr_page` from what the engine gave: its words, its grounding
    blocks, or its text over the page."""
    w, h = rendered.width, rendered.height
    page = _Page(number, w, h, rendered.dpi)
    loose: list[str] = []
    if out.words is not None:
        for block in _word_blocks(out.words):
            page.block(block)
    elif grounding:
        for label, boxes, content in markdown.text_blocks(out.text):
            if label == "image":
                continue
            lines = block_text(content)
            if not boxes:
                loose.extend(lines)
                continue
            gx0, gy0, gx1, gy1 = _union(tuple(round(v) for v in b)
                                        for b in grid_boxes(boxes, out.rotation))
            box = (round(gx0 * w / _GRID), round(gy0 * h / _GRID),
                   round(gx1 * w / _GRID), round(gy1 * h / _GRID))
            page.block(_stacked(lines, box))
    else:
        loose = out.text.splitlines()
    if loose:
        mx, my = round(w * _FALLBACK_MARGIN), round(h * _FALLBACK_MARGIN)
        page.block(_stacked(loose, (mx, my, w - mx, h - my), h * _FALLBACK_LINE))
    return page.markup()


def _word_blocks(words: Iterable[Word]) -> list[list[list[tuple[str, Box, int | None]]]]:
    """Words grouped into the engine's blocks and lines, in reading order."""
    blocks: dict[int, dict[int, list[tuple[str, Box, int | None]]]] = {}
    for word in words:
        conf = None if word.conf is None or word.conf < 0 else round(min(word.conf, 100))
        blocks.setdefault(word.block, {}).setdefault(word.line, []).append(
            (word.text, word.box, conf))
    return [list(lines.values()) for lines in blocks.values()]


class Hocr(Writer):
    name = "hocr"
    title = "the hOCR file"

    def __init__(self, settings: OutputSettings, pages: int, engine_format: str) -> None:
        super().__init__(settings, pages, engine_format)
        self.grounding = engine_format == "grounding"
        self.done: list[bytes | None] = [None] * pages  # zlib of each page's markup

    @property
    def suffix(self) -> str:
        return ".hocr"

    def page(self, index: int, out: PageOutput, rendered: RenderedPage) -> None:
        self.done[index] = zlib.compress(
            page_hocr(index + 1, out, rendered, self.grounding).encode("utf-8"), 6)

    def fill(self, out: BinaryIO, doc: Document) -> None:
        out.write(HEAD.format(version=__version__, pages=self.pages).encode("utf-8"))
        for k, page in enumerate(self.done):
            if page is None:  # no image to read: the page, without its size
                out.write(f'  <div class="ocr_page" id="page_{k + 1}" '
                          f'title="ppageno {k}"></div>\n'.encode())
            else:
                out.write(zlib.decompress(page))
        out.write(TAIL.encode("utf-8"))
