"""The README's quick start drops samples/scan_0042.pdf into the inbox: a small scanned
letter that comes with ocrd (made by scripts/sample_scan.py). It is what it says it is —
an image-only PDF at a scanner's resolution, a few tens of KB — and ocrd reads its words.
(tests/systemd/test_readme.py runs the README's blocks with it, as written.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pypdfium2 as pdfium
import pytest
from daemon_process import ocrd_command, ocrd_env

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "scan_0042.pdf"


def test_the_sample_is_a_small_scan_without_text() -> None:
    assert 5_000 < SAMPLE.stat().st_size < 64_000
    pdf = pdfium.PdfDocument(SAMPLE)
    assert len(pdf) == 1
    page = pdf[0]
    assert page.get_textpage().get_text_range() == ""  # only the image: OCR has work
    images = [o for o in page.get_objects() if o.type == pdfium.raw.FPDF_PAGEOBJ_IMAGE]
    assert len(images) == 1
    width_px = images[0].get_px_size()[0]
    assert round(width_px / (page.get_width() / 72)) == 300  # dpi


@pytest.mark.e2e
def test_ocrd_reads_the_sample(tmp_path: Path) -> None:
    res = subprocess.run([*ocrd_command(), "convert", str(SAMPLE), "-o", str(tmp_path), "-q"],
                         capture_output=True, text=True, timeout=300, env=ocrd_env())
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "scan_0042.md").read_text()
    for words in ("Northwind Office Supplies", "Invoice 2291", "Dear Ms Alvarez",
                  "payable within thirty days", "Kind regards"):
        assert words in text, text
