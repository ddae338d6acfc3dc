"""When tesseract's automatic page layout left the page's text unread: the ink outside
the words it found, on a page that has lines of text (engines/unread.py), with real
tesseract readings of drawn pages."""

from __future__ import annotations

import io
import subprocess

from helpers import sentence_lines, text_image
from PIL import Image

from ocrd.engines import tesseract_tsv, unread


def tsv_of(image: Image.Image, psm: int) -> str:
    buf = io.BytesIO()
    image.convert("L").save(buf, "PNG")
    out = subprocess.run(["tesseract", "stdin", "stdout", "-l", "eng", "--psm", str(psm),
                          "--dpi", "300", "tsv"], input=buf.getvalue(), capture_output=True,
                         check=True).stdout.decode()
    return out


def test_a_page_read_whole_leaves_no_ink_unread() -> None:
    page = text_image(sentence_lines(7, 10), (1400, 700))
    boxes = tesseract_tsv.word_boxes(tsv_of(page, 3))
    assert len(boxes) >= 60
    share = unread.unread_share(page, 300, boxes)
    assert share is not None and share < 0.1, share
    assert not unread.should_read_again(page, 300, boxes)


def test_text_left_unread_is_most_of_the_ink_and_asks_for_another_reading() -> None:
    page = text_image(sentence_lines(7, 10), (1400, 700))
    boxes = tesseract_tsv.word_boxes(tsv_of(page, 3))
    assert unread.unread_share(page, 300, []) == 1.0
    # the first three lines read, the rest not: more than half the ink left
    top_only = [b for b in boxes if b[3] < 40 + 3 * 48]
    assert 0.5 < (unread.unread_share(page, 300, top_only) or 0) < 0.9
    assert unread.should_read_again(page, 300, [])
    assert unread.should_read_again(page, 300, top_only)


def test_a_blank_page_asks_for_nothing() -> None:
    blank = Image.new("L", (1400, 700), 255)
    assert unread.unread_share(blank, 300, []) is None
    assert not unread.should_read_again(blank, 300, [])


def test_only_clearly_more_words_replace_the_first_reading() -> None:
    assert unread.better(0, 5) and unread.better(8, 18) and unread.better(100, 125)
    assert not unread.better(0, 4) and not unread.better(9, 7)
    assert not unread.better(3, 2) and not unread.better(100, 124)


def test_only_languages_whose_pages_the_layout_misses_are_checked() -> None:
    assert unread.applies("kor") and unread.applies("eng+kor") and unread.applies("kor_vert")
    assert not unread.applies("eng") and not unread.applies("jpn+chi_sim")
    assert not unread.applies("korx")
