"""Files that are not documents ocrd reads are named for what they are, with what to do
about them, never by Python's bytes repr: Office and OpenDocument packages (ZIPs laid out
as Word, Excel and LibreOffice write them), old Office files, web pages, text."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest
from daemon_process import ocrd_command, ocrd_env
from helpers import make_pdf, office_open_xml, sentence_lines

from ocrd.render import formats


def open_document(path: Path, mimetype: str) -> Path:
    """An OpenDocument package: `mimetype` stored first, uncompressed (the standard)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("mimetype"), mimetype, compress_type=zipfile.ZIP_STORED)
        z.writestr("content.xml", "<office:document-content/>" * 200)
    return path


def judged(path: Path) -> str:
    data = path.read_bytes()
    return formats.unsupported(data[:1024], data[-4096:])


@pytest.mark.parametrize(("name", "make", "expected"), [
    ("letter.docx", lambda p: office_open_xml(p, "word"),
     "a ZIP/Office document (.docx): save it as PDF first"),
    ("sheet.xlsx", lambda p: office_open_xml(p, "xl"),
     "a ZIP/Office spreadsheet (.xlsx): save it as PDF first"),
    ("slides.pptx", lambda p: office_open_xml(p, "ppt"),
     "a ZIP/Office presentation (.pptx): save it as PDF first"),
    ("notes.odt", lambda p: open_document(p, "application/vnd.oasis.opendocument.text"),
     "an OpenDocument text (.odt): save it as PDF first"),
    ("old.doc", lambda p: p.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(1000)),
     "an old Office document (.doc, .xls or .ppt): save it as PDF first"),
    ("page.html", lambda p: p.write_text("<!DOCTYPE html>\n<html><body>Hi</body></html>"),
     "a web page (HTML): print it to PDF first"),
    ("notes.txt", lambda p: p.write_text("Grüße,\nthe shopping list\n"),
     "a text file: it has no page to read"),
    ("photos.zip", lambda p: zipfile.ZipFile(p, "w").writestr("a.jpg", b"x") or p,
     "a ZIP archive: unpack it and drop what is inside"),
])
def test_a_file_no_renderer_takes_is_named_for_what_it_is(
        tmp_path: Path, name: str, make, expected: str) -> None:
    path = tmp_path / name
    make(path)
    text = judged(path)
    assert text.startswith(expected), text
    assert "b'" not in text and "\\x" not in text


def test_unknown_bytes_are_shown_as_hex_not_as_a_python_repr(tmp_path: Path) -> None:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes([0x4D, 0x5A, 0x90, 0x00, 0x03, 0x00, 0x00, 0x00]) + bytes(500))
    text = judged(blob)
    assert "its first bytes are 4d 5a 90 00 03 00 00 00 (hexadecimal)" in text
    assert text.startswith("not a PDF or a supported image (PNG, JPEG")


@pytest.mark.e2e
def test_convert_says_it_in_its_failure_line_and_exits_3(tmp_path: Path) -> None:
    """Through the real pipeline: ocrd convert's line for a .docx, beside a PDF that
    converts."""
    letter = office_open_xml(tmp_path / "letter.docx", "word")
    good = make_pdf(tmp_path / "good.pdf", [sentence_lines(3, 2)])
    r = subprocess.run([*ocrd_command(), "convert", str(letter), "-o", str(tmp_path / "out"),
                        "--engine", "tesseract"], capture_output=True, text=True, timeout=120,
                       env=ocrd_env())
    assert r.returncode == 3, r.stderr
    assert ("letter.docx: FAILED [unsupported_format] a ZIP/Office document (.docx): save "
            "it as PDF first") in r.stderr, r.stderr
    assert "b'PK" not in r.stderr
    assert good.exists()
