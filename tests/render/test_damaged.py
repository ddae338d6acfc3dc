"""Complete PDFs that cannot be read fail at once, as `damaged`, with one sentence; a
page that poppler renders as a speck is unreadable, while a page whose own size is a
speck is a blank page; `ocrd convert -c FILE` needs no `state_dir` — the real daemon
and command, PDFium and poppler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import Daemon, make_pdf, sentence_lines, wait_for

from bench.memory import pdf_bytes
from ocrd import errors
from ocrd.render import pages, pdffaults

# OCRmyPDF's tests/resources/invalid.pdf: a header, a sentence, the end marker
INVALID = b"%PDF-1.3\nThis is not a valid PDF file\n%%EOF\n"


def tiny_page_pdf() -> bytes:
    """A well-formed PDF whose one page is 0.1 pt square: both renderers make 1×1 px
    (tests/real_files/bug_1265.pdf is a real one of 1×1 pt)."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 0.1 0.1] /Contents 4 0 R >>",
            b"<< /Length 0 >>\nstream\n\nendstream"]
    return pdf_bytes(objs)


def test_a_complete_pdf_that_cannot_be_opened_is_damaged(tmp_path: Path) -> None:
    bad = tmp_path / "invalid.pdf"
    bad.write_bytes(INVALID)
    with pytest.raises(errors.Damaged) as e:
        pages.probe(str(bad), 144, 10, 10**9, 10**9)
    msg = str(e.value)
    assert e.value.reason == "damaged" and "\n" not in msg and len(msg) < 200
    assert msg.startswith("the PDF is damaged and cannot be read")
    assert "Syntax Error" not in msg


def test_renderer_messages_become_one_sentence() -> None:
    poppler = ("Unable to get page count.\nSyntax Error: Couldn't find trailer dictionary\n"
               "Syntax Error: Couldn't find trailer dictionary\n"
               "Syntax Error: Couldn't read xref table")
    assert str(pdffaults.pdf_error(poppler)) == (
        "the PDF is damaged and cannot be read (couldn't find trailer dictionary)")
    pdfium = "Failed to load document (PDFium: Data format error)."
    assert str(pdffaults.pdf_error(pdfium)) == (
        "the PDF is damaged and cannot be read (failed to load document: Data format error)")
    assert isinstance(pdffaults.pdf_error("Incorrect password error"), errors.Encrypted)


def test_a_speck_of_a_page_is_too_small_for_pdfium_and_unreadable_for_poppler(
        tmp_path: Path) -> None:
    """PDFium reads the page's own size: 0.1 pt is a page too small to hold text (blank,
    never "damaged"). poppler renders the pages of a PDF it cannot read as 1×1 pixels:
    from it, a speck says the page is unreadable."""
    pdf = tmp_path / "tiny.pdf"
    pdf.write_bytes(tiny_page_pdf())
    info = pages.probe(str(pdf), 144, 10, 10**9, 10**9)
    with pytest.raises(errors.PageTooSmall, match=r"page 1 is 0.1×0.1 pt, too small"):
        pages.render_page(str(pdf), info, 0, 144, 10**9, renderer="pypdfium2")
    with pytest.raises(errors.Damaged, match=r"page 1 came out as 1×1 pixels"):
        pages.render_page(str(pdf), info, 0, 144, 10**9, renderer="pdf2image")


@pytest.mark.e2e
def test_daemon_fails_damaged_files_at_once_and_keeps_a_speck_page_as_blank(
        tmp_path: Path) -> None:
    src = make_pdf(tmp_path / "good.pdf", [sentence_lines(30, 3)])
    d = Daemon(tmp_path / "d")
    # a file that looks incomplete would wait 10 minutes: these must not
    d.config["inboxes"][0]["incomplete_seconds"] = 600
    with d:
        d.start()
        (d.inbox / "invalid.pdf").write_bytes(INVALID)
        (d.inbox / "tiny.pdf").write_bytes(tiny_page_pdf())
        wait_for((d.failed / "invalid.pdf.error.json").exists, 60, "invalid.pdf in failed/")
        wait_for((d.outbox / "tiny.md").exists, 60, "tiny.md")
        (d.inbox / "good.pdf").write_bytes(src.read_bytes())
        wait_for((d.outbox / "good.md").exists, 60, "good.md")
    err = json.loads((d.failed / "invalid.pdf.error.json").read_text())
    assert err["reason"] == "damaged" and "damaged and cannot be read" in err["message"]
    assert "\n" not in err["message"]
    assert (d.failed / "invalid.pdf").exists()
    tiny = json.loads((d.outbox / "tiny.json").read_text())
    assert tiny["pages"][0]["status"] == "blank", tiny
    assert "too small to hold text" in tiny["pages"][0]["message"]
    assert not (d.failed / "tiny.pdf").exists()


@pytest.mark.e2e
def test_convert_with_a_config_file_needs_no_state_dir(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "a.pdf", [sentence_lines(31, 2)])
    cfg = tmp_path / "convert.yaml"
    cfg.write_text("engine: {kind: tesseract}\nrender: {dpi: 150}\n")
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", "-c", str(cfg), str(pdf),
                        "-o", "out"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env={**os.environ, "OCRD_CONFIG": ""})
    assert r.returncode == 0, r.stderr
    side = json.loads((tmp_path / "out" / "a.json").read_text())
    assert side["pages"][0]["dpi"] == 150  # the file's settings were used
    assert not (tmp_path / "journal.sqlite3").exists()
