"""Upside-down and sideways pages are turned before tesseract reads them, and the turn is
recorded per page in the sidecar — real PDFs made here, PDFium, tesseract with OSD."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import recall, sentence_lines
from PIL import Image

from ocrd.engines import orientation, tesseract_tsv
from ocrd.engines.tesseract import pnm
from ocrd.outputs.page import unturn

PAGES = [sentence_lines(60 + i, 14) for i in range(3)]


def turned_pdf(path: Path, angles: list[int]) -> Path:
    """One A4 page per angle, its text turned by that many degrees (counter-clockwise,
    as a scanner fed the sheet that way would show it)."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    w, h = A4
    c = canvas.Canvas(str(path), pagesize=A4)
    for lines, angle in zip(PAGES, angles, strict=True):
        c.translate(w / 2, h / 2)
        c.rotate(angle)
        c.setFont("Helvetica", 13)
        y = 200
        for line in lines:
            c.drawString(-250, y, line)
            y -= 22
        c.showPage()
    c.save()
    return path


def one_line_pages(folder: Path) -> dict[int, Path]:
    """A page with one short line near its top (a note, a label), lying at each angle
    (turned counter-clockwise, as a sheet fed into the scanner that way): OSD on the
    whole page has too little to judge it (it refuses, or is unsure)."""
    from PIL import ImageDraw, ImageFont

    page = Image.new("L", (2480, 3508), 255)
    ImageDraw.Draw(page).text((300, 300), LINE, fill=0,
                              font=ImageFont.truetype("DejaVuSans.ttf", 50))
    made = {}
    for angle in (0, 90, 180, 270):
        made[angle] = folder / f"line-{angle:03d}.png"
        (page.rotate(angle, expand=True) if angle else page).save(made[angle], dpi=(300, 300))
    return made


LINE = "Delivery note for the warehouse shipment 2024"


@pytest.mark.e2e
def test_a_page_of_one_line_is_turned_upright_whichever_way_it_lies(tmp_path: Path) -> None:
    """One line at 90° and 180° came out as upside-down garbage with `rotation: 0`
    (OSD's confidence 2.82 on the whole page, below the 5 asked for); at 270°
    tesseract read it as it lies, the page left sideways (rotation 0)."""
    (tmp_path / "in").mkdir()
    pages = one_line_pages(tmp_path / "in")
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", "in", "-o", "out"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "OCRD_CONFIG": ""})
    assert r.returncode == 0, r.stderr
    for angle, path in pages.items():
        side = json.loads((tmp_path / "out" / f"{path.stem}.json").read_text())
        assert side["pages"][0]["rotation"] == angle, (angle, side["pages"][0])
        md = (tmp_path / "out" / f"{path.stem}.md").read_text()
        assert recall([LINE], md) == 1.0, (angle, md)


def test_lines_read_top_to_bottom_are_a_page_lying_sideways() -> None:
    head = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\t" \
        "height\tconf\ttext\n"

    def tsv(*boxes: tuple[int, int]) -> str:
        return head + "".join(f"5\t1\t1\t1\t1\t{k}\t0\t{k * 99}\t{w}\t{h}\t95\tword{k}\n"
                              for k, (w, h) in enumerate(boxes))

    assert orientation.sideways(tsv((24, 90), (24, 120), (30, 80)))
    assert not orientation.sideways(tsv((90, 24), (120, 24), (80, 30)))
    assert not orientation.sideways(tsv((24, 90)))  # one word says nothing
    assert orientation.text_region(tsv((90, 24), (120, 24)), (1000, 1000)) == \
        (0, 0, 144, 147)


@pytest.mark.e2e
def test_turned_pages_are_read_upright_and_their_turn_recorded(tmp_path: Path) -> None:
    pdf = turned_pdf(tmp_path / "turned.pdf", [0, 180, 90])
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", str(pdf), "-o", "out"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "OCRD_CONFIG": ""})
    assert r.returncode == 0, r.stderr
    side = json.loads((tmp_path / "out" / "turned.json").read_text())
    # clockwise turns: 180 for the upside-down page; text turned 90° the other way is
    # read as it lies by tesseract (it finds vertical lines) or turned by 90
    assert [p["rotation"] for p in side["pages"]][:2] == [0, 180]
    assert side["pages"][2]["rotation"] in (0, 90)
    assert side["engine"]["orientation"] is True
    md = (tmp_path / "out" / "turned.md").read_text()
    pages = md.split("<!-- page ")[1:]
    for lines, text in zip(PAGES, pages, strict=True):
        assert recall(lines, text) >= 0.9, text[:300]


def test_osd_output_is_parsed_and_unsure_answers_ignored() -> None:
    out = (b"Page number: 0\nOrientation in degrees: 180\nRotate: 180\n"
           b"Orientation confidence: 32.56\nScript: Latin\nScript confidence: 4.17\n")
    assert orientation.parse(out, 5.0) == 180
    assert orientation.parse(out.replace(b"32.56", b"1.20"), 5.0) == 0
    assert orientation.parse(b"", 5.0) == 0


def test_pages_reach_tesseract_in_their_own_mode() -> None:
    one = Image.new("1", (10, 2), 1)
    one.putpixel((0, 0), 0)
    assert pnm(one) == b"P4\n10 2\n" + bytes([0b10000000, 0, 0, 0])  # 1 = black in PBM
    assert pnm(Image.new("L", (3, 1), 7)) == b"P5\n3 1\n255\n\x07\x07\x07"
    assert pnm(Image.new("RGBA", (1, 1), (1, 2, 3, 4))) == b"P6\n1 1\n255\n\x01\x02\x03"


def test_word_boxes_on_a_turned_page_land_on_the_page_as_given() -> None:
    """The searchable PDF lays words on the page as it is in the PDF: boxes tesseract
    found on the turned image are turned back."""
    width, height, x, y = 7, 4, 5, 1
    page = Image.new("L", (width, height), 255)
    page.putpixel((x, y), 0)
    for angle in (90, 180, 270):
        turned = orientation.turn(page, angle)
        tx, ty = next((i, j) for i in range(turned.width) for j in range(turned.height)
                      if turned.getpixel((i, j)) == 0)
        assert unturn((tx, ty, tx + 1, ty + 1), angle, (width, height)) == \
            (x, y, x + 1, y + 1), angle


def test_only_a_doubtful_reading_asks_for_the_orientation() -> None:
    head = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\t" \
        "height\tconf\ttext\n"

    def tsv(*confs: float) -> str:
        return head + "".join(f"5\t1\t1\t1\t1\t{k}\t0\t0\t5\t5\t{c}\tw{k}\n"
                              for k, c in enumerate(confs))

    assert tesseract_tsv.confidence(tsv(90, 96)) == 93
    assert not tesseract_tsv.doubtful(tsv(90, 96))  # read well: no OSD run
    assert tesseract_tsv.doubtful(tsv(30, 41))  # upside down reads like this
    assert not tesseract_tsv.doubtful(head)  # a blank page: nothing to turn
