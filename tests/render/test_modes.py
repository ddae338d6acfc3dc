"""render.modes' pixel measures against Pillow's own filters."""

from __future__ import annotations

import random

from PIL import Image, ImageDraw, ImageFilter

from ocrd.render import modes


def test_erode3_is_pillows_3x3_minimum_edges_and_all() -> None:
    rng = random.Random(5)
    sizes = [(1, 1), (1, 7), (9, 1), (2, 2), (3, 3)] + [
        (rng.randint(1, 70), rng.randint(1, 40)) for _ in range(200)]
    for w, h in sizes:
        image = Image.frombytes("L", (w, h), bytes(rng.choice((0, 255, 255, 90))
                                                    for _ in range(w * h)))
        want = image.filter(ImageFilter.MinFilter(3))
        assert modes.erode3(image).tobytes() == want.tobytes(), (w, h)


def test_stroke_width_tells_bold_from_regular() -> None:
    page = Image.new("L", (400, 60), 255)
    draw = ImageDraw.Draw(page)
    for x in range(10, 190, 12):  # strokes 2 px wide
        draw.rectangle((x, 10, x + 1, 50), fill=0)
    for x in range(210, 390, 12):  # strokes 5 px wide
        draw.rectangle((x, 10, x + 4, 50), fill=0)
    thin = modes.stroke_width(page, (0, 0, 200, 60))
    thick = modes.stroke_width(page, (200, 0, 400, 60))
    assert thin is not None and thick is not None
    assert 1.5 <= thin <= 2.5 and 4.0 <= thick <= 5.5, (thin, thick)
