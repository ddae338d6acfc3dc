"""tesseract's TSV output (with its text output after it) → the page as read: its lines
of words with boxes and confidences, in tesseract's blocks and paragraphs, and the ruling
lines it found; from that, the words of the searchable PDF's text layer.

The engine asks tesseract for TSV and text from one run. The TSV has the geometry; the
text says where tesseract found a space between two words — which only matters where
Chinese, Japanese or Korean is involved: the first two run on without spaces, and the
TSV lists each character or word of them apart; Korean has spaces between its words, but
the TSV may list a word's syllables apart ("국 회 입 법" for 국회입법).
"""

from __future__ import annotations

from ocrd.layout.reading import Line, Reading, Token
from ocrd.outputs import cjk
from ocrd.outputs.page import Word

_WORD_LEVEL = "5"
_COLUMNS = 12  # level page block par line word left top width height conf text
_HEADER = "level\tpage_num\t"
# Without tesseract's text, two Hangul words are one when the gap between them is below
# this share of their height (syllables of a word touch; words have a space between).
HANGUL_GAP = 0.2
# Mean word confidence below which a page's reading is doubtful: an upside-down page
# reads well below it, a good one well above (OCRmyPDF's cardinal.pdf at 300 dpi).
DOUBTFUL_BELOW = 65.0


def split(out: str) -> tuple[str, str]:
    """tesseract's output for `tsv txt` → (the TSV, the text): the TSV comes first, its
    rows all have 12 columns, and the text has no tabs."""
    lines = out.split("\n")
    start = next((k for k, ln in enumerate(lines) if ln.startswith(_HEADER)), None)
    if start is None:
        return "", out
    end = start + 1
    while end < len(lines) and lines[end].count("\t") >= _COLUMNS - 1:
        end += 1
    return "\n".join(lines[start:end]), "\n".join(lines[:start] + lines[end:])


def _rows(tsv: str, levels: tuple[str, ...] = (_WORD_LEVEL,)) -> list[list[str]]:
    rows = []
    for row in tsv.splitlines()[1:]:
        cols = row.split("\t", _COLUMNS - 1)
        if len(cols) == _COLUMNS and cols[0] in levels:
            rows.append(cols)
    return rows


def read(tsv: str, text: str = "") -> Reading:
    """The page as tesseract read it. `text`, its text output of the same run, gives the
    spaces between words (else: none between CJK characters, between Hangul where the
    boxes leave a space, one elsewhere)."""
    lines: list[Line] = []
    rules: list[tuple[int, int, int, int]] = []
    last = None
    page_width = 0
    for cols in _rows(tsv, levels=("1", _WORD_LEVEL)):
        if cols[0] == "1":  # the page
            page_width = _int(cols[8])
            continue
        try:
            left, top, width, height = (int(v) for v in cols[6:10])
            conf = float(cols[10])
        except ValueError:
            continue
        box = (left, top, left + width, top + height)
        word = cols[11].strip()
        if not word:
            rules.append(box)  # a ruling line: a "word" of no text
            continue
        key = (cols[2], cols[3], cols[4])
        if key != last:
            lines.append(Line([], _int(cols[2]), _int(cols[3])))
            last = key
        lines[-1].tokens.append(Token(word, box, conf))
    _space(lines, text)
    return Reading(lines, rules, page_width)


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


def _space(lines: list[Line], text: str) -> None:
    """Mark the words written without a space before them. tesseract's text lists the
    same words in the same order; where that stops holding (right-to-left lines are
    reordered there), the script's rule decides."""
    pos, aligned = 0, bool(text)
    for line in lines:
        for k, tok in enumerate(line.tokens):
            gap = False
            if aligned:
                start = pos
                while pos < len(text) and text[pos].isspace():
                    pos += 1
                gap = pos > start
                if text.startswith(tok.text, pos):
                    pos += len(tok.text)
                else:
                    aligned = False
            if k == 0:
                continue
            before = line.tokens[k - 1].text
            if not cjk.touches(before, tok.text):
                continue  # between words of other scripts, always the space
            spaced = gap if aligned else _spaced_by_rule(line.tokens[k - 1], tok)
            if not spaced:
                line.tokens[k] = Token(tok.text, tok.box, tok.conf, spaced=False)


def _spaced_by_rule(before: Token, tok: Token) -> bool:
    """Without tesseract's text: no space between CJK characters; between Hangul, a
    space where the boxes leave one."""
    if cjk.hangul_join(before.text, tok.text):
        height = max(before.box[3] - before.box[1], tok.box[3] - tok.box[1], 1)
        return tok.box[0] - before.box[2] >= HANGUL_GAP * height
    return not cjk.tight(before.text, tok.text)


def layer_words(reading: Reading) -> list[Word]:
    """The words for the text layer: each over its box, except that words written
    without a space between them (CJK) are one word over their joint box, so that a
    PDF reader finds the phrase."""
    words: list[Word] = []
    for k, line in enumerate(reading.lines):
        run: list[Token] = []
        for tok in line.tokens:
            if run and tok.spaced:
                words.append(_word(run, line.block, k))
                run = []
            run.append(tok)
        if run:
            words.append(_word(run, line.block, k))
    return words


def _word(run: list[Token], block: int, line: int) -> Word:
    text = "".join(t.text for t in run)
    boxes = [t.box for t in run]
    confs = [t.conf for t in run if t.conf >= 0]
    return Word(text, (min(b[0] for b in boxes), min(b[1] for b in boxes),
                       max(b[2] for b in boxes), max(b[3] for b in boxes)),
                min(confs) if confs else None, block, line)


def plain_text(reading: Reading) -> str:
    """The page's text as tesseract's text output lays it out: words of a line joined
    (by a space where the page has one), lines by a newline, paragraphs and blocks by a
    blank line."""
    paragraphs: list[list[str]] = []
    last = None
    for line in reading.lines:
        if (line.block, line.par) != last:
            paragraphs.append([])
            last = (line.block, line.par)
        paragraphs[-1].append("".join((" " if k and t.spaced else "") + t.text
                                      for k, t in enumerate(line.tokens)))
    return "\n\n".join("\n".join(par) for par in paragraphs)


def parse(tsv: str) -> tuple[str, list[Word]]:
    """The page's plain text and its words for the text layer, from the TSV alone."""
    reading = read(tsv)
    return plain_text(reading), layer_words(reading)


def band_texts(tsv: str, bands: list[tuple[int, int]]) -> list[tuple[str, float]]:
    """The words read within each band of rows (top, bottom) of an image, by where their
    middles lie, joined by spaces, and the lowest confidence among them ("" and 0 for a
    band with none)."""
    found: list[list[tuple[str, float]]] = [[] for _ in bands]
    for cols in _rows(tsv):
        word = cols[11].strip()
        try:
            middle = int(cols[7]) + int(cols[9]) / 2
            conf = float(cols[10])
        except ValueError:
            continue
        for k, (top, bottom) in enumerate(bands):
            if word and top <= middle < bottom:
                found[k].append((word, conf))
                break
    return [(" ".join(w for w, _ in words), min(c for _, c in words)) if words
            else ("", 0.0) for words in found]


def confidence(tsv: str) -> float:
    """The mean confidence (0-100) of the page's words; 0 without words."""
    total = count = 0.0
    for cols in _rows(tsv):
        if not cols[11].strip():
            continue
        try:
            conf = float(cols[10])
        except ValueError:
            continue
        if conf >= 0:
            total += conf
            count += 1
    return total / count if count else 0.0


# A word read with at least this confidence is read well.
READ_WELL = 80.0
# A reading with fewer words read well, or a lower mean confidence, is weak (a page's
# colour may tell more than its grey: ocrd.engines.tesseract reads it again in colour).
WEAK_WELL_WORDS = 20
WEAK_CONFIDENCE = 70.0


def word_boxes(tsv: str) -> list[tuple[int, int, int, int]]:
    """The box (left, top, right, bottom) of every word read, blank ones left out."""
    boxes = []
    for cols in _rows(tsv):
        if not cols[11].strip():
            continue
        try:
            left, top, width, height = (int(v) for v in cols[6:10])
        except ValueError:
            continue
        if width > 0 and height > 0:
            boxes.append((left, top, left + width, top + height))
    return boxes


def read_well(tsv: str) -> int:
    """How many words the page has that were read with READ_WELL confidence or more."""
    count = 0
    for cols in _rows(tsv):
        try:
            count += bool(cols[11].strip()) and float(cols[10]) >= READ_WELL
        except ValueError:
            continue
    return count


def weak(tsv: str) -> bool:
    """Few words read well, or little confidence in them."""
    return read_well(tsv) < WEAK_WELL_WORDS or confidence(tsv) < WEAK_CONFIDENCE


def doubtful(tsv: str) -> bool:
    """Words were found, but with little confidence (a page upside down, say)."""
    conf = confidence(tsv)
    return 0 < conf < DOUBTFUL_BELOW
