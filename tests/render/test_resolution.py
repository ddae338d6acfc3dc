"""The render resolution belongs to the engine, and a scanned page renders at about its
image's own resolution (ocrd/render/resolution.py) — with real PDFs, PDFium and tesseract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_pdf, recall, sentence_lines
from PIL import Image, ImageDraw, ImageFont

from ocrd.config.settings import RenderConfig
from ocrd.engines.base import Engine
from ocrd.engines.tesseract import TesseractEngine
from ocrd.render import pages, resolution

LINES = sentence_lines(5, 4)


def scan_pdf(path: Path, size_pt: tuple[float, float] = (144, 60),
             px: tuple[int, int] = (2400, 1000), lines: list[str] = LINES) -> Path:
    """A page holding one greyscale image of text (by default 2 × 0.83 in at 1200 dpi:
    OCRmyPDF's 2400dpi.pdf in small)."""
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    img = Image.new("L", px, 255)
    draw = ImageDraw.Draw(img)
    font = ImageFont.truetype("DejaVuSans.ttf", px[0] // 50)
    for i, line in enumerate(lines):
        draw.text((40, 40 + i * px[0] // 30), line, fill=0, font=font)
    c = canvas.Canvas(str(path), pagesize=size_pt)
    c.drawImage(ImageReader(img), 0, 0, *size_pt)
    c.showPage()
    c.save()
    return path


@pytest.mark.e2e
def test_small_page_with_a_high_resolution_scan_is_read_by_tesseract(tmp_path: Path) -> None:
    pdf = scan_pdf(tmp_path / "small.pdf")
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", str(pdf), "-o", "out"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "OCRD_CONFIG": ""})
    assert r.returncode == 0, r.stderr
    page = json.loads((tmp_path / "out" / "small.json").read_text())["pages"][0]
    # at the old fixed 144 dpi this page was 288 × 120 px and came out blank
    assert page["status"] == "ok" and page["dpi"] == 600 and page["width"] == 1200
    assert recall(LINES, (tmp_path / "out" / "small.md").read_text()) >= 0.8


def test_scan_renders_at_its_own_resolution_within_limits(tmp_path: Path) -> None:
    low = scan_pdf(tmp_path / "low.pdf", size_pt=(288, 120), px=(600, 250))  # 150 dpi
    mid = scan_pdf(tmp_path / "mid.pdf", size_pt=(288, 120), px=(1000, 417))  # 250 dpi
    text = make_pdf(tmp_path / "text.pdf", [LINES])
    res = resolution.Resolution(300, 200, 600)
    got = {}
    for pdf in (low, mid, text):
        info = pages.probe(str(pdf), 144, 10, 10**9, 10**9)
        got[pdf.name] = pages.render_page(str(pdf), info, 0, res, 10**9).dpi
    assert got["low.pdf"] == 200  # raised to the minimum
    assert abs(got["mid.pdf"] - 250) < 1  # its own
    assert got["text.pdf"] == 300  # born-digital: the engine's dpi
    # max_pixels still has the last word
    info = pages.probe(str(mid), 144, 10, 10**9, 10**9)
    small = pages.render_page(str(mid), info, 0, res, 100_000)
    assert small.width * small.height <= 100_000 and small.dpi < 200
    # a plain dpi keeps the old meaning: every page at that dpi
    assert pages.render_page(str(mid), info, 0, 144, 10**9).dpi == 144


def test_scan_dpi_is_none_for_born_digital_and_small_images(tmp_path: Path) -> None:
    import pypdfium2 as pdfium
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    c = canvas.Canvas(str(tmp_path / "logo.pdf"), pagesize=(600, 800))
    c.drawImage(ImageReader(Image.new("L", (400, 400), 0)), 10, 10, 200, 200)  # a logo
    c.drawString(50, 700, "Text beside a small image")
    c.showPage()
    c.save()
    doc = pdfium.PdfDocument(str(tmp_path / "logo.pdf"))
    assert resolution.scan_dpi(doc[0]) is None
    doc.close()
    doc = pdfium.PdfDocument(str(make_pdf(tmp_path / "t.pdf", [LINES])))
    assert resolution.scan_dpi(doc[0]) is None
    doc.close()
    doc = pdfium.PdfDocument(str(scan_pdf(tmp_path / "s.pdf")))
    assert abs(resolution.scan_dpi(doc[0]) - 1200) < 1
    doc.close()


def test_the_engine_chooses_the_resolution_unless_configured() -> None:
    def key(res: resolution.Resolution) -> tuple:
        return res.dpi, res.scan_min_dpi, res.scan_max_dpi, res.grey

    tess = TesseractEngine.__new__(TesseractEngine)
    # tesseract reads grey: it gets pages rendered grey (ocrd/render/modes.py)
    assert key(resolution.choose(RenderConfig(), tess)) == (300, 200, 600, True)
    # the DeepSeek engines keep the base class's choice
    assert key(resolution.choose(RenderConfig(), Engine)) == (144, 144, 200, False)
    cfg = RenderConfig(dpi=250, scan_min_dpi=100, scan_max_dpi=400)
    assert key(resolution.choose(cfg, tess)) == (250, 100, 400, True)
