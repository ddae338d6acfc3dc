"""Text tesseract's automatic page layout left unread, and when to read the page again as
one column.

tesseract's automatic page segmentation (`--psm 3`) now and then finds no text where a
page plainly has lines of it, and reads nothing or a few stray glyphs; a page of Korean
print at the usual sizes meets it nearly every time (Latin, Chinese and Japanese print at
the same sizes read well). Read as a single column of text (`--psm 4`) the same page reads
whole. So after an automatic reading in a language of MISSED_BY_LAYOUT the page's ink is
compared with the words found: where most of it lies outside every word's box and that ink
lies in lines of text (render/deskew.py's estimate finds them in it), the page is read
again as one column, and the reading with clearly more words read well is kept.
"""

from __future__ import annotations

from collections.abc import Iterable

from PIL import Image, ImageDraw

from ocrd.render import deskew

AUTO_PSM = 3  # the automatic page segmentation this checks
# the language data whose pages the automatic layout is seen to miss (Hangul); for the
# others the check costs more than it finds: on a corpus of mostly Latin files it asks
# for another reading of barcodes, drawings and pictures and next to never keeps it
# (bench/corpus.py measures it)
MISSED_BY_LAYOUT = frozenset({"kor", "kor_vert", "script/Hangul", "script/Hangul_vert"})
COLUMN_PSM = 4  # one column of text of various sizes: what the page is read as again
# more of the page's ink than this outside every word's box: the reading may have
# missed text
UNREAD_SHARE = 0.5
# a reading with this many words read well or more is taken as it is: the layout found
# the page's text (what it left is a picture, a drawing, a barcode), and reading a page
# of text again costs as much as the first reading
ENOUGH_READ_WELL = 100
# a darker pixel of the reduced copy is ink
INK_BELOW = 192
# less ink than this share of the page: nothing to read (a blank page)
MIN_INK = 0.001
# a word box is widened by this many pixels of the reduced copy on each side (its ink
# blurs past the box when reduced)
PAD = 1


def applies(lang: str) -> bool:
    """Whether pages read in these languages (tesseract's `-l`, `eng+kor`) are checked."""
    return any(name in MISSED_BY_LAYOUT for name in lang.split("+"))


def unread_share(image: Image.Image, dpi: float,
                 boxes: Iterable[tuple[int, int, int, int]]) -> float | None:
    """The share of the page's ink that lies outside every word box (left, top, right,
    bottom, in the image's pixels); None for a page with next to no ink."""
    small, factor = _reduced(image, dpi)
    return _unread(small, factor, list(boxes))


def should_read_again(image: Image.Image, dpi: float,
                      boxes: Iterable[tuple[int, int, int, int]]) -> bool:
    """Whether an automatic reading whose words lie in `boxes` left text of the page
    unread: most of the ink outside them, and that ink in lines of text (a picture, a
    barcode or a drawing the reading rightly passed over is not)."""
    boxes = list(boxes)
    small, factor = _reduced(image, dpi)
    share = _unread(small, factor, boxes)
    if share is None or share <= UNREAD_SHARE:
        return False
    _paint(small, boxes, factor, 255)  # what was read: paper now
    return deskew.text_angle(small) is not None


def _reduced(image: Image.Image, dpi: float) -> tuple[Image.Image, int]:
    """A grey copy of the page at about deskew.ESTIMATE_DPI (a page of unknown resolution
    taken for 300 dpi), and the factor it was reduced by."""
    factor = max(1, round((dpi or 300) / deskew.ESTIMATE_DPI))
    grey = image if image.mode == "L" else image.convert("L")
    return (grey.reduce(factor) if factor > 1 else grey.copy()), factor


def _unread(small: Image.Image, factor: int,
            boxes: list[tuple[int, int, int, int]]) -> float | None:
    ink = small.point([255 if v < INK_BELOW else 0 for v in range(256)])
    total = ink.histogram()[255]
    if total < MIN_INK * small.width * small.height:
        return None
    _paint(ink, boxes, factor, 0)
    return ink.histogram()[255] / total


def _paint(small: Image.Image, boxes: list[tuple[int, int, int, int]], factor: int,
           fill: int) -> None:
    """The boxes (in the page's pixels), widened by PAD, painted over the reduced copy."""
    draw = ImageDraw.Draw(small)
    for left, top, right, bottom in boxes:
        draw.rectangle((left // factor - PAD, top // factor - PAD,
                        right // factor + PAD, bottom // factor + PAD), fill=fill)


def better(first: int, again: int) -> bool:
    """Whether the reading again (`again` words read well) beats the first (`first`):
    clearly more, not a few more (one column also reads what the layout rightly left
    out, such as a picture's specks)."""
    return again >= max(first * 5 // 4, first + 5)
