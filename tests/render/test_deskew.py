"""Pages scanned askew are straightened before the engine reads them (render.deskew): the
skew is measured from the text lines to a tenth of a degree, ±15°, the page turned on a
canvas that holds all of it, and every box found on it maps back onto the page as
scanned (ocrd/render/deskew.py)."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from PIL import Image, ImageDraw
from structure_pages import make_page, render

from ocrd.render import deskew, modes, pages
from ocrd.render.pixels import RenderedPage
from ocrd.render.resolution import Resolution

TESSERACT = Resolution(300, 200, 600, grey=True)


def packed(image: Image.Image, dpi: float = 300.0) -> RenderedPage:
    if image.mode == "1":
        return RenderedPage(0, image.width, image.height, image.tobytes("raw", "1;I"), dpi,
                            mode="1")
    return RenderedPage(0, image.width, image.height, image.tobytes(), dpi, mode=image.mode)


@pytest.mark.parametrize(("kind", "angle"), [
    ("prose", 0.0), ("prose", 0.4), ("prose", -2.5), ("two_column", 2.5),
    ("table_ruled", -7.3), ("lists", 14.2), ("headings", -11.6)])
def test_the_skew_of_a_page_is_measured_from_its_lines_to_a_tenth_of_a_degree(
        kind: str, angle: float) -> None:
    page = render(make_page(kind, 1), 300, skew=angle)
    assert deskew.measure(packed(page)) == angle


def test_a_worn_scan_at_200_dpi_is_measured_too() -> None:
    page = render(make_page("prose", 2), 200, noisy=True, skew=1.7)
    # the noise turns the page a little of its own: at most 0.6° more either way
    got = deskew.measure(packed(page, 200.0))
    assert got is not None and abs(got - 1.7) <= 0.7


@pytest.mark.parametrize("mode", ["1", "RGB"])
def test_one_bit_and_colour_pages_are_measured_and_straightened_in_their_mode(
        mode: str) -> None:
    grey = render(make_page("prose", 3), 300, skew=-3.1)
    image = grey.point(lambda v: 255 if v >= 128 else 0).convert("1") if mode == "1" \
        else grey.convert("RGB")
    out, skew = deskew.deskewed(packed(image), 10**9)
    assert skew is not None and skew.angle == -3.1
    assert out.mode == mode and (out.width, out.height) == skew.turned
    assert deskew.measure(out) == 0.0


def test_a_page_without_lines_of_text_is_not_measured() -> None:
    blank = Image.new("L", (2480, 3508), 255)
    rng = random.Random(1)
    photo = Image.frombytes("L", (1240, 1754), rng.randbytes(1240 * 1754))
    assert deskew.measure(packed(blank)) is None
    assert deskew.measure(packed(photo, 150.0)) is None
    page, skew = deskew.deskewed(packed(blank), 10**9)
    assert skew is None and page.width == 2480


def test_a_page_that_lies_straight_is_left_as_it_is() -> None:
    rendered = packed(render(make_page("prose", 1), 300, skew=0.2))
    page, skew = deskew.deskewed(rendered, 10**9)
    assert page is rendered and skew is not None and skew.angle == 0.0


def test_boxes_on_the_straightened_page_map_back_onto_the_page_as_scanned() -> None:
    """Squares drawn on a page skewed by 4°: found on the straightened page, each maps
    back to where it lies on the skewed page, to a pixel."""
    page = render(make_page("prose", 1), 300)
    draw = ImageDraw.Draw(page)
    spots = [(300, 250), (2100, 300), (1200, 1800), (250, 3300), (2200, 3250)]
    for x, y in spots:
        draw.rectangle((x, y, x + 39, y + 39), fill=0)
    skewed = page.rotate(4.0, resample=Image.Resampling.BICUBIC, fillcolor=255)
    out, skew = deskew.deskewed(packed(skewed), 10**9)
    assert skew is not None and skew.angle == 4.0
    assert (out.width, out.height) == skew.turned
    straight = out.to_image()
    for x, y in spots:
        # where the square's middle went on the skewed page (Pillow turns about the
        # middle of the page, counter-clockwise)
        cx, cy = skewed.width / 2, skewed.height / 2
        want = _turned((x + 20, y + 20), (cx, cy), 4.0)
        # the square on the straightened page: a window around where it should be
        sx, sy = _turned(want, (cx, cy), -4.0)
        ox, oy = (out.width - skewed.width) / 2, (out.height - skewed.height) / 2
        found = modes.dark_box(straight, (round(sx + ox - 30), round(sy + oy - 30),
                                          round(sx + ox + 30), round(sy + oy + 30)))
        assert found is not None
        left, top, right, bottom = skew.to_original(found[0])
        assert abs((left + right) / 2 - want[0]) <= 1.5
        assert abs((top + bottom) / 2 - want[1]) <= 1.5
        assert right - left == found[0][2] - found[0][0]


def _turned(p: tuple[float, float], c: tuple[float, float], angle: float,
            ) -> tuple[float, float]:
    """A point turned counter-clockwise (as seen) about c, y down."""
    import math
    t = math.radians(angle)
    dx, dy = p[0] - c[0], p[1] - c[1]
    return (c[0] + dx * math.cos(t) + dy * math.sin(t),
            c[1] - dx * math.sin(t) + dy * math.cos(t))


def test_a_page_with_margins_is_straightened_on_a_canvas_of_its_own_size() -> None:
    """Turned by a few degrees, a page's text stays inside its margins: the engine gets
    no more pixels than the page has."""
    rendered = packed(render(make_page("prose", 1), 300, skew=2.5))
    out, skew = deskew.deskewed(rendered, 10**9)
    assert skew is not None and skew.angle == 2.5
    assert (out.width, out.height) == (rendered.width, rendered.height) == skew.turned


def test_a_page_over_its_pixel_cap_keeps_its_size() -> None:
    """A page that would grow beyond what it may cost is turned on its own canvas (its
    corners, margins, are cut) rather than made larger than the memory budget allows."""
    rendered = packed(render(make_page("prose", 1), 300, skew=3.0))
    out, skew = deskew.deskewed(rendered, rendered.width * rendered.height)
    assert (out.width, out.height) == (rendered.width, rendered.height) == skew.turned  # type: ignore[union-attr]
    assert deskew.measure(out) == 0.0


def test_the_render_worker_straightens_a_scanned_pdf_page(tmp_path: Path) -> None:
    scan = render(make_page("lists", 1), 300, skew=-2.2)
    buf = io.BytesIO()
    scan.save(buf, "PDF", resolution=300)
    pdf = tmp_path / "scan.pdf"
    pdf.write_bytes(buf.getvalue())
    info = pages.probe(str(pdf), 300, 10, 10**9, 10**9)
    page, skew = deskew.render_straight_page(str(pdf), info, 0, TESSERACT, 10**9, True)
    as_is, none = deskew.render_straight_page(str(pdf), info, 0, TESSERACT, 10**9, False)
    assert none is None
    # rendered again from the PDF's JPEG: within a tenth of a degree
    assert skew is not None and abs(skew.angle + 2.2) <= 0.11
    assert skew.size == (as_is.width, as_is.height)
    assert (page.width, page.height) == skew.turned and page.mode == "L"


def test_ruling_lines_are_found_in_the_pixels_and_text_is_not() -> None:
    """A table's grid, across and down (thin, grey or black), among lines of text and an
    underline: every rule, and no rule made of text."""
    page = render(make_page("prose", 1), 300)
    draw = ImageDraw.Draw(page)
    grid_top, grid_bottom = 2600, 3000
    for y in (grid_top, 2800, grid_bottom):
        draw.line((300, y, 2100, y), fill=0, width=3)
    for x in (300, 1200, 2100):
        draw.line((x, grid_top, x, grid_bottom), fill=90, width=2)
    found = modes.ruling_lines(page, 300)
    across = sorted(r for r in found if r[2] - r[0] > r[3] - r[1])
    down = sorted(r for r in found if r[3] - r[1] > r[2] - r[0])
    rows = [r[1] for r in across if r[1] >= grid_top - 5]
    assert len(rows) == 3 and all(abs(a - b) <= 2 for a, b in zip(rows, (2599, 2799, 2999),
                                                                  strict=True))
    assert all(abs(r[0] - 300) <= 10 and abs(r[2] - 2100) <= 10 for r in across)
    assert len(down) == 3 and all(abs(r[0] - x) <= 3 for r, x in zip(down, (300, 1200, 2100),
                                                                       strict=True))
    assert all(r[1] <= grid_top + 10 and r[3] >= grid_bottom - 10 for r in down)
    assert not [r for r in across if r[1] < grid_top - 5]  # the prose made none


def test_the_worker_keeps_a_straightened_page_within_the_page_budget(tmp_path: Path) -> None:
    """Turned on a larger canvas a page costs more: where its memory budget leaves no
    room for that (Resolution.page_budget), it is turned on a canvas of its own size."""
    scan = render(make_page("prose", 2), 300, skew=3.0)
    draw = ImageDraw.Draw(scan)  # marks in the corners: all of the page is content
    for x, y in ((10, 10), (2440, 10), (10, 3470), (2440, 3470)):
        draw.rectangle((x, y, x + 29, y + 29), fill=0)
    pdf = tmp_path / "scan.pdf"
    scan.save(pdf, "PDF", resolution=300)
    info = pages.probe(str(pdf), 300, 10, 10**9, 10**9)
    roomy, skew = deskew.render_straight_page(str(pdf), info, 0, TESSERACT, 10**9, True)
    assert skew is not None and roomy.width * roomy.height > skew.size[0] * skew.size[1]
    pixels = skew.size[0] * skew.size[1]
    # a budget that holds the page as rendered, and not a pixel more
    tight = Resolution(300, 200, 600, grey=True, pixel_bytes=(("L", 11.0),),
                       page_budget=round(pixels * 11.0) + 11)
    assert tight.max_pixels("L", 10**9) < roomy.width * roomy.height
    page, again = deskew.render_straight_page(str(pdf), info, 0, tight, 10**9, True)
    assert again is not None and again.angle == skew.angle
    assert (page.width, page.height) == skew.size == again.turned
