"""Colour where it carries text: tesseract's engine reads pages grey (less memory and
time, and as many words on scans and born-digital pages: bench/colour.py), but a colour
photo — an image without a scanner's resolution — stays in colour, is read grey first
and, where that reading is weak, in colour too, the better reading kept. Text in a colour
about as bright as its background vanishes in grey (a sign's red on green); tesseract,
which thresholds each colour on its own, reads it. Real renderer, real tesseract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

from ocrd.render import pages
from ocrd.render.resolution import Resolution

LINES = ["Palais du LOUVRE", "Exit 250 metres"]


def luma(c: tuple[int, int, int]) -> float:
    return 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]


def sign(path: Path, dpi: float | None = None) -> Path:
    """Red letters on a green as bright as they are: one grey in grey."""
    red = (220, 40, 40)
    green = (0, round((luma(red) - 0.114 * 60) / 0.587), 60)
    img = Image.new("RGB", (900, 300), green)
    draw = ImageDraw.Draw(img)
    font = ImageFont.truetype("DejaVuSans-Bold.ttf", 56)
    for k, line in enumerate(LINES):
        draw.text((50, 60 + 100 * k), line, font=font, fill=red)
    img.save(path, **({"dpi": (dpi, dpi)} if dpi else {}))
    assert img.convert("L").getextrema()[1] - img.convert("L").getextrema()[0] <= 2
    return path


def rendered_mode(path: Path) -> str:
    info = pages.probe(str(path), 300, 10, 10**9, 10**9)
    return pages.render_page(str(path), info, 0, Resolution(300, 200, 600, grey=True),
                             10**9).mode


def test_a_colour_photo_stays_in_colour_for_an_engine_that_reads_grey(tmp_path: Path
                                                                      ) -> None:
    assert rendered_mode(sign(tmp_path / "photo.png")) == "RGB"
    # a scan (it states its resolution) and a picture without colour are read grey
    assert rendered_mode(sign(tmp_path / "scan.png", dpi=300)) == "L"
    grey = tmp_path / "grey.png"
    Image.open(tmp_path / "photo.png").convert("L").convert("RGB").save(grey)
    assert rendered_mode(grey) == "L"


@pytest.mark.e2e
def test_text_as_bright_as_its_background_is_read_from_the_colour(tmp_path: Path) -> None:
    """The sign was a blank page: grey, its letters are the background's grey."""
    photo = sign(tmp_path / "sign.png")
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", str(photo), "-o", "out"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "OCRD_CONFIG": ""})
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "out" / "sign.md").read_text()
    for line in LINES:
        assert line in md, md
    side = json.loads((tmp_path / "out" / "sign.json").read_text())
    assert side["pages"][0]["status"] == "ok"
