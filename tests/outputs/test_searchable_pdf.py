"""The searchable PDF beside the Markdown (outputs: pdf, `ocrd convert --pdf`).

Real tesseract, poppler (pdftotext, pdfinfo), PDFium and qpdf (pikepdf) throughout; the
documents are made here. The DeepSeek-OCR-2 path runs the remote engine against the fake
`vllm serve` of tests/fake_vllm.py, which answers with grounding tags as the model does.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import io
import json
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import pikepdf
import pypdfium2 as pdfium
import pytest
from helpers import recall, sentence_lines, text_image, words
from PIL import Image, ImageChops, ImageOps

from ocrd.engines import tesseract_tsv

ROOT = Path(__file__).resolve().parents[2]
_BBOX = re.compile(r'<word xMin="([\d.]+)" yMin="([\d.]+)" xMax="([\d.]+)" yMax="([\d.]+)">'
                   r"(.*?)</word>")


# -- documents ----------------------------------------------------------------------------

VOCABULARY = ("harbour kitchen lantern meadow orchard pebble quartz ribbon saddle timber "
              "umbrella velvet walnut yellow zephyr anchor blossom candle dolphin eagle "
              "falcon garden hammer island jacket kettle ladder marble needle oyster "
              "parcel quiver rocket silver tunnel valley window basket cobalt desert "
              "engine forest glacier helmet insect jungle lemon mirror nickel object "
              "pepper rabbit spider tomato violin wizard bridge castle dragon feather").split()


def distinct_lines(seed: int, n: int) -> list[str]:
    """Lines of words that appear once each (up to 60 words), different per seed."""
    order = sorted(VOCABULARY, key=lambda w: hashlib.sha256(f"{seed}{w}".encode()).digest())
    return [" ".join(order[k * 6:k * 6 + 6]).capitalize() for k in range(n)]



def make_scan_pdf(path: Path, jpeg: Path) -> Path:
    """Two scanned pages: A4 with a crop box, a link and a Flate image of text; Letter
    turned by /Rotate 90 whose JPEG of text is drawn so that it reads upright. Distinct
    words, so that each can be found again."""
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    c = canvas.Canvas(str(path), pagesize=(595, 842))
    c.setTitle("Scan of two pages")
    c.setCropBox((20, 30, 575, 822))
    c.drawImage(ImageReader(text_image(distinct_lines(1, 10), (1400, 560))), 40, 500,
                515, 515 * 560 / 1400)
    c.linkURL("https://example.invalid/", (40, 400, 200, 420))
    c.showPage()
    c.setPageSize((612, 792))
    c.setCropBox((0, 0, 612, 792))  # (poppler's -cropbox misplaces rotated crops)
    c.setPageRotation(90)
    c.translate(612, 0)
    c.rotate(90)  # drawn a quarter turn left: the /Rotate 90 shows it upright
    c.drawImage(str(jpeg), 40, 300, 700, 280)
    c.showPage()
    c.save()
    return path


def make_photo(path: Path, lines: list[str], orientation: int = 6) -> Image.Image:
    """A JPEG stored sideways with EXIF orientation 6 and 200 dpi; returns it upright."""
    upright = text_image(lines, (1300, 520))
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # orientation 6 turns it back
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored.save(path, "JPEG", quality=92, dpi=(200, 200), exif=exif)
    return upright


# -- what poppler, PDFium and qpdf see ----------------------------------------------------


def poppler(*args: Any) -> str:
    r = subprocess.run(list(map(str, args)), capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == b"", f"{args[0]} warned: {r.stderr!r}"
    return r.stdout.decode("utf-8")


def bbox_words(pdf: Path, page: int) -> list[tuple[str, float, float, float, float]]:
    out = poppler("pdftotext", "-cropbox", "-bbox", "-f", page, "-l", page, pdf, "-")
    return [(html.unescape(m[4]), *map(float, m[:4])) for m in _BBOX.findall(out)]


def md_words(md: str) -> list[str]:
    """The words of ocrd's Markdown: without its page markers (HTML comments), tags and
    figure links, which a text layer does not carry."""
    return words(re.sub(r"<!--.*?-->|<[^>]+>|!\[\]\([^)]*\)", " ", md))


def tesseract_words(image: Image.Image) -> list[Any]:
    """What the engine saw: the same tesseract run as ocrd's, on the same page image."""
    buf = io.BytesIO()
    image.save(buf, "PNG")
    r = subprocess.run(["tesseract", "stdin", "stdout", "-l", "eng", "--psm", "3", "tsv"],
                       input=buf.getvalue(), capture_output=True, timeout=120,
                       env={"OMP_THREAD_LIMIT": "1", "PATH": "/usr/bin:/bin"})
    return tesseract_tsv.parse(r.stdout.decode())[1]


def assert_words_on_their_boxes(pdf: Path, page: int, image: Image.Image, dpi: float,
                                tolerance: float = 2.0) -> int:
    """Every word tesseract found once on the page lies where tesseract saw it: each
    edge of its pdftotext box within `tolerance` points. Returns how many were checked."""
    seen = tesseract_words(image)
    counts: dict[str, int] = {}
    for w in seen:
        counts[w.text] = counts.get(w.text, 0) + 1
    laid = {}
    for text, *box in bbox_words(pdf, page):
        laid.setdefault(text, []).append(box)
    checked = 0
    for w in seen:
        if counts[w.text] != 1 or len(w.text) < 4 or len(laid.get(w.text, [])) != 1:
            continue
        want = [v * 72 / dpi for v in w.box]
        got = laid[w.text][0]
        assert all(abs(a - b) <= tolerance for a, b in zip(got, want, strict=True)), \
            (w.text, got, want)
        checked += 1
    assert checked >= 10, f"only {checked} words could be compared"
    return checked


def laid_where_seen(seen: list[Any], made: Path,
                    on_scan: Any) -> tuple[int, int]:
    """(near, far): how many of the words tesseract `seen` on a 300-dpi page 2.5° askew
    (each seen once, of four letters or more, laid once) the text layer of page 1 of
    `made` lays where `on_scan(box)` puts them on the scan (the middles within 40 % of
    the word's height, or 2 pt)."""
    counts: dict[str, int] = {}
    for w in seen:
        counts[w.text] = counts.get(w.text, 0) + 1
    laid: dict[str, list[list[float]]] = {}
    for text, *box in bbox_words(made, 1):
        laid.setdefault(text, []).append(box)
    near = far = 0
    for w in seen:
        if counts[w.text] != 1 or len(w.text) < 4 or len(laid.get(w.text, [])) != 1:
            continue
        x0, y0, x1, y1 = (v * 72 / 300 for v in on_scan(w.box))
        g = laid[w.text][0]
        # tesseract's box holds the tilted word: taller than the word by its width's
        # rise; the word's own height is what is left of it
        height = (y1 - y0) - (x1 - x0) * 0.0437
        off = max(abs((g[0] + g[2]) / 2 - (x0 + x1) / 2), abs((g[1] + g[3]) / 2 - (y0 + y1) / 2))
        if off <= max(2.0, 0.4 * height):
            near += 1
        else:
            far += 1
    return near, far


def image_hashes(pdf: pikepdf.Pdf, index: int) -> list[str]:
    xobjects = pdf.pages[index].obj.get("/Resources", {}).get("/XObject", {})
    return sorted(hashlib.sha256(x.read_raw_bytes()).hexdigest()
                  for x in xobjects.values() if x.get("/Subtype") == "/Image")


def page_facts(pdf: pikepdf.Pdf, index: int) -> tuple:
    page = pdf.pages[index]
    return (list(page.mediabox), list(page.cropbox), int(page.obj.get("/Rotate", 0)),
            len(page.obj.get("/Annots", [])))


# -- tesseract: a scanned PDF and a photo, through `ocrd convert --pdf` -------------------


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("searchable")
    jpeg = tmp / "page2.jpg"
    text_image(distinct_lines(2, 10), (1400, 560)).save(jpeg, "JPEG", quality=90)
    scan = make_scan_pdf(tmp / "scan.pdf", jpeg)
    upright = make_photo(tmp / "photo.jpg", distinct_lines(3, 9))
    out = tmp / "out"
    out.mkdir()
    (out / "photo.pdf").write_bytes(b"a file ocrd did not write")
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", "--engine", "tesseract",
                        "--pdf", "-o", out, scan, tmp / "photo.jpg"],
                       capture_output=True, text=True, timeout=300, cwd=tmp)
    assert r.returncode == 0, r.stderr
    return {"tmp": tmp, "out": out, "scan": scan, "photo": tmp / "photo.jpg",
            "upright": upright}


def test_scanned_pdf_text_is_found_where_tesseract_saw_it(converted: dict) -> None:
    out = converted["out"]
    meta = json.loads((out / "scan.json").read_text())
    assert meta["outputs"]["pdf"] == "scan.pdf" and meta["outputs"]["pdf_failed"] is None
    assert [p["text_layer"] for p in meta["pages"]] == \
        [{"placement": "words", "layer": "added"}] * 2
    md = (out / "scan.md").read_text()
    text = poppler("pdftotext", out / "scan.pdf", "-")
    assert recall(md_words(md), text) >= 0.95
    doc = pdfium.PdfDocument(converted["scan"])
    for i in range(2):
        dpi = meta["pages"][i]["dpi"]  # the engine's choice (ocrd/render/resolution.py)
        image = doc[i].render(scale=dpi / 72, grayscale=True).to_pil()
        # (PDFium's helper rounds 3300.0000000000005 px up: a pixel more at most)
        assert abs(image.width - meta["pages"][i]["width"]) <= 1
        assert abs(image.height - meta["pages"][i]["height"]) <= 1
        assert_words_on_their_boxes(out / "scan.pdf", i + 1, image, dpi)


@pytest.mark.e2e
def test_a_page_scanned_askew_is_read_straight_its_words_laid_on_the_scan(
        tmp_path: Path) -> None:
    """A page that went into the scanner 2.5° askew: ocrd straightens it to read it (the
    sidecar says by how much), the PDF keeps the scan as it was, and every word of the
    text layer lies where the scan shows it: the middle of its pdftotext box on the
    middle of the box tesseract draws around the word on the scan as it lies."""
    from structure_pages import make_page, render

    scan = render(make_page("prose", 4), 300, skew=2.5)
    src = tmp_path / "askew.pdf"
    scan.save(src, "PDF", resolution=300)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", "--engine", "tesseract",
                        "--pdf", "-o", out, src], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "askew.json").read_text())
    assert abs(meta["pages"][0]["skew"] - 2.5) <= 0.11
    # the page as scanned (rendered again from its PDF: to a pixel), not the larger
    # straightened one
    assert abs(meta["pages"][0]["width"] - scan.width) <= 1
    assert abs(meta["pages"][0]["height"] - scan.height) <= 1
    made = out / "askew.pdf"
    assert image_hashes(pikepdf.open(made), 0) == image_hashes(pikepdf.open(src), 0)
    near, far = laid_where_seen(tesseract_words(scan), made, lambda box: box)
    assert near >= 40 and far <= near // 20, (near, far)
    # render.deskew: false reads the page as it lies
    config = tmp_path / "config.yaml"
    config.write_text("render:\n  deskew: false\n")
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", "--engine", "tesseract",
                        "-c", config, "-o", tmp_path / "as-is", src], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "as-is" / "askew.json").read_text())["pages"][0]["skew"] \
        is None


@pytest.mark.e2e
def test_a_page_upside_down_and_askew_turned_by_hand_has_its_words_on_the_scan(
        tmp_path: Path) -> None:
    """A page fed upside down and 2.5° askew, which a person said to read turned 180°
    (the console's "turn this page", kept in the journal by the document's content):
    ocrd straightens it, turns it, reads it upright, and lays every word of the text
    layer back on the scan as it lies (the scan itself untouched)."""
    from helpers import Daemon, drop, wait_for
    from structure_pages import make_page, render

    from ocrd.work.journal import Journal

    drawn = render(make_page("prose", 4), 300, skew=2.5)
    # cut to the text with a narrow margin: straightened, it needs a larger canvas
    ink = ImageOps.invert(drawn.convert("L")).point(lambda v: 255 if v > 64 else 0).getbbox()
    assert ink is not None
    upright = drawn.crop((ink[0] - 12, ink[1] - 12, ink[2] + 12, ink[3] + 12))
    scan = upright.rotate(180)
    src = tmp_path / "upside.pdf"
    scan.save(src, "PDF", resolution=300)
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    with Daemon(tmp_path / "d", engine={"kind": "tesseract",
                                        "tesseract": {"orientation": False}}) as d:
        d.config["inboxes"][0]["outputs"] = ["markdown", "pdf"]
        state = Path(d.config["state_dir"])
        state.mkdir(parents=True, exist_ok=True)
        journal = Journal(state / "journal.sqlite3")
        journal.set_turn(sha, 1, 180)
        journal.close()
        d.start()
        drop(src, d.inbox / "upside.pdf")
        wait_for((d.outbox / "upside.md").exists, 180, "upside.md")
        meta = json.loads((d.outbox / "upside.json").read_text())
        made = d.outbox / "upside.pdf"
        markdown = (d.outbox / "upside.md").read_text()
        page = meta["pages"][0]
        assert page["rotation"] == 180 and page["turned_by"] == "hand"
        assert abs(page["skew"] - 2.5) <= 0.11
        assert abs(page["width"] - scan.width) <= 1 and abs(page["height"] - scan.height) <= 1
        assert image_hashes(pikepdf.open(made), 0) == image_hashes(pikepdf.open(src), 0)
        # read upright: the words tesseract reads on the page turned upright are there
        seen = tesseract_words(upright)
        assert recall([w.text for w in seen], markdown) >= 0.9
        # where each word lies on the scan: its box on the upright page, turned 180°
        width, height = scan.size
        near, far = laid_where_seen(seen, made, lambda b: (width - b[2], height - b[3],
                                                           width - b[0], height - b[1]))
    assert near >= 40 and far <= near // 20, (near, far)


def test_sidecars_with_the_pdf_match_the_schema(converted: dict, tmp_path: Path) -> None:
    from helpers import make_pdf
    from record_schemas import valid, validator

    out = convert_remote(tmp_path, [make_pdf(tmp_path / "g.pdf", [[]])], GROUNDED)
    check = validator("sidecar.schema.json")
    for sidecar in (converted["out"] / "scan.json", converted["out"] / "photo-2.json",
                    out / "g.json"):
        meta = json.loads(sidecar.read_text())
        assert "text_layer" in meta["pages"][0] and "pdf_failed" in meta["outputs"]
        valid(check, meta)
    meta["pages"][0]["text_layer"]["layer"] = "sometimes"
    with pytest.raises(AssertionError):
        valid(check, meta)


def test_original_pages_images_and_metadata_are_kept(converted: dict) -> None:
    made = converted["out"] / "scan.pdf"
    with pikepdf.open(converted["scan"]) as before, pikepdf.open(made) as after:
        assert len(after.pages) == len(before.pages) == 2
        for i in range(2):
            assert page_facts(after, i) == page_facts(before, i)
            assert image_hashes(after, i) == image_hashes(before, i) != []
            # the page's own content streams are still there, byte for byte
            own = [s.read_raw_bytes() for s in _streams(before.pages[i])]
            mine = [s.read_raw_bytes() for s in _streams(after.pages[i])]
            assert own == mine[1:-1]
        assert str(after.docinfo["/Title"]) == "Scan of two pages"
        assert after.open_metadata().get("dc:title") == \
            before.open_metadata().get("dc:title")
    poppler("pdfinfo", made)
    text = pdfium.PdfDocument(made)[0].get_textpage().get_text_range()
    assert recall(distinct_lines(1, 10), text) >= 0.95


def _streams(page: pikepdf.Page) -> list[Any]:
    contents = page.obj.Contents
    return list(contents) if isinstance(contents, pikepdf.Array) else [contents]


def test_photo_becomes_a_page_at_its_resolution_jpeg_as_is(converted: dict) -> None:
    out, upright = converted["out"], converted["upright"]
    # a photo.pdf that ocrd did not write is left alone: the outputs take the next name
    assert (out / "photo.pdf").read_bytes() == b"a file ocrd did not write"
    meta = json.loads((out / "photo-2.json").read_text())
    assert meta["outputs"]["pdf"] == "photo-2.pdf"
    made = out / "photo-2.pdf"
    with pikepdf.open(made) as pdf:
        (page,) = pdf.pages
        assert [round(float(v), 2) for v in page.mediabox] == \
            [0, 0, round(1300 * 72 / 200, 2), round(520 * 72 / 200, 2)]
        images = [x for x in page.obj.Resources.XObject.values()
                  if x.get("/Subtype") == "/Image"]
        assert images[0].read_raw_bytes() == converted["photo"].read_bytes()
    shown = pdfium.PdfDocument(made)[0].render(scale=200 / 72).to_pil().convert("L")
    assert shown.size == upright.size
    diff = ImageChops.difference(shown, upright.convert("L"))
    assert sum(diff.histogram()[40:]) < 0.01 * shown.width * shown.height  # upright
    text = poppler("pdftotext", made, "-")
    assert recall(md_words((out / "photo-2.md").read_text()), text) >= 0.95
    assert_words_on_their_boxes(made, 1, upright, 200)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_is_shown_upright(tmp_path: Path, orientation: int) -> None:
    from ocrd.outputs import textpdf
    from ocrd.outputs.textlayer import FontMap, PageLayer

    stored = Image.new("RGB", (60, 40), "white")
    stored.paste((200, 0, 0), (0, 0, 20, 10))  # a corner and an edge tell every turn
    stored.paste((0, 0, 200), (40, 30, 60, 40))
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored.save(tmp_path / "o.jpg", "JPEG", quality=95, exif=exif)
    with open(tmp_path / "o.jpg", "rb") as src, open(tmp_path / "o.pdf", "wb") as out:
        textpdf.write_image_layers(src, out, [PageLayer("none", b"", 0)], FontMap())
    shown = pdfium.PdfDocument(tmp_path / "o.pdf")[0].render(scale=1).to_pil().convert("RGB")
    with Image.open(tmp_path / "o.jpg") as im:
        want = ImageOps.exif_transpose(im).convert("RGB")
    assert shown.size == want.size
    diff = ImageChops.difference(shown, want).convert("L")
    assert diff.getextrema()[1] < 80, orientation


# -- DeepSeek-OCR-2: grounding boxes through the remote engine -----------------------------

GROUNDED = (
    "<|ref|>title<|/ref|><|det|>[[100, 50, 700, 110]]<|/det|>\nQuarterly Report\n\n"
    "<|ref|>text<|/ref|><|det|>[[100, 200, 900, 400]]<|/det|>\n"
    "Revenue grew steadily\nacross every region\n\n"
    "<|ref|>image<|/ref|><|det|>[[100, 500, 500, 700]]<|/det|>\n\n"
    "<|ref|>table<|/ref|><|det|>[[100, 750, 900, 950]]<|/det|>\n"
    "<table><tr><td>Widgets</td><td>4200</td></tr><tr><td>Gadgets</td><td>17</td></tr>"
    "</table>")


def convert_remote(tmp: Path, files: list[Path], text: str,
                   pdf_text_layer: str = "skip_if_text", failing: tuple[str, ...] = ()) -> Path:
    """`ocrd convert --engine remote --pdf` in this process, against a fake vllm serve;
    `failing`: the reasons of the files expected to fail."""
    from fake_vllm import MODEL, FakeVllm

    from ocrd.cli import _convert
    from ocrd.config.load import parse_config
    from ocrd.pipeline.batch import jobs_for
    from ocrd.pipeline.progress import Progress

    out = tmp / "out"

    async def run() -> list:
        fake = await FakeVllm(latency=0.0, text=text).start()
        cfg = parse_config({"state_dir": str(tmp), "metrics": {"listen": None},
                            "engine": {"kind": "remote", "model": MODEL,
                                       "remote": {"urls": [fake.url]}}}, tmp)
        ns = Namespace(files=files, output=out, prompt="markdown", pdf=True,
                       pdf_text_layer=pdf_text_layer)
        jobs = jobs_for(files, out)
        try:
            outcomes = await _convert(cfg, ns, jobs, Progress(len(jobs), enabled=False))
        finally:
            await fake.stop()
        return [o.error.reason for o in outcomes if o.error is not None]

    assert asyncio.run(run()) == list(failing)
    return out


def _grid(box: tuple[float, float, float, float], w: float, h: float) -> list[float]:
    return [box[0] * w / 999, box[1] * h / 999, box[2] * w / 999, box[3] * h / 999]


def _inside(word: tuple, box: list[float], slack: float = 1.5) -> bool:
    _, x0, y0, x1, y1 = word
    return (x0 >= box[0] - slack and y0 >= box[1] - slack and x1 <= box[2] + slack
            and y1 <= box[3] + slack)


def test_grounding_boxes_place_each_block_line_by_line(tmp_path: Path) -> None:
    from helpers import make_pdf

    src = make_pdf(tmp_path / "report.pdf", [[]])  # a page without text; size A4
    out = convert_remote(tmp_path, [src], GROUNDED)
    meta = json.loads((out / "report.json").read_text())
    assert meta["pages"][0]["text_layer"] == {"placement": "blocks", "layer": "added"}
    laid = {w[0]: w for w in bbox_words(out / "report.pdf", 1)}
    w, h = 595.2756, 841.8898
    title, body, table = (_grid(b, w, h) for b in ((100, 50, 700, 110), (100, 200, 900, 400),
                                                   (100, 750, 900, 950)))
    assert _inside(laid["Quarterly"], title) and _inside(laid["Report"], title)
    for word in ("Revenue", "grew", "steadily", "across", "every", "region"):
        assert _inside(laid[word], body), word
    # two lines in the box: the first in its upper half, the second in its lower half
    middle = (body[1] + body[3]) / 2
    assert laid["Revenue"][4] <= middle + 0.5 and laid["across"][2] >= middle - 0.5
    for word in ("Widgets", "4200", "Gadgets", "17"):
        assert _inside(laid[word], table), word
    md = (out / "report.md").read_text()
    assert recall(md_words(md), poppler("pdftotext", out / "report.pdf", "-")) >= 0.95


def test_no_geometry_puts_the_text_over_the_page_and_says_so(tmp_path: Path) -> None:
    from helpers import make_pdf

    src = make_pdf(tmp_path / "plain.pdf", [[]])
    out = convert_remote(tmp_path, [src], "Plain words without any boxes\nsecond line")
    meta = json.loads((out / "plain.json").read_text())
    assert meta["pages"][0]["text_layer"] == {"placement": "page", "layer": "added"}
    text = poppler("pdftotext", out / "plain.pdf", "-")
    assert "Plain words without any boxes" in text and "second line" in text


def test_unicode_survives_search_and_copy(tmp_path: Path) -> None:
    """Accents, ligatures, CJK, right-to-left and characters beyond the BMP come back
    from poppler as the engine wrote them; from PDFium too, but for the characters
    beyond the BMP, which PDFium's text API drops (the ToUnicode map is the same)."""
    from helpers import make_pdf

    src = make_pdf(tmp_path / "u.pdf", [[]])
    lines = ["café naïve ﬁnance", "東京都の天気", "שלום עולם", "مرحبا بالعالم", "𝐀𝐁 😀"]
    grounded = "".join(f"<|ref|>text<|/ref|><|det|>[[100, {100 + 80 * k}, 900, "
                       f"{150 + 80 * k}]]<|/det|>\n{line}\n\n" for k, line in enumerate(lines))
    out = convert_remote(tmp_path, [src], grounded)
    text = poppler("pdftotext", out / "u.pdf", "-")
    flat = pdfium.PdfDocument(out / "u.pdf")[0].get_textpage().get_text_range()
    for line in lines:
        for word in line.split():
            assert word in text, (word, text)
            # PDFium writes the ﬁ ligature out as "fi"
            if all(ord(ch) <= 0xFFFF for ch in word):
                assert word.replace("ﬁ", "fi") in flat, (word, flat)


# -- pages that have text already ----------------------------------------------------------


def test_convert_into_the_pdfs_own_folder_writes_name_ocr_pdf(tmp_path: Path) -> None:
    from helpers import make_pdf

    (tmp_path / "out").mkdir()
    src = make_pdf(tmp_path / "out" / "doc.pdf", [[]])
    original = src.read_bytes()
    out = convert_remote(tmp_path, [src], "Beside the original")
    assert src.read_bytes() == original
    assert json.loads((out / "doc.json").read_text())["outputs"]["pdf"] == "doc.ocr.pdf"
    assert "Beside the original" in poppler("pdftotext", out / "doc.ocr.pdf", "-")


def test_text_pages_keep_their_text_unless_asked(tmp_path: Path) -> None:
    from helpers import make_pdf

    src = make_pdf(tmp_path / "born.pdf", [sentence_lines(4, 4)])
    lines = sentence_lines(4, 4)
    grounded = f"<|ref|>text<|/ref|><|det|>[[80, 40, 900, 160]]<|/det|>\n{chr(10).join(lines)}"
    kept = convert_remote(tmp_path / "a", [src], grounded)
    meta = json.loads((kept / "born.json").read_text())
    assert meta["pages"][0]["text_layer"] == {"placement": "blocks", "layer": "kept_existing"}
    first = lines[0].split()[0]
    assert poppler("pdftotext", kept / "born.pdf", "-").count(first) == \
        poppler("pdftotext", src, "-").count(first) > 0  # no doubled layer by surprise
    added = convert_remote(tmp_path / "b", [src], grounded, pdf_text_layer="add")
    meta = json.loads((added / "born.json").read_text())
    assert meta["pages"][0]["text_layer"] == {"placement": "blocks", "layer": "added"}
    assert poppler("pdftotext", added / "born.pdf", "-").count(first) == \
        2 * poppler("pdftotext", src, "-").count(first)


def test_replace_removes_an_earlier_invisible_layer_only(tmp_path: Path) -> None:
    from helpers import make_pdf

    from ocrd.outputs import textpdf
    from ocrd.outputs.page import PageOutput, Word
    from ocrd.outputs.textlayer import FontMap, page_layer

    src = make_pdf(tmp_path / "v.pdf", [["Visible heading stays"]])

    def layer(word: str, path: Path, out: Path, mode: str) -> list[str]:
        fonts = FontMap()
        lay = page_layer(fonts, PageOutput("", words=[Word(word, (100, 500, 400, 540))]),
                         1000, 1000, False)
        with open(path, "rb") as s, open(out, "wb") as o:
            return textpdf.write_pdf_layers(s, o, [lay], fonts, mode, [len(word)])

    assert layer("firstlayer", src, tmp_path / "1.pdf", "add") == ["added"]
    assert layer("secondlayer", tmp_path / "1.pdf", tmp_path / "2.pdf", "replace") == \
        ["replaced"]
    text = poppler("pdftotext", tmp_path / "2.pdf", "-")
    assert "Visible heading stays" in text and "secondlayer" in text
    assert "firstlayer" not in text
    assert layer("third", tmp_path / "2.pdf", tmp_path / "3.pdf", "add") == ["added"]
    assert "secondlayer" in poppler("pdftotext", tmp_path / "3.pdf", "-")


# -- failures, settings --------------------------------------------------------------------


def test_a_pdf_that_cannot_be_written_costs_the_pdf_not_the_markdown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """qpdf refusing the document, and the PDF made from its rendered pages failing too
    (both made to raise here): Markdown and sidecar are written,
    the sidecar says why there is no PDF, and no temporary file is left. (`ocrd convert
    --pdf` then fails the file as output_failed: the PDF was asked for by name.)"""
    from helpers import make_pdf

    from ocrd.outputs import textpdf

    def refuse(*_: Any, **__: Any) -> list[str]:
        raise pikepdf.PdfError("unable to find trailer dictionary")

    monkeypatch.setattr(textpdf, "write_pdf_layers", refuse)
    # the PDF made from the rendered pages instead fails too (here: for the same reason)
    monkeypatch.setattr(textpdf, "write_rendered_pages", refuse)
    src = make_pdf(tmp_path / "doc.pdf", [[]])
    out = convert_remote(tmp_path, [src], "Hello searchable world", failing=("output_failed",))
    meta = json.loads((out / "doc.json").read_text())
    assert meta["outputs"]["pdf"] is None
    assert "unable to find trailer" in meta["outputs"]["pdf_failed"]
    assert "Hello searchable world" in (out / "doc.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["doc.json", "doc.md"]


def test_a_pdf_qpdf_refuses_gets_one_made_from_its_rendered_pages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """qpdf refusing the original (a page tree with a loop: made to raise here; the real
    files are in tests/test_real_files.py): the PDF is made from the pages rendered again,
    each word of the layer where the page shows it, every page in its place and size, and
    the sidecar says why. It used to fail (outputs.pdf_failed)."""
    from helpers import make_pdf

    from ocrd.cli import _convert
    from ocrd.config.load import parse_config
    from ocrd.outputs import textpdf
    from ocrd.pipeline.batch import jobs_for
    from ocrd.pipeline.progress import Progress

    def refuse(*_: Any, **__: Any) -> list[str]:
        raise pikepdf.PdfError("/proc/self/fd/9 (object 3 0): Loop detected in /Pages "
                               "structure (getAllPages)")

    monkeypatch.setattr(textpdf, "write_pdf_layers", refuse)
    src = make_pdf(tmp_path / "doc.pdf", [distinct_lines(7, 9), distinct_lines(8, 9)])
    out = tmp_path / "out"

    async def run() -> list:
        cfg = parse_config({"state_dir": str(tmp_path), "metrics": {"listen": None},
                            "engine": {"kind": "tesseract"}}, tmp_path)
        ns = Namespace(files=[src], output=out, prompt="markdown", pdf=True,
                       pdf_text_layer="add")
        jobs = jobs_for([src], out)
        outcomes = await _convert(cfg, ns, jobs, Progress(len(jobs), enabled=False))
        return [o.error for o in outcomes if o.error is not None]

    assert asyncio.run(run()) == []
    meta = json.loads((out / "doc.json").read_text())
    assert meta["outputs"]["pdf"] == "doc.pdf" and meta["outputs"]["pdf_failed"] is None
    assert meta["outputs"]["pdf_rebuilt"] == "Loop detected in /Pages structure (getAllPages)"
    assert [p["text_layer"]["layer"] for p in meta["pages"]] == ["added", "added"]
    with pikepdf.open(out / "doc.pdf") as made, pikepdf.open(src) as original:
        assert len(made.pages) == 2
        for a, b in zip(made.pages, original.pages, strict=True):
            assert [round(float(v)) for v in a.mediabox] == \
                [round(float(v)) for v in b.mediabox]
    for page in (1, 2):
        truth = {}
        for text, *box in bbox_words(src, page):
            truth.setdefault(text.lower(), []).append(box)
        checked = 0
        for text, *box in bbox_words(out / "doc.pdf", page):
            want = truth.get(text.lower().strip(".,"), [])
            if len(want) != 1 or len(text) < 4:
                continue
            assert all(abs(a - b) <= 4 for a, b in zip(box, want[0], strict=True)), \
                (text, box, want)
            checked += 1
        assert checked >= 20, checked


def test_pdf_settings_are_checked() -> None:
    from ocrd.config.load import parse_config
    from ocrd.config.settings import ConfigError

    def inbox(**fields: Any) -> dict:
        return {"state_dir": "/tmp/s", "inboxes": [{"path": "/tmp/i", "outbox": "/tmp/o",
                                                    "failed": "/tmp/f", "on_success": "keep",
                                                    **fields}]}

    cfg = parse_config(inbox(outputs=["markdown", "pdf"], pdf_suffix=".ocr.pdf"), Path("/"))
    assert cfg.inboxes[0].outputs == ["markdown", "pdf"]
    assert cfg.inboxes[0].pdf_text_layer == "skip_if_text"
    for bad, key in ((dict(outputs=["pdf"]), "markdown"), (dict(outputs=["docx"]), "docx"),
                     (dict(pdf_suffix="x/.pdf"), "pdf_suffix"),
                     (dict(pdf_suffix=".md"), "pdf_suffix"),
                     (dict(pdf_text_layer="twice"), "pdf_text_layer")):
        with pytest.raises(ConfigError, match=key):
            parse_config(inbox(**bad), Path("/"))


@pytest.mark.e2e
def test_daemon_inbox_with_pdf_output(tmp_path: Path) -> None:
    """`outputs: [markdown, pdf]` on an inbox of the real daemon (tesseract): the PDF
    lands beside the Markdown under the configured suffix, listed in the sidecar, before
    the Markdown appears; the metrics count no failure."""
    import urllib.request

    from helpers import Daemon, drop, wait_for

    root = tmp_path / "d"
    inbox = {"path": str(root / "inbox"), "outbox": str(root / "outbox"),
             "failed": str(root / "failed"), "archive": str(root / "archive"),
             "quiet_seconds": 0.5, "outputs": ["markdown", "pdf"], "pdf_suffix": ".ocr.pdf"}
    lines = distinct_lines(5, 6)
    text_image(lines).save(tmp_path / "note.png")
    with Daemon(root, inboxes=[inbox]) as d:
        d.start()
        drop(tmp_path / "note.png", d.inbox / "note.png")
        wait_for(lambda: (d.outbox / "note.md").exists(), 90, "note.md")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{d.port}/metrics",
                                         timeout=10).read().decode()
    assert re.search(r'^ocrd_output_failures_total\{output="pdf"\} 0\.0$', metrics, re.M), \
        metrics
    meta = json.loads((d.outbox / "note.json").read_text())
    assert meta["outputs"]["pdf"] == "note.ocr.pdf"
    text = poppler("pdftotext", d.outbox / "note.ocr.pdf", "-")
    assert recall(md_words((d.outbox / "note.md").read_text()), text) >= 0.95
    assert recall(lines, text) >= 0.95


def test_tesseract_tsv_gives_the_same_text_as_its_text_output(tmp_path: Path) -> None:
    """The engine now asks tesseract for TSV (words and boxes from the one run): the
    Markdown's text must stay what tesseract's plain text output says."""
    lines = distinct_lines(6, 4) + ["", "A second paragraph, café.", "Its last line"]
    text_image(lines, (1400, 460)).save(tmp_path / "p.png")

    def run(*fmt: str) -> str:
        return subprocess.run(["tesseract", tmp_path / "p.png", "stdout", *fmt],
                              capture_output=True, text=True, timeout=120).stdout

    text, found = tesseract_tsv.parse(run("tsv"))
    assert text == run().strip()
    assert "\n\n" in text and len(found) == len(text.split())


def test_a_pdf_that_fails_is_counted_and_leaves_nothing(tmp_path: Path) -> None:
    """qpdf refusing a source for real (an image handed over as a PDF): the failure is
    recorded with qpdf's words, counted in the metrics, and no file is left behind."""
    from ocrd import safefs
    from ocrd.outputs import destinations, searchable_pdf
    from ocrd.outputs.page import PageOutput
    from ocrd.outputs.writers import Document, Settings
    from ocrd.render.pixels import RenderedPage
    from ocrd.service.metrics import Metrics

    metrics = Metrics()
    pdf = searchable_pdf.SearchablePdf(Settings("add"), 1, "text")
    pdf.page(0, PageOutput("some text"), RenderedPage(0, 100, 100, b"", 72.0))
    Image.new("RGB", (100, 100), "white").save(tmp_path / "x.png")
    (tmp_path / "out").mkdir()
    with safefs.Dir.open_root(tmp_path / "out") as out:
        asyncio.run(pdf.write(Document(str(tmp_path / "x.png"), "pdf", "x.png", 1), out, "x",
                              destinations.Perms(), None, metrics))
    assert pdf.written is None and "could not be made" in (pdf.failed or "")
    assert pdf.outputs() == {"pdf": None, "pdf_failed": pdf.failed}
    assert metrics.registry.get_sample_value("ocrd_output_failures_total",
                                             {"output": "pdf"}) == 1
    assert list((tmp_path / "out").iterdir()) == []


def test_grounding_boxes_of_a_straightened_page_go_back_onto_the_scan() -> None:
    """A GPU engine's block boxes (0..999 of the straightened page it was given) lie on
    the page as scanned: each corner mapped back, the block's box around them."""
    from ocrd.outputs import textlayer
    from ocrd.render.deskew import Skew

    skew = Skew(10.0, (1000, 1400), (1228, 1553))
    box = textlayer._grid_box([(399.0, 499.0, 599.0, 549.0)], skew)
    assert box is not None
    corners = [skew.point(x / 999 * 1228, y / 999 * 1553)
               for x in (399, 599) for y in (499, 549)]
    want = (min(x for x, _ in corners) / 1000, 1 - max(y for _, y in corners) / 1400,
            max(x for x, _ in corners) / 1000, 1 - min(y for _, y in corners) / 1400)
    assert box == pytest.approx(want)
    # as read without a turn: the box on the grid itself
    assert textlayer._grid_box([(399.0, 499.0, 599.0, 549.0)], None) == pytest.approx(
        (399 / 999, 1 - 549 / 999, 599 / 999, 1 - 499 / 999))
