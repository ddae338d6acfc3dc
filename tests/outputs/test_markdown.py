"""Tests for ocrd.outputs.markdown: DeepSeek-OCR-2 grounding output and tesseract text
into Markdown.

The raw strings below are written in the model's real output format (special tokens kept).
"""

from __future__ import annotations

import random
import re
from html import escape as html_escape

import pytest
from PIL import Image, ImageDraw

from ocrd.outputs.markdown import PageMarkdown, grounding_to_markdown, text_to_markdown
from ocrd.web.render import to_html

EOS = "<｜end▁of▁sentence｜>"
BOS = "<｜begin▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
FORBIDDEN = ("<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "<｜")


def block(label: str, box: str, content: str = "") -> str:
    return f"<|ref|>{label}<|/ref|><|det|>{box}<|/det|>\n{content}\n\n"


FULL_PAGE = (
    block("title", "[[112, 58, 884, 97]]", "Quarterly Report on Heat Pumps")
    + block("sub_title", "[[112, 120, 460, 145]]", "1. Installed capacity")
    + block(
        "text",
        "[[112, 160, 884, 260]]",
        "Installations grew by 14% over the year. The coefficient of performance\n"
        "is defined as \\(\\mathrm{COP} \\coloneqq Q/W\\).",
    )
    + block("equation", "[[300, 270, 700, 310]]", "\\[\nQ = \\dot{m} c_p \\Delta T\n\\]")
    + block("table_caption", "[[112, 320, 500, 340]]", "Table 1: Units per region")
    + block(
        "table",
        "[[112, 345, 884, 480]]",
        "<table><tr><td>Region</td><td>Units</td></tr>"
        "<tr><td>North</td><td>1,204</td></tr><tr><td>South</td><td>987</td></tr></table>",
    )
    + block("image", "[[200, 500, 800, 850]]")
    + block("image_caption", "[[200, 860, 800, 880]]", "Figure 1: Monthly installations.")
    + EOS
)

# A repetition loop cut at max_tokens in the middle of a det tag.
LOOP_LINE = block("text", "[[100, 400, 900, 420]]", "Same line.")
LOOP_CUT = (
    block("title", "[[100, 50, 900, 90]]", "Minutes of the meeting")
    + LOOP_LINE * 40
    + "<|ref|>text<|/ref|><|det|>[[1"
)

UNCLOSED_TABLE = (
    block("table_caption", "[[100, 80, 900, 100]]", "Table 2: Results")
    + "<|ref|>table<|/ref|><|det|>[[100, 110, 900, 990]]<|/det|>\n"
    + "<table><tr><td>Run</td><td>Score</td></tr>"
    + "<tr><td>1</td><td></td></tr>" * 30
    + '<tr><td>2</td><td colspan="2'
)

# Model output in "Free OCR" mode: plain Markdown, no tags at all.
PLAIN = "# Invoice 2024-117\n\nDear customer,\n\nplease find enclosed **the invoice**.\n"

# Snippets for the fuzz test: a page with everything, a loop, an unclosed table, a plain page.
CORPUS = (FULL_PAGE, LOOP_CUT, UNCLOSED_TABLE, PLAIN)


def page(width: int = 999, height: int = 1998, colour: str = "white") -> Image.Image:
    return Image.new("RGB", (width, height), colour)


def convert(raw: str, image: Image.Image | None = None, page_no: int = 1) -> PageMarkdown:
    return grounding_to_markdown(raw, image, page_no, "report.assets")


# --- a well-formed page -----------------------------------------------------------------------


def test_full_page_renders_every_block_in_order() -> None:
    result = convert(FULL_PAGE, page(), page_no=3)
    md = result.markdown
    assert not result.malformed
    expected_in_order = [
        "# Quarterly Report on Heat Pumps",
        "## 1. Installed capacity",
        "Installations grew by 14% over the year.",
        "\\(\\mathrm{COP} := Q/W\\)",
        "\\[\nQ = \\dot{m} c_p \\Delta T\n\\]",
        "Table 1: Units per region",
        "<table><tr><td>Region</td><td>Units</td></tr>",
        "<tr><td>South</td><td>987</td></tr></table>",
        "![](report.assets/p0003-1.png)",
        "Figure 1: Monthly installations.",
    ]
    positions = [md.index(part) for part in expected_in_order]
    assert positions == sorted(positions)
    for tag in FORBIDDEN:
        assert tag not in md
    assert "[[" not in md  # no box coordinates leak into the text
    assert md == md.strip() and "\n\n\n" not in md
    assert all(line == line.rstrip() for line in md.split("\n"))


def test_full_page_blocks_are_separated_by_one_blank_line() -> None:
    md = convert(FULL_PAGE, page()).markdown
    assert md.startswith("# Quarterly Report on Heat Pumps\n\n## 1. Installed capacity\n\n")
    assert "![](report.assets/p0001-1.png)\n\nFigure 1: Monthly installations." in md
    assert md.endswith("Figure 1: Monthly installations.")


def test_image_block_becomes_a_crop_and_a_link() -> None:
    result = convert(FULL_PAGE, page(), page_no=12)
    assert [f.name for f in result.figures] == ["p0012-1.png"]
    figure = result.figures[0]
    # page is 999 x 1998: x maps 1:1, y doubles
    assert figure.box == (200, 1000, 800, 1700)
    assert figure.image.size == (600, 700)
    assert "![](report.assets/p0012-1.png)" in result.markdown


def test_title_that_already_is_a_heading_is_not_prefixed_again() -> None:
    raw = block("title", "[[1, 1, 900, 40]]", "# Already a heading") + block(
        "sub_title", "[[1, 50, 900, 80]]", "### Deeper heading"
    )
    assert convert(raw).markdown == "# Already a heading\n\n### Deeper heading"


def test_wrapped_title_becomes_one_heading_line() -> None:
    raw = block("title", "[[1, 1, 900, 80]]", "A very long title that\nthe model wrapped")
    assert convert(raw).markdown == "# A very long title that the model wrapped"


def test_unknown_labels_keep_their_content() -> None:
    raw = block("footnote", "[[1, 900, 900, 950]]", "¹ See appendix.") + block(
        "page_number", "[[480, 960, 520, 990]]", "7"
    )
    result = convert(raw)
    assert result.markdown == "¹ See appendix.\n\n7"
    assert not result.malformed


def test_coloneqq_and_eqqcolon_are_rewritten() -> None:
    raw = block("equation", "[[1, 1, 900, 40]]", "\\[ f \\coloneqq g, \\quad h \\eqqcolon k \\]")
    assert convert(raw).markdown == "\\[ f := g, \\quad h =: k \\]"


def test_blank_line_runs_and_trailing_spaces_are_cleaned() -> None:
    raw = block("text", "[[1, 1, 900, 40]]", "first   \n\n\n\n\nsecond\t\n\n\n")
    assert convert(raw).markdown == "first\n\nsecond"


def test_text_outside_blocks_is_kept() -> None:
    raw = "Preamble the model wrote without tags.\n\n" + block(
        "text", "[[1, 1, 900, 40]]", "Tagged text."
    )
    result = convert(raw)
    assert result.markdown == "Preamble the model wrote without tags.\n\nTagged text."
    assert not result.malformed


def test_plain_mode_output_passes_through() -> None:
    result = convert(PLAIN + EOS)
    assert result.markdown == PLAIN.strip()
    assert result.figures == []
    assert not result.malformed


def test_empty_output_gives_an_empty_page() -> None:
    result = convert("")
    assert result == PageMarkdown(markdown="", figures=[], malformed=False)
    assert convert(EOS).markdown == ""


# --- special tokens ---------------------------------------------------------------------------


def test_eos_bos_and_pad_tokens_are_stripped() -> None:
    raw = BOS + block("text", "[[1, 1, 900, 40]]", "Hello" + PAD + " world") + EOS + PAD * 3
    result = convert(raw)
    assert result.markdown == "Hello world"
    assert not result.malformed


def test_eos_cut_in_half_is_stripped_and_flagged() -> None:
    result = convert(block("text", "[[1, 1, 900, 40]]", "Done.") + "<｜end▁of")
    assert result.markdown == "Done."
    assert result.malformed


def test_grounding_prompt_tag_echoed_is_dropped() -> None:
    raw = "<|grounding|>" + block("text", "[[1, 1, 900, 40]]", "Body.")
    assert convert(raw).markdown == "Body."


# --- figures ----------------------------------------------------------------------------------


# Pixel boxes on the 999 x 1998 page of painted_page().
PLATE_BOXES: dict[str, tuple[int, int, int, int]] = {
    "red": (100, 200, 400, 600),
    "blue": (500, 1000, 900, 1400),
    "green": (50, 1600, 250, 1900),
    "yellow": (700, 100, 950, 300),
}


def painted_page() -> Image.Image:
    """A 999 x 1998 white page with coloured rectangles at PLATE_BOXES."""
    image = page()
    draw = ImageDraw.Draw(image)
    for colour, (x1, y1, x2, y2) in PLATE_BOXES.items():
        # ImageDraw's rectangle includes its far edge; crop boxes exclude it.
        draw.rectangle((x1, y1, x2 - 1, y2 - 1), fill=colour)
    return image


def det_for(pixel_box: tuple[int, int, int, int]) -> str:
    x1, y1, x2, y2 = pixel_box
    return f"[[{x1}, {y1 // 2}, {x2}, {y2 // 2}]]"  # inverse of the 999 x 1998 scaling


def single_colour(image: Image.Image) -> tuple[int, int, int] | None:
    colours = image.getcolors(maxcolors=2)
    return colours[0][1] if colours and len(colours) == 1 else None


def plates_page() -> str:
    """Raw output for painted_page(): three figures, a caption and text between them."""
    return (
        block("title", "[[10, 10, 600, 40]]", "Plates")
        + block("image", det_for(PLATE_BOXES["red"]))
        + block("image_caption", "[[100, 305, 400, 320]]", "Plate 1: red.")
        + block("image", det_for(PLATE_BOXES["blue"]))
        + block("text", "[[100, 710, 900, 780]]", "Between the plates.")
        + block("image", det_for(PLATE_BOXES["green"]))
        + EOS
    )


def test_several_figures_are_cropped_from_the_right_places() -> None:
    image, boxes = painted_page(), PLATE_BOXES
    raw = plates_page()
    result = grounding_to_markdown(raw, image, 7, "scans/plates.assets")
    assert not result.malformed
    assert [f.name for f in result.figures] == ["p0007-1.png", "p0007-2.png", "p0007-3.png"]
    rgb = {"red": (255, 0, 0), "blue": (0, 0, 255), "green": (0, 128, 0)}
    for figure, colour in zip(result.figures, ["red", "blue", "green"], strict=True):
        x1, y1, x2, y2 = boxes[colour]
        assert figure.box == boxes[colour]
        assert figure.image.size == (x2 - x1, y2 - y1)
        assert single_colour(figure.image) == rgb[colour]
    md = result.markdown
    assert md.index("p0007-1.png") < md.index("Plate 1: red.") < md.index("p0007-2.png")
    assert md.index("p0007-2.png") < md.index("Between the plates.") < md.index("p0007-3.png")
    for k in (1, 2, 3):
        assert f"![](scans/plates.assets/p0007-{k}.png)" in md


def test_one_image_block_with_several_boxes_gives_one_figure_per_box() -> None:
    image, boxes = painted_page(), PLATE_BOXES
    raw = block(
        "image",
        f"[{det_for(boxes['red'])[1:-1]}, {det_for(boxes['yellow'])[1:-1]}]",
    )
    result = convert(raw, image)
    assert [single_colour(f.image) for f in result.figures] == [(255, 0, 0), (255, 255, 0)]
    assert result.markdown == "![](report.assets/p0001-1.png)\n\n![](report.assets/p0001-2.png)"


@pytest.mark.parametrize(
    ("width", "height", "det"),
    [
        (1240, 1754, [120, 333, 877, 640]),  # A4 at 150 dpi
        (2480, 3508, [0, 0, 999, 999]),  # A4 at 300 dpi, whole page
        (817, 1123, [1, 998, 998, 999]),  # a thin strip at the bottom
    ],
)
def test_crop_size_is_the_box_scaled_from_the_0_999_grid(
    width: int, height: int, det: list[int]
) -> None:
    x1, y1, x2, y2 = det
    result = convert(block("image", str([det])), page(width, height))
    (figure,) = result.figures
    expected = (
        round(x1 / 999 * width),
        round(y1 / 999 * height),
        round(x2 / 999 * width),
        round(y2 / 999 * height),
    )
    assert figure.box == expected
    assert figure.image.size == (expected[2] - expected[0], expected[3] - expected[1])
    assert abs(figure.image.size[0] - (x2 - x1) / 999 * width) <= 1
    assert abs(figure.image.size[1] - (y2 - y1) / 999 * height) <= 1


def test_figure_without_page_image_is_dropped_without_a_link() -> None:
    result = convert(FULL_PAGE, None)
    assert result.figures == []
    assert "![](" not in result.markdown
    assert "Figure 1: Monthly installations." in result.markdown
    assert not result.malformed


@pytest.mark.parametrize(
    ("assets_link", "expected"),
    [
        ("Annual Report 2023.assets", "Annual%20Report%202023.assets/p0001-1.png"),
        ("Übersicht – März.assets", "%C3%9Cbersicht%20%E2%80%93%20M%C3%A4rz.assets/p0001-1.png"),
        ("sub dir/報告書.assets", "sub%20dir/%E5%A0%B1%E5%91%8A%E6%9B%B8.assets/p0001-1.png"),
        ("a#b?c%d.assets/", "a%23b%3Fc%25d.assets/p0001-1.png"),
    ],
)
def test_assets_link_is_url_quoted(assets_link: str, expected: str) -> None:
    raw = block("image", "[[100, 100, 400, 300]]")
    result = grounding_to_markdown(raw, page(), 1, assets_link)
    assert result.markdown == f"![]({expected})"
    assert result.figures[0].name == "p0001-1.png"


def test_cmyk_page_gives_figures_that_can_be_saved_as_png(tmp_path) -> None:
    result = convert(block("image", "[[100, 100, 400, 300]]"), page(colour="red").convert("CMYK"))
    (figure,) = result.figures
    path = tmp_path / figure.name
    figure.image.save(path)
    with Image.open(path) as saved:
        assert saved.size == figure.image.size
        assert single_colour(saved.convert("RGB")) == (255, 0, 0)


# --- bogus boxes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("det", "box", "malformed"),
    [
        ("[[a, b]]", None, True),  # not numbers
        ("[[1,2,3]]", None, True),  # three coordinates
        ("[]", None, True),
        ("[[1, 2, 3, 4], 'x']", None, True),  # one junk entry spoils the list
        ("not a box", None, True),
        ("__import__('os').system('false')", None, True),  # never evaluated
        ("[[True, 0, 500, 500]]", None, True),  # booleans are not coordinates
        ("[[NaN, 0, 500, 500]]", None, True),
        ("[[0, 0, 1e999, 500]]", None, True),  # infinity
        ("[[0, 0, 100000000, 500]]", None, True),  # absurd
        ("[[-20, 100, 1005, 300]]", (0, 200, 999, 600), False),  # clamped to the page
        ("[[500, 300, 100, 50]]", (100, 100, 500, 600), False),  # corners swapped
        ("[[100, 100, 100, 400]]", None, False),  # zero width
        ("[[100.5, 100.0, 300.25, 150.75]]", (100, 200, 300, 302), False),  # floats
        ("[100, 100, 300, 150]", (100, 200, 300, 300), False),  # a flat single box
        ("[[1000, 1000, 1200, 1200]]", None, False),  # entirely off the page
    ],
)
def test_bogus_image_det(det: str, box: tuple[int, int, int, int] | None, malformed: bool) -> None:
    raw = block("image", det) + block("text", "[[1, 900, 900, 950]]", "After the figure.")
    result = convert(raw, page())
    assert result.malformed is malformed
    assert [f.box for f in result.figures] == ([box] if box else [])
    assert result.markdown.endswith("After the figure.")
    assert ("![](" in result.markdown) is (box is not None)


@pytest.mark.parametrize("det", ["[[a, b]]", "[[1,2,3]]", "[[12, 3", "((((((((", "[" * 3000])
def test_bogus_text_det_keeps_the_text(det: str) -> None:
    raw = f"<|ref|>text<|/ref|><|det|>{det}<|/det|>\nThe paragraph survives.\n\n"
    result = convert(raw)
    assert result.markdown == "The paragraph survives."
    assert result.malformed


# --- broken streams ---------------------------------------------------------------------------


def test_loop_cut_at_max_tokens_mid_tag() -> None:
    result = convert(LOOP_CUT, page())
    assert result.malformed
    md = result.markdown
    assert md.startswith("# Minutes of the meeting\n\n")
    # the model's text is kept as it came, repetitions included
    assert md.count("Same line.") == 40
    assert md.endswith("Same line.")
    for tag in FORBIDDEN:
        assert tag not in md
    assert "[[1" not in md


@pytest.mark.parametrize(
    "cut",
    [
        "<|ref|>tab",
        "<|ref|>table<|/re",
        "<|ref|>table<|/ref|>",
        "<|ref|>table<|/ref|><|de",
        "<|ref|>table<|/ref|><|det|>[[12, 3",
        "<|ref|>table<|/ref|><|det|>[[12, 30, 500, 600]]<|/d",
        "<|",
        "<|/",
    ],
)
def test_stream_cut_inside_a_tag(cut: str) -> None:
    result = convert(LOOP_LINE * 3 + cut, page())
    assert result.markdown == "Same line.\n\nSame line.\n\nSame line."
    assert result.malformed
    assert result.figures == []


def test_unclosed_table_is_closed() -> None:
    result = convert(UNCLOSED_TABLE)
    assert result.malformed
    md = result.markdown
    assert md.startswith("Table 2: Results\n\n<table><tr><td>Run</td><td>Score</td></tr>")
    assert md.count("<tr><td>1</td><td></td></tr>") == 30
    # the cell cut mid-attribute is dropped, then row and table are closed
    assert md.endswith("<tr><td>2</td></tr></table>")
    assert md.count("<table>") == md.count("</table>") == 1
    assert md.count("<tr>") == md.count("</tr>") == 32
    assert md.count("<td>") == md.count("</td>") == 63


def test_unclosed_table_is_closed_before_the_next_block() -> None:
    raw = block("table", "[[1, 1, 900, 400]]", "<table><tr><td>a</td><td>b") + block(
        "text", "[[1, 500, 900, 540]]", "Text after the table."
    )
    result = convert(raw)
    assert result.markdown == (
        "<table><tr><td>a</td><td>b</td></tr></table>\n\nText after the table."
    )
    assert result.malformed


def test_table_with_implied_and_stray_closing_tags_is_made_well_formed() -> None:
    html = (
        "<table><thead><tr><th>A<th>B</thead>"
        "<tbody><tr><td>1<td>2<tr><td>3</td></td></tr></tbody></table></tr>"
    )
    result = convert(block("table", "[[1, 1, 900, 400]]", html))
    assert result.malformed
    assert result.markdown == (
        "<table><thead><tr><th>A</th><th>B</th></tr></thead>"
        "<tbody><tr><td>1</td><td>2</td></tr><tr><td>3</td></tr></tbody></table>"
    )


def test_well_formed_table_is_left_alone() -> None:
    html = (
        '<table border="1"><TR><TD colspan="2">x</TD></TR>\n<tr><td>y</td><td>z</td></tr></table>'
    )
    result = convert(block("table", "[[1, 1, 900, 400]]", html))
    assert result.markdown == html
    assert not result.malformed


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # "<|/ref|>" missing
        ("<|ref|>text<|det|>[[1, 1, 9, 9]]<|/det|>\nBody.\n\n", "Body."),
        # a det without a ref
        ("<|det|>[[1, 1, 9, 9]]<|/det|>\nBody.\n\n", "Body."),
        # a ref without a det
        ("<|ref|>text<|/ref|>\nBody.\n\n", "Body."),
        # stray closing tags
        ("Body<|/ref|> text<|/det|>.", "Body text."),
        # a ref that never closes before the next one
        ("<|ref|>text" + block("text", "[[1, 1, 9, 9]]", "Body."), "Body."),
        # the det never closes before the next block
        ("<|ref|>text<|/ref|><|det|>[[1, 1" + block("text", "[[1, 1, 9, 9]]", "Body."), "Body."),
        # a "label" that is really text
        (
            "<|ref|>This is a sentence, not a label.<|/ref|>\nBody.",
            "This is a sentence, not a label.\n\nBody.",
        ),
    ],
)
def test_unbalanced_tags_are_repaired(raw: str, expected: str) -> None:
    result = convert(raw)
    assert result.markdown == expected
    assert result.malformed


def test_tag_fragments_that_join_up_are_removed() -> None:
    # removing the stray "<|/ref|>" would otherwise glue "<|re" and "f|>" into a real tag
    result = convert("a<|re<|/ref|>f|>b")
    assert result.markdown == "ab"
    assert result.malformed


# --- never raises -----------------------------------------------------------------------------

GARBAGE_PIECES = (
    "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "<|", "|>", "<", ">", "<｜", "｜>", EOS, PAD,
    "[[", "]]", "[", "]", ",", " ", "\n", "\n\n\n", "0", "999", "-5", "1e9", "1000", "NaN",
    "image", "title", "sub_title", "table", "text", "<table>", "</table>", "<tr>", "</tr>",
    "<td>", "</td>", "<th", "</", "\\[", "\\]", "\\coloneqq", "#", "ü", "報", "\x00", "'", '"',
    "(", ")", "{", "}", "__import__('os')", "1.5", "[[1, 2, 3, 4]]", "[[100, 100, 600, 700]]",
)  # fmt: skip


def check_invariants(result: PageMarkdown, image: Image.Image | None, page_no: int) -> None:
    assert isinstance(result, PageMarkdown)
    assert isinstance(result.markdown, str)
    assert isinstance(result.malformed, bool)
    for tag in FORBIDDEN:
        assert tag not in result.markdown
    assert "\n\n\n" not in result.markdown
    if image is None:
        assert result.figures == []
    for k, figure in enumerate(result.figures, start=1):
        assert figure.name == f"p{page_no:04d}-{k}.png"
        assert f"{figure.name})" in result.markdown
        x1, y1, x2, y2 = figure.box
        assert 0 <= x1 < x2 <= image.width and 0 <= y1 < y2 <= image.height
        assert figure.image.size == (x2 - x1, y2 - y1)


def test_fuzz_random_slices_of_real_outputs_never_raise() -> None:
    rng = random.Random(20240611)
    image = page(120, 160)
    corpus = (*CORPUS, plates_page())
    for i in range(4000):
        source = rng.choice(corpus)
        start = rng.randrange(len(source)) if rng.random() < 0.5 else 0
        end = rng.randint(start, len(source))
        raw = source[start:end]
        if rng.random() < 0.3:  # splice two slices, as a loop cut and restarted might
            other = rng.choice(corpus)
            cut = rng.randrange(len(other))
            raw += other[cut : cut + rng.randrange(400)]
        with_image = image if i % 3 else None
        result = grounding_to_markdown(raw, with_image, i % 10_000, "out dir/ü.assets")
        check_invariants(result, with_image, i % 10_000)


def test_fuzz_random_garbage_never_raises() -> None:
    rng = random.Random(99)
    image = page(64, 48)
    alphabet = "<>|｜/[],0123456789 -.\nrefdtabl▁\\#é"
    for i in range(4000):
        if i % 2:
            raw = "".join(rng.choice(GARBAGE_PIECES) for _ in range(rng.randrange(60)))
        else:
            raw = "".join(rng.choice(alphabet) for _ in range(rng.randrange(200)))
        with_image = image if i % 4 else None
        result = grounding_to_markdown(raw, with_image, 1, "assets")
        check_invariants(result, with_image, 1)


def test_well_formed_output_is_never_flagged_malformed() -> None:
    rng = random.Random(7)
    labels = ["title", "sub_title", "text", "image", "image_caption", "table", "equation"]
    for _ in range(200):
        raw = ""
        for _ in range(rng.randrange(1, 12)):
            x1, y1 = rng.randrange(0, 900), rng.randrange(0, 900)
            box = f"[[{x1}, {y1}, {x1 + rng.randrange(1, 99)}, {y1 + rng.randrange(1, 99)}]]"
            label = rng.choice(labels)
            content = {
                "image": "",
                "table": "<table><tr><td>1</td></tr></table>",
            }.get(label, f"Line {rng.randrange(1000)}.")
            raw += block(label, box, content)
        result = convert(raw + EOS, page(300, 300))
        assert not result.malformed, raw


# --- tesseract text ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "escaped"),
    [
        ("# 42 is the answer", "\\# 42 is the answer"),
        ("#hashtag", "\\#hashtag"),
        ("> quoted", "\\> quoted"),
        ("- dash item", "\\- dash item"),
        ("* star item", "\\* star item"),
        ("+ plus item", "\\+ plus item"),
        ("-", "\\-"),
        ("1. first", "1\\. first"),
        ("2024. A good year", "2024\\. A good year"),
        ("3) third", "3\\) third"),
        ("| a | b |", "\\| a \\| b \\|"),
        ("===", "\\==="),
        ("---", "\\---"),
        ("--", "\\--"),
        ("***", "\\*\\*\\*"),
        ("___", "\\_\\_\\_"),
        ("- - -", "\\- - -"),
        ("```python", "\\`\\`\\`python"),
        ("~~~", "\\~\\~\\~"),
        ("<div>", "\\<div>"),
        ("    # indented heading", "\\# indented heading"),
        # inline markup anywhere in the line, not only at its start
        ("*emphasis* mid-sentence", "\\*emphasis\\* mid-sentence"),
        ("see [a](b) and <b>c</b>", "see \\[a\\](b) and \\<b>c\\</b>"),
        ("a `tick`, ~strike~, $math$ and &amp;",
         "a \\`tick\\`, \\~strike\\~, \\$math\\$ and \\&amp;"),
    ],
)
def test_text_escapes_accidental_markdown_structure(line: str, escaped: str) -> None:
    assert text_to_markdown(f"Intro\n\n{line}\n\nOutro") == f"Intro\n\n{escaped}\n\nOutro"
    # and the console shows exactly the line's text
    html = to_html(f"Intro\n\n{escaped}\n\nOutro")
    assert html.count("<p>") == 3 and re.sub(r"<[^>]+>", "", html).split("\n")[1] == \
        html_escape(line.strip(), quote=False)


@pytest.mark.parametrize(
    "line",
    [
        "Plain sentence.",
        "-5 degrees below zero",
        "1.5 litres",
        "12.50 EUR",
        "== Section ==",
        "a = b",
        "3 < 4",
        "C-3PO",
        "",
    ],
)
def test_text_leaves_ordinary_lines_alone(line: str) -> None:
    assert text_to_markdown(f"Intro\n{line}") == f"Intro\n{line}".strip("\n")


def test_text_normalises_whitespace() -> None:
    text = "Page one   \r\nsecond line\t\r\rthird\n\n\n\n\nfourth\f\x0cPage two\n\n\n"
    assert text_to_markdown(text) == ("Page one\nsecond line\n\nthird\n\nfourth\n\nPage two")


def test_text_with_tesseract_form_feed_between_pages() -> None:
    assert text_to_markdown("end of page 1\n\f") == "end of page 1"
    assert text_to_markdown("a\fb") == "a\nb"


def test_text_empty_and_blank() -> None:
    assert text_to_markdown("") == ""
    assert text_to_markdown(" \n\f\n\t\n") == ""


def test_text_realistic_tesseract_page() -> None:
    text = (
        "INVOICE No. 2024-117\n"
        "\n"
        "# of items: 3\n"
        "- Widget A    10.00\n"
        "- Widget B     5.50\n"
        "1. Payment due in 30 days.\n"
        "--------------------------\n"
        "Total          15.50 \n"
        "\f"
    )
    assert text_to_markdown(text) == (
        "INVOICE No. 2024-117\n"
        "\n"
        "\\# of items: 3\n"
        "\\- Widget A    10.00\n"
        "\\- Widget B     5.50\n"
        "1\\. Payment due in 30 days.\n"
        "\\--------------------------\n"
        "Total          15.50"
    )
