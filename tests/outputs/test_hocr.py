"""hOCR (outputs: hocr, `ocrd convert --hocr`): read by real hOCR consumers — OCRmyPDF's
parser (`ocrmypdf.hocrtransform.HocrParser`, what its hOCR renderer reads) and
hocr-tools' `hocr-check` (the spec's structure) — with tesseract's own words where
tesseract's own hOCR puts them, confidences included; safe whatever the engine wrote;
listed in the sidecar and offered by the console."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import Daemon, drop, make_pdf, sentence_lines, text_image, wait_for
from ocrmypdf.hocrtransform import HocrParser
from ocrmypdf.models.ocr_element import OcrClass

from ocrd.outputs.hocr import Hocr, page_hocr
from ocrd.outputs.page import PageOutput, Word
from ocrd.outputs.writers import Settings
from ocrd.render.pixels import RenderedPage

HOCR_CHECK = shutil.which("hocr-check", path=str(Path(sys.executable).parent))
NS = "{http://www.w3.org/1999/xhtml}"


def pages_of(hocr: Path, out: Path) -> list[Path]:
    """Each ocr_page of a document's hOCR as an hOCR file of its own (OCRmyPDF reads one
    page per file; hocr-check's overlap checks look at the whole file)."""
    tree = ET.parse(hocr)
    root = tree.getroot()
    body = root.find(f"{NS}body")
    assert body is not None
    files = []
    for k, page in enumerate(list(body)):
        for other in list(body):
            body.remove(other)
        body.append(page)
        path = out / f"page{k + 1}.hocr"
        tree.write(path, encoding="utf-8", xml_declaration=True)
        files.append(path)
        tree = ET.parse(hocr)
        root = tree.getroot()
        body = root.find(f"{NS}body")
    return files


def words_of(page: object) -> list[tuple[str, tuple[int, int, int, int], float | None]]:
    """OCRmyPDF's reading of a page: every word, its box and confidence."""
    out = []

    def walk(e: object) -> None:
        if e.ocr_class == OcrClass.WORD:  # type: ignore[attr-defined]
            b = e.bbox  # type: ignore[attr-defined]
            out.append((e.text, (int(b.left), int(b.top), int(b.right), int(b.bottom)),  # type: ignore[attr-defined]
                        e.confidence))  # type: ignore[attr-defined]
        for c in e.children:  # type: ignore[attr-defined]
            walk(c)
    walk(page)
    return out


def tesseract_own(image: Path) -> list[tuple[str, tuple[int, int, int, int]]]:
    """tesseract's own hOCR of the image: its words and boxes."""
    out = subprocess.run(["tesseract", str(image), "stdout", "--dpi", "300", "hocr"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    found = []
    for m in re.finditer(r"class='ocrx_word'[^>]*title='bbox (\d+) (\d+) (\d+) (\d+);[^>]*>"
                         r"([^<]+)<", out):
        found.append((m.group(5), tuple(int(m.group(i)) for i in range(1, 5))))
    return found  # type: ignore[return-value]


@pytest.mark.e2e
def test_ocrd_convert_hocr_is_read_by_ocrmypdf_and_hocr_tools_with_tesseracts_boxes(
        tmp_path: Path) -> None:
    image = tmp_path / "letter.png"
    lines = sentence_lines(3, 5)
    text_image(lines, (2480, 1200)).save(image, dpi=(300, 300))
    pdf = make_pdf(tmp_path / "two.pdf", [sentence_lines(1, 3), sentence_lines(2, 2)])
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", str(image), str(pdf), "-o",
                        str(tmp_path / "out"), "--hocr", "-q"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    hocr = tmp_path / "out" / "letter.hocr"
    meta = __import__("json").loads((tmp_path / "out" / "letter.json").read_text())
    assert meta["outputs"]["hocr"] == "letter.hocr" and meta["outputs"]["hocr_failed"] is None

    (page_file,) = pages_of(hocr, tmp_path)
    page = HocrParser(page_file).parse()
    assert page.bbox is not None and (page.bbox.right, page.bbox.bottom) == (2480, 1200)
    assert page.dpi == 300 and page.page_number == 0
    ours = words_of(page)
    assert " ".join(w for w, _, _ in ours).split() == " ".join(lines).split()
    assert all(c is not None and 0 <= c <= 1 for _, _, c in ours)  # x_wconf, read as 0..1
    # each word where tesseract's own hOCR of the same image puts it
    theirs = tesseract_own(image)
    assert [w for w, _ in theirs] == [w for w, _, _ in ours]
    for (word, box), (_, ours_box, _) in zip(theirs, ours, strict=True):
        assert max(abs(a - b) for a, b in zip(box, ours_box, strict=True)) <= 2, word

    if HOCR_CHECK is None:
        pytest.fail("hocr-check is needed (hocr-tools, in the test extras)")
    two = tmp_path / "out" / "two.hocr"
    for f in [page_file, *pages_of(two, tmp_path)]:
        check = subprocess.run([HOCR_CHECK, str(f)], capture_output=True, text=True,
                               timeout=60)
        assert check.returncode == 0 and "not ok" not in check.stdout, check.stdout
    pages = [HocrParser(f).parse() for f in pages_of(two, tmp_path)]
    assert [p.page_number for p in pages] == [0, 1]
    assert " ".join(w for p in pages for w, _, _ in words_of(p)).split() == \
        " ".join(sentence_lines(1, 3) + sentence_lines(2, 2)).split()


def rendered(w: int = 1000, h: int = 1400, dpi: float = 144.0) -> RenderedPage:
    return RenderedPage(0, w, h, b"", dpi)


def test_engine_text_never_becomes_markup() -> None:
    hostile = "<script>alert(1)</script> &amp; \x00\x07bell \ud800 \"quoted\" ]]> \ufffe"
    words = [Word(hostile, (10, 10, 200, 40), 87.5), Word("ok", (210, 10, 260, 40), None)]
    doc = page_hocr(1, PageOutput("", words=words), rendered(), grounding=False)
    wrapped = f'<html xmlns="http://www.w3.org/1999/xhtml"><body>{doc}</body></html>'
    root = ET.fromstring(wrapped)  # well-formed XML: no element came out of the text
    spans = root.findall(f".//{NS}span[@class='ocrx_word']")
    assert [s.text for s in spans] == [
        '<script>alert(1)</script> &amp; bell "quoted" ]]>', "ok"]
    assert not root.findall(f".//{NS}script")
    assert "x_wconf 88" in spans[0].get("title", "") and "x_wconf" not in spans[1].get("title")


def test_grounding_blocks_and_text_without_geometry_get_boxes_on_the_page() -> None:
    grounded = ("<|ref|>title<|/ref|><|det|>[[100, 50, 900, 100]]<|/det|>\n# Annual report\n\n"
                "<|ref|>image<|/ref|><|det|>[[100, 200, 600, 700]]<|/det|>\n\n"
                "<|ref|>text<|/ref|><|det|>[[100, 750, 900, 850]]<|/det|>\nFirst line\n"
                "second line here")
    doc = page_hocr(2, PageOutput(grounded), rendered(999, 999, 72), grounding=True)
    root = ET.fromstring(f'<html xmlns="http://www.w3.org/1999/xhtml"><body>{doc}'
                         "</body></html>")
    words = [(s.text, s.get("title")) for s in root.iter(f"{NS}span")
             if s.get("class") == "ocrx_word"]
    assert [w for w, _ in words] == ["#", "Annual", "report", "First", "line", "second",
                                     "line", "here"]
    for _, title in words:  # inside their block's box (the grid is the page: 999 px)
        left, top, right, bottom = map(int, re.match(r"bbox (\d+) (\d+) (\d+) (\d+)",
                                                     title).groups())
        assert 100 <= left < right <= 900 and (50 <= top < bottom <= 100 or
                                               750 <= top < bottom <= 850), title
    plain = page_hocr(1, PageOutput("Just text\nand more"), rendered(), grounding=False)
    assert plain.count('class="ocrx_word"') == 4 and "bbox 0 0 1000 1400" in plain


def test_a_page_without_an_image_keeps_its_place() -> None:
    import io

    writer = Hocr(Settings(), 2, "text")
    writer.page(1, PageOutput("Second page"), rendered())
    out = io.BytesIO()
    writer.fill(out, None)  # type: ignore[arg-type]
    root = ET.fromstring(out.getvalue())
    pages = root.findall(f".//{NS}div[@class='ocr_page']")
    assert [p.get("title") for p in pages][0] == "ppageno 0"
    assert pages[1].get("title", "").startswith("bbox 0 0 1000 1400; ppageno 1")


@pytest.mark.e2e
def test_the_daemon_writes_hocr_and_the_console_offers_it(tmp_path: Path) -> None:
    import json
    import urllib.request

    from helpers import free_port

    port = free_port()
    src = tmp_path / "note.png"
    text_image(sentence_lines(5, 3)).save(src, dpi=(200, 200))
    with Daemon(tmp_path / "d", web={"listen": f"127.0.0.1:{port}"}) as d:
        d.config["inboxes"][0]["outputs"] = ["markdown", "hocr"]
        d.start()
        drop(src, d.inbox / "note.png")
        wait_for((d.outbox / "note.md").exists, 120, "note.md")
        meta = json.loads((d.outbox / "note.json").read_text())
        job = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/files?limit=5", timeout=10).read())["files"][0]
        links = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/files/{job['id']}", timeout=10).read())["links"]
        got = urllib.request.urlopen(f"http://127.0.0.1:{port}{links['outputs']['hocr']}",
                                     timeout=10)
        body, ctype = got.read(), got.headers["Content-Type"]
        review = urllib.request.urlopen(f"http://127.0.0.1:{port}/files/{job['id']}",
                                        timeout=10).read().decode()
    assert meta["outputs"]["hocr"] == "note.hocr"
    assert body == (d.outbox / "note.hocr").read_bytes()
    assert ctype == "application/octet-stream"  # a download, never a page of the console
    assert f'href="/files/{job["id"]}/download/hocr"' in review and "hOCR (.hocr)" in review


def test_a_page_read_turned_has_its_grounding_boxes_on_the_page_as_given() -> None:
    """A page turned by hand before DeepSeek-OCR-2 read it (the console's "turn this
    page"): the model's boxes are on the turned image; hOCR and the PDF's text layer put
    them back on the page as it is in the file."""
    from ocrd.outputs.textlayer import grid_boxes

    grounded = ("<|ref|>text<|/ref|><|det|>[[100, 50, 900, 100]]<|/det|>\n"
                "A line across the turned page")
    # turned 90° clockwise to be read: on the page as given the line runs down its left
    assert grid_boxes([[100, 50, 900, 100]], 90) == [(50, 99, 100, 899)]
    assert grid_boxes([[100, 50, 900, 100]], None) == [[100, 50, 900, 100]]
    doc = page_hocr(1, PageOutput(grounded, rotation=90), rendered(999, 999, 72),
                    grounding=True)
    boxes = [tuple(map(int, m.groups())) for m in re.finditer(
        r'class="ocrx_word" id="[^"]+" title="bbox (\d+) (\d+) (\d+) (\d+)', doc)]
    assert boxes and all(b[0] >= 50 and b[2] <= 100 and b[1] >= 99 and b[3] <= 899
                         for b in boxes), boxes
