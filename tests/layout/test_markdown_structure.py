"""The Markdown keeps the page's structure on the CPU engine: paragraphs (hyphenation
resolved, deliberate breaks kept), lists (bullets, numbers, letters, nested), ruled and
unruled tables, headings, two columns read column by column. The real engine
(tesseract) on pages drawn with a known structure (tests/structure_pages.py), its
Markdown read back as the console renders it (ocrd/web/render.py).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont
from structure_pages import (
    MIXED,
    Lines,
    ListBlock,
    Paragraph,
    Shown,
    Table,
    kept_structures,
    make_page,
    render,
    shown,
    truth_blocks,
)

from ocrd.config.settings import EngineConfig
from ocrd.engines.base import PageRequest
from ocrd.engines.tesseract import TesseractEngine


@pytest.fixture(scope="module")
def engine() -> TesseractEngine:
    eng = TesseractEngine(EngineConfig(kind="tesseract"))
    asyncio.run(eng.start())
    return eng


def read(engine: TesseractEngine, kind: str, seed: int, dpi: int = 300,
         noisy: bool = False) -> tuple[list[Shown], list[Shown], str]:
    page = make_page(kind, seed)
    out = asyncio.run(engine.ocr(PageRequest(image=render(page, dpi, noisy), page_no=1,
                                             doc_id=page.name, dpi=dpi)))
    return shown(out.text), truth_blocks(page), out.text


def test_paragraphs_hyphenation_and_an_address(engine: TesseractEngine) -> None:
    page = make_page("prose", 1)
    assert page.hyphenated and any(isinstance(b, Lines) for b in page.blocks)
    got, want, md = read(engine, "prose", 1)
    assert [(b.kind, b.text) for b in got] == [(b.kind, b.text) for b in want], md
    for word in page.hyphenated:
        assert word in md


@pytest.mark.parametrize("seed", [1, 2])
def test_lists_bullets_numbers_letters_nested(engine: TesseractEngine, seed: int) -> None:
    got, want, md = read(engine, "lists", seed)
    items = [(b.text, b.level, b.ordered) for b in got if b.kind == "item"]
    assert items == [(b.text, b.level, b.ordered) for b in want if b.kind == "item"], md
    assert [b.kind for b in got if b.kind != "item"] == ["paragraph"] * 4


def test_list_markers_tesseract_did_not_read_are_found_in_the_pixels(
        engine: TesseractEngine) -> None:
    """At 200 dpi tesseract reads none of this page's numbers and bullets: the items
    still come out as items, from the marks beside the lines, and the numbers, read
    again from those marks, keep the list numbered."""
    got, want, md = read(engine, "lists", 1, dpi=200)
    assert [(b.text, b.level, b.ordered) for b in got if b.kind == "item"] == \
        [(b.text, b.level, b.ordered) for b in want if b.kind == "item"], md
    assert re.findall(r"^(\d+)\. ", md, re.MULTILINE) == ["1", "2", "3", "4", "5"], md


@pytest.mark.parametrize(("kind", "seed"), [("table_ruled", 1), ("table_ruled", 2),
                                            ("table_unruled", 1), ("table_unruled", 2)])
def test_tables_cell_by_cell(engine: TesseractEngine, kind: str, seed: int) -> None:
    got, want, md = read(engine, kind, seed)
    truth = next(b for b in want if b.kind == "table")
    assert 3 <= len(truth.rows[0]) <= 7
    tables = [b for b in got if b.kind == "table"]
    assert len(tables) == 1 and tables[0].rows == truth.rows, md
    assert [b.kind for b in got] == ["paragraph", "table", "paragraph"]


def test_headings_by_size(engine: TesseractEngine) -> None:
    got, want, md = read(engine, "headings", 1)
    assert [(b.kind, b.level, b.text) for b in got] == \
        [(b.kind, b.level, b.text) for b in want], md


@pytest.mark.parametrize("seed", [1, 5])
def test_two_columns_are_read_column_by_column(engine: TesseractEngine, seed: int) -> None:
    got, want, md = read(engine, "two_column", seed)
    assert [(b.kind, b.text) for b in got] == [(b.kind, b.text) for b in want], md


def test_a_noisy_scan_keeps_its_table(engine: TesseractEngine) -> None:
    got, want, md = read(engine, "table_unruled", 1, dpi=200, noisy=True)
    truth = next(b for b in want if b.kind == "table")
    tables = [b for b in got if b.kind == "table"]
    assert len(tables) == 1 and len(tables[0].rows) == len(truth.rows)
    assert [len(r) for r in tables[0].rows] == [len(r) for r in truth.rows], md


def test_structure_kinds_cover_the_generated_pages() -> None:
    """The drawn pages hold what the tests above claim (guards the generator)."""
    kinds = {type(b) for k in ("prose", "lists", "table_ruled") for b in
             make_page(k, 1).flat()}
    assert {Paragraph, ListBlock, Table} <= kinds
    assert re.search(r"\w", make_page("lists", 2).blocks[0].text)  # type: ignore[union-attr]


@pytest.mark.e2e
def test_a_page_of_every_structure_keeps_them_all_straight_and_askew(tmp_path: Path) -> None:
    """The drawn-page check: a title, two paragraphs, five bullets, five numbered items,
    a table of four columns and five rows without rules, and two columns, scanned at
    300 dpi as they lie and 2.5° askew either way, through `ocrd convert --engine
    tesseract`: all six structures in every Markdown."""
    files = {}
    for seed in (1, 2):
        page = make_page(MIXED, seed)
        for angle in (0.0, 2.5, -2.5):
            path = tmp_path / f"{page.name}{angle:+.1f}.pdf"
            render(page, 300, skew=angle).save(path, "PDF", resolution=300)
            files[path] = page
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", "--engine", "tesseract",
                        "-q", "-o", out, *files], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lost = {}
    for path, page in files.items():
        md = (out / path.with_suffix(".md").name).read_text()
        kept = kept_structures(page, re.sub(r"<!--.*?-->", "", md))
        if not all(kept.values()):
            lost[path.name] = ([k for k, v in kept.items() if not v], md)
    assert not lost, lost


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_headings_set_only_in_bold_are_headings(engine: TesseractEngine, seed: int) -> None:
    """A report's headings in bold at the body's own size, above their paragraphs: told
    from the body by the weight of their strokes."""
    got, want, md = read(engine, "bold_headings", seed)
    assert [(b.kind, b.text) for b in got] == [(b.kind, b.text) for b in want], md


def check_list_page(paper: int, box: int, ink: int) -> Image.Image:
    """Lines with check boxes (empty, ticked, crossed) at 300 dpi: black on white, or
    a form's white boxes on its tinted paper."""
    image = Image.new("L", (2480, 1300), paper)
    draw = ImageDraw.Draw(image)
    font = ImageFont.truetype("DejaVuSans.ttf", 46)
    draw.text((200, 100), "Please tick what was delivered to the office this week:",
              font=font, fill=ink)
    for k, (mark, text) in enumerate(CHECKS):
        y = 220 + k * 100
        if box == ink:
            draw.text((200, y), mark, font=font, fill=ink)
        else:  # a white box, and the tick drawn into it
            draw.rectangle((205, y + 8, 245, y + 48), fill=box)
            if mark != "☐":
                draw.line((212, y + 28, 222, y + 40, 240, y + 14), fill=ink, width=5)
        draw.text((270, y), text, font=font, fill=ink)
    return image


CHECKS = [("☐", "Printer paper for the office"), ("☑", "Toner cartridge ordered"),
          ("☒", "Desk lamp returned to the shop"), ("☐", "Monitor arm and cable set")]


@pytest.mark.parametrize(("paper", "box"), [(255, 0), (212, 255)])
def test_check_boxes_make_a_task_list(engine: TesseractEngine, paper: int, box: int) -> None:
    image = check_list_page(paper, box, 0)
    out = asyncio.run(engine.ocr(PageRequest(image=image, page_no=1, doc_id="boxes",
                                             dpi=300)))
    want = [f"- [{' ' if mark == '☐' else 'x'}] {text}" for mark, text in CHECKS]
    assert out.text.split("\n\n")[-1].split("\n") == want, out.text


WRAPPING_ROWS = [
    ["Item", "Description", "Price"],
    ["Printer paper", "Five hundred sheets of white paper for the office printer", "12.50"],
    ["Desk lamp", "A lamp with an arm", "40.00"],
    ["Cable set", "Cables of three lengths for the monitors and the docking stations in "
     "every office", "18.90"]]


def table_page(rows: list[list[str]], ruled: bool) -> Image.Image:
    """A table at 300 dpi whose middle column's cells run over several lines, with a
    grid of rules or without (its rows set apart by space alone)."""
    image = Image.new("L", (2480, 1400), 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.truetype("DejaVuSans.ttf", 40)
    xs, top = [200, 700, 1700, 2100], 200
    y = top
    for row in rows:
        height = 0
        for c, text in enumerate(row):
            lines = _wrap(draw, text, font, xs[c + 1] - xs[c] - 40)
            for k, line in enumerate(lines):
                draw.text((xs[c] + 20, y + 12 + k * 52), line, font=font, fill=0)
            height = max(height, 24 + len(lines) * 52)
        if ruled:
            draw.line((xs[0], y, xs[-1], y), fill=0, width=3)
        y += height
    if ruled:
        draw.line((xs[0], y, xs[-1], y), fill=0, width=3)
        for x in xs:
            draw.line((x, top, x, y), fill=0, width=3)
    return image


@pytest.mark.parametrize("ruled", [True, False])
def test_a_table_keeps_cells_that_wrap_in_their_row(engine: TesseractEngine,
                                                    ruled: bool) -> None:
    """A table whose cells run over two and three lines, drawn as a grid or without
    rules: each row stays one row, its cells' lines joined."""
    out = asyncio.run(engine.ocr(PageRequest(image=table_page(WRAPPING_ROWS, ruled),
                                             page_no=1, doc_id="table", dpi=300)))
    tables = [b for b in shown(out.text) if b.kind == "table"]
    assert len(tables) == 1 and tables[0].rows == WRAPPING_ROWS, out.text


def _wrap(draw: ImageDraw.ImageDraw, text: str, font: ImageFont.FreeTypeFont,
          width: int) -> list[str]:
    lines: list[str] = []
    for word in text.split():
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines
