"""tesseract's TSV output → the page's text and its words with their boxes.

The engine asks tesseract for TSV instead of plain text: one run gives both. The text is
rebuilt as tesseract's own text output lays it out (words of a line joined by spaces,
lines by a newline, paragraphs and blocks by a blank line).
"""

from __future__ import annotations

from .base import Word

_WORD_LEVEL = "5"
_COLUMNS = 12  # level page block par line word left top width height conf text
# Mean word confidence below which a page's reading is doubtful: an upside-down page
# reads as ~35, a good one 90-95 (OCRmyPDF's cardinal.pdf at 300 dpi).
DOUBTFUL_BELOW = 65.0


def parse(tsv: str) -> tuple[str, list[Word]]:
    words: list[Word] = []
    paragraphs: list[list[list[str]]] = []  # paragraph → lines → words
    last_par = last_line = None
    for row in tsv.splitlines()[1:]:
        cols = row.split("\t", _COLUMNS - 1)
        if len(cols) < _COLUMNS or cols[0] != _WORD_LEVEL:
            continue
        text = cols[11].strip()
        if not text:
            continue
        try:
            left, top, width, height = (int(v) for v in cols[6:10])
        except ValueError:
            continue
        par, line = (cols[2], cols[3]), (cols[2], cols[3], cols[4])
        if par != last_par:
            paragraphs.append([])
            last_par, last_line = par, None
        if line != last_line:
            paragraphs[-1].append([])
            last_line = line
        paragraphs[-1][-1].append(text)
        words.append(Word(text, (left, top, left + width, top + height)))
    text = "\n\n".join("\n".join(" ".join(line) for line in par) for par in paragraphs)
    return text, words


def confidence(tsv: str) -> float:
    """The mean confidence (0-100) of the page's words; 0 without words."""
    total = count = 0.0
    for row in tsv.splitlines()[1:]:
        cols = row.split("\t", _COLUMNS - 1)
        if len(cols) < _COLUMNS or cols[0] != _WORD_LEVEL or not cols[11].strip():
            continue
        try:
            conf = float(cols[10])
        except ValueError:
            continue
        if conf >= 0:
            total += conf
            count += 1
    return total / count if count else 0.0


def doubtful(tsv: str) -> bool:
    """Words were found, but with little confidence (a page upside down, say)."""
    conf = confidence(tsv)
    return 0 < conf < DOUBTFUL_BELOW
