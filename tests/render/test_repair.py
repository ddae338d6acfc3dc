"""Repair before failing, and no blank page that is not blank: a PDF that PDFium and
poppler cannot open is given to qpdf (pikepdf) once the file is known to be finished, and
what the repair recovers is converted, the sidecar saying so; a page that renders white
because its content is missing or its stream cannot be decoded is damaged (or, in a file
cut off, truncated), never blank. PDFs made here with reportlab, cut or broken; the real
`ocrd convert`, daemon, PDFium, qpdf and tesseract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pikepdf
import pytest
from helpers import Daemon, make_pdf, recall, sentence_lines, wait_for

from ocrd import errors
from ocrd.render import pages

PAGES = [sentence_lines(80 + i, 12) for i in range(4)]


def convert(tmp_path: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ocrd", "convert", *map(str, files), "-o",
                           "out"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "OCRD_CONFIG": ""})


def cut(whole: bytes, share: float, path: Path, end: bytes = b"") -> Path:
    path.write_bytes(whole[:int(len(whole) * share)] + end)
    return path


def bad_flate(path: Path, pages_: list[list[str]], broken: int) -> Path:
    """A PDF whose page `broken` has a content stream that does not inflate (its zlib
    header's check fails: poppler says "Bad FCHECK in flate stream", PDFium draws
    nothing)."""
    good = make_pdf(path.with_suffix(".good.pdf"), pages_)
    with pikepdf.open(good) as pdf:
        page = pdf.pages[broken]
        data = page.obj.Contents.read_bytes()
        import zlib
        raw = bytearray(zlib.compress(data))
        raw[1] ^= 0x01  # FCHECK: (CMF * 256 + FLG) % 31 != 0
        page.obj.Contents = pikepdf.Stream(pdf, b"")
        page.obj.Contents.write(bytes(raw), filter=pikepdf.Name.FlateDecode)
        pdf.save(path)
    return path


@pytest.mark.e2e
def test_a_pdf_cut_off_before_its_end_is_repaired_and_read(tmp_path: Path) -> None:
    """Cut after its last page's text, before its cross-reference table and trailer:
    PDFium and poppler cannot open it; it failed as `truncated`."""
    whole = make_pdf(tmp_path / "whole.pdf", PAGES).read_bytes()
    pdf = cut(whole, 0.92, tmp_path / "cut.pdf")
    r = convert(tmp_path, pdf)
    assert r.returncode == 0, r.stderr
    side = json.loads((tmp_path / "out" / "cut.json").read_text())
    assert side["repaired"] is True and side["status"] == "ok"
    (warning,) = side["warnings"]
    assert "qpdf repaired it" in warning and "cut off" in warning
    md = (tmp_path / "out" / "cut.md").read_text()
    for lines, text in zip(PAGES, md.split("<!-- page ")[1:], strict=True):
        assert recall(lines, text) >= 0.9, text[:300]


@pytest.mark.e2e
def test_pages_whose_content_was_cut_off_are_truncated_not_blank(tmp_path: Path) -> None:
    """Cut in the middle: qpdf finds every page, but the later pages' content is not in
    the file. They rendered white and passed as blank pages of a converted file."""
    whole = make_pdf(tmp_path / "whole.pdf", PAGES).read_bytes()
    pdf = cut(whole, 0.5, tmp_path / "half.pdf")
    r = convert(tmp_path, pdf)
    assert r.returncode == 0, r.stderr
    side = json.loads((tmp_path / "out" / "half.json").read_text())
    assert side["repaired"] is True and side["page_count"] == 4
    statuses = [p["status"] for p in side["pages"]]
    assert "blank" not in statuses, side["pages"]
    assert statuses[0] == "ok" and side["degraded_pages"], statuses
    for page in side["pages"]:
        if page["status"] == "degraded":
            assert "content is missing" in page["message"], page


@pytest.mark.e2e
def test_a_pdf_with_its_end_marker_but_no_cross_references_is_repaired(tmp_path: Path
                                                                        ) -> None:
    whole = make_pdf(tmp_path / "whole.pdf", PAGES).read_bytes()
    pdf = cut(whole, 0.92, tmp_path / "noxref.pdf", end=b"\n%%EOF\n")
    r = convert(tmp_path, pdf)
    assert r.returncode == 0, r.stderr  # was: FAILED [damaged]
    side = json.loads((tmp_path / "out" / "noxref.json").read_text())
    assert side["repaired"] is True and "cut off" not in side["warnings"][0]
    assert recall(PAGES[3], (tmp_path / "out" / "noxref.md").read_text()) >= 0.9


def test_a_pdf_without_its_end_is_repaired_only_once_it_is_finished(tmp_path: Path) -> None:
    """While a file may still be being written, its probe says truncated (readiness
    waits); the converter, which reads finished files only, repairs it."""
    whole = make_pdf(tmp_path / "whole.pdf", PAGES).read_bytes()
    pdf = str(cut(whole, 0.92, tmp_path / "cut.pdf"))
    with pytest.raises(errors.Truncated) as e:
        pages.probe(pdf, 144, 10, 10**9, 10**9)
    assert e.value.cut_short
    info = pages.probe(pdf, 144, 10, 10**9, 10**9, finished=True)
    assert info.repaired and info.pages == 4 and not info.complete
    # a file that qpdf cannot repair either is truncated, as before
    with pytest.raises(errors.Truncated):
        pages.probe(str(cut(whole, 0.2, tmp_path / "head.pdf")), 144, 10, 10**9, 10**9,
                    finished=True)


@pytest.mark.e2e
def test_the_daemon_repairs_a_cut_off_pdf_once_it_stops_changing(tmp_path: Path) -> None:
    """A file that looks cut short waits incomplete_seconds (its writer may only have
    paused); then it is claimed as it is, and the converter repairs it."""
    whole = make_pdf(tmp_path / "whole.pdf", PAGES).read_bytes()
    with Daemon(tmp_path / "d") as d:
        d.config["inboxes"][0].update(quiet_seconds=0.5, incomplete_seconds=3)
        d.start()
        (d.inbox / "cut.pdf").write_bytes(whole[:int(len(whole) * 0.92)])
        wait_for((d.outbox / "cut.json").exists, 120, "cut.json")
    side = json.loads((d.outbox / "cut.json").read_text())
    assert side["repaired"] is True and side["page_count"] == 4
    assert not (d.failed / "cut.pdf.error.json").exists()


@pytest.mark.e2e
def test_a_page_whose_stream_does_not_decode_is_damaged_not_blank(tmp_path: Path) -> None:
    two = bad_flate(tmp_path / "two.pdf", PAGES[:2], broken=0)
    one = bad_flate(tmp_path / "one.pdf", PAGES[:1], broken=0)
    r = convert(tmp_path, two, one)
    lines = r.stderr.splitlines()
    assert any("two.pdf: ok" in line for line in lines), r.stderr
    side = json.loads((tmp_path / "out" / "two.json").read_text())
    first, second = side["pages"]
    assert first["status"] == "degraded", first  # was: blank, and the file "ok"
    assert "cannot be decoded" in first["message"], first
    assert second["status"] == "ok"
    (bad,) = [line for line in lines if "one.pdf: " in line]
    assert "FAILED [damaged]" in bad and "cannot be decoded" in bad, bad
    assert r.returncode == errors.ExitCode.BAD_INPUT, r.stderr


@pytest.mark.e2e
def test_a_blank_page_is_still_blank(tmp_path: Path) -> None:
    """White pages whose streams decode are what they look like."""
    from reportlab.pdfgen import canvas

    path = tmp_path / "blank.pdf"
    c = canvas.Canvas(str(path), pageCompression=1)
    c.showPage()
    c.save()
    r = convert(tmp_path, path)
    assert r.returncode == 0, r.stderr
    side = json.loads((tmp_path / "out" / "blank.json").read_text())
    assert [p["status"] for p in side["pages"]] == ["blank"]



def test_what_a_page_uses_and_the_file_lacks_is_evidence_of_damage() -> None:
    """qpdf drops a reference to an object that is not in the file: a font, an image
    the page's content uses. In a PDF cut off, PDFium then draws a page with a rule and
    none of its text: the page is looked into when it comes out nearly white."""
    from bench.memory import pdf_bytes
    from ocrd.render import pdffaults

    def page(resources: bytes, content: bytes) -> bytes:
        return pdf_bytes([b"<< /Type /Catalog /Pages 2 0 R >>",
                          b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                          b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] "
                          b"/Resources " + resources + b" /Contents 4 0 R >>",
                          b"<< /Length %d >>\nstream\n" % len(content) + content +
                          b"\nendstream"])

    text = b"BT /F1 24 Tf 72 700 Td (Quarterly report) Tj ET"
    assert pdffaults.unreadable_content(page(b"<< /Font << /F1 9 0 R >> >>", text), 0) == \
        "its content uses a font that is not in the file"
    assert pdffaults.unreadable_content(page(b"<< /XObject << /Im0 9 0 R >> >>",
                                             b"q 100 0 0 100 0 0 cm /Im0 Do Q"), 0) == \
        "its content draws an image or form that is not in the file"
    assert pdffaults.unreadable_content(page(b"<< >>", b"0 0 m 10 10 l S"), 0) is None
    # nearly white: looked into only for a repaired PDF (a rule, a logo left drawn)
    rule = bytearray(b"\xff" * 100 * 100)
    rule[5000:5050] = b"\x00" * 50
    assert not pdffaults.looks_white("L", 100, 100, bytes(rule))
    assert pdffaults.looks_white("L", 100, 100, bytes(rule), repaired=True)
