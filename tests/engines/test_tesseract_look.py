"""The tesseract engine's second look (TesseractEngine._look): small parts of the page it
read — list markers it took for dirt, table cells it read with little confidence — cut
out and read again, all of a page's in one tesseract run. Real tesseract."""

from __future__ import annotations

import asyncio

import pytest
from PIL import Image, ImageDraw, ImageFont

from ocrd.config.settings import EngineConfig
from ocrd.engines.base import PageRequest
from ocrd.engines.tesseract import TesseractEngine
from ocrd.layout.blocks import MARKER_CHARS


@pytest.fixture(scope="module")
def engine() -> TesseractEngine:
    eng = TesseractEngine(EngineConfig(kind="tesseract"))
    asyncio.run(eng.start())
    return eng


def page_of(marks: list[tuple[str, int, int]], size: int = 30,
            ) -> tuple[Image.Image, list[tuple[int, int, int, int]]]:
    """A grey page at 200 dpi with each text drawn alone at (x, y), on a scanner's light
    grey paper; and each text's box."""
    image = Image.new("L", (1654, 2339), 246)
    draw = ImageDraw.Draw(image)
    font = ImageFont.truetype("DejaVuSans.ttf", size)
    boxes = []
    for text, x, y in marks:
        draw.text((x, y), text, fill=20, font=font)
        boxes.append(draw.textbbox((x, y), text, font=font))
    return image, boxes


def test_markers_are_read_again_digits_and_letters_only(engine: TesseractEngine) -> None:
    marks = [("1.", 150, 300), ("2.", 150, 380), ("b)", 150, 460), ("iv.", 150, 540),
             ("•", 150, 620)]
    image, boxes = page_of(marks)
    look = engine._look(PageRequest(image=image, page_no=1, doc_id="t", dpi=200), None)
    got = look([b for b in boxes], MARKER_CHARS)
    assert [text for text, _ in got] == ["1.", "2.", "b)", "iv.", ""]
    assert all(conf > 0 for _, conf in got[:4]) and got[4][1] == 0.0


def test_lone_figures_are_read_again_from_a_packed_page(engine: TesseractEngine) -> None:
    """Cells of a sparse table, from the page as the pipeline hands it on (packed grey
    rows, not a Pillow image)."""
    from ocrd.render.pixels import RenderedPage

    marks = [("571.39", 900, 400), ("7%", 1300, 400), ("2", 1500, 480), ("Warehouse", 300, 560)]
    image, boxes = page_of(marks)
    rendered = RenderedPage(0, image.width, image.height, image.tobytes(), 200.0, mode="L")
    look = engine._look(PageRequest(image=None, rendered=rendered, page_no=1, doc_id="t",
                                    dpi=200), None)
    assert [text for text, _ in look(boxes, "")] == ["571.39", "7%", "2", "Warehouse"]
