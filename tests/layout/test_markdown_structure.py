"""The Markdown keeps the page's structure on the CPU engine: paragraphs (hyphenation
resolved, deliberate breaks kept), lists (bullets, numbers, letters, nested), ruled and
unruled tables, headings, two columns read column by column. The real engine
(tesseract) on pages drawn with a known structure (tests/structure_pages.py), its
Markdown read back as the console renders it (ocrd/web/render.py).
"""

from __future__ import annotations

import asyncio
import re

import pytest
from structure_pages import (
    Lines,
    ListBlock,
    Paragraph,
    Shown,
    Table,
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
    still come out as items, from the marks beside the lines."""
    got, want, md = read(engine, "lists", 1, dpi=200)
    assert [b.text for b in got if b.kind == "item"] == \
        [b.text for b in want if b.kind == "item"], md


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
