"""The page's words shown exactly as they were read (one escaping rule, in every place a
word can stand), and the layout's edge cases, on pages whose words are placed by hand;
the Markdown read back as the console renders it (ocrd/web/render.py). The structure
on real tesseract output: tests/layout/test_markdown_structure.py.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from markdown_it import MarkdownIt
from structure_pages import shown

from ocrd.layout import page as layout
from ocrd.layout.reading import Ink, Line, Reading, Token
from ocrd.outputs.markdown import escape_line, text_to_markdown
from ocrd.outputs.modeltext import inert_markdown

# -- the page's words, built by hand -------------------------------------------------------

EM = 40  # pixels of body text


def _height(word: str, em: float) -> int:
    up = any(c.isupper() or c.isdigit() or c in "bdfhkltij" for c in word)
    down = any(c in "gjpqy" for c in word)
    return round(em * ((0.7 if up else 0.5) + (0.21 if down else 0.0)))


def words_line(text: str, x: int, y: int, em: float = EM, block: int = 1, par: int = 1,
               gap: float = 0.3) -> Line:
    """A line of words from x on the baseline y, each about as wide as its letters."""
    tokens = []
    for word in text.split():
        width = max(1, round(len(word) * em * 0.5))
        tokens.append(Token(word, (x, round(y - _height(word, em)), x + width, y), 95.0))
        x += width + round(em * gap)
    return Line(tokens, block, par)


def paragraph_lines(lines: list[str], x: int, y: int, block: int, em: float = EM,
                    ) -> list[Line]:
    return [words_line(t, x, y + round(k * 1.3 * em), em, block) for k, t in enumerate(lines)]


def wrap(text: str, chars: int) -> list[str]:
    """Text broken into lines as a typesetter would: a word goes to the next line only
    when it does not fit (words_line makes a letter half an em wide, a space 0.3)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= chars:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def md_of(lines: list[Line]) -> str:
    """The page's Markdown as the engine hands it on: made inert as every engine's is
    (ocrd/outputs/modeltext.py), which must leave what it shows as it is."""
    md = layout.to_markdown(Reading(lines))
    inert = inert_markdown(md)
    assert shown(inert) == shown(md)
    return inert


BODY = wrap("Body text runs across the page in lines of ordinary words that fill the "
            "column from its left edge to its right one and on and on to the end of the "
            "paragraph, as body text does on every page of an ordinary letter or report "
            "that somebody scanned.", 110)


# -- one escaping rule -------------------------------------------------------------------

HOSTILE = [
    "*emphasis* and **strong** and ***both***", "_under_ and __double__ snake_case_name",
    "[a link](https://example.org) and ![an image](x.png) [ref][1]",
    "<b>bold</b> <script>alert(1)</script> <img src=x onerror=y> <!-- note -->",
    "<https://auto.example> <mail@example.org>", "&amp; &lt;b&gt; &#65; &copy; AT&T; R&D",
    "`code` and ``two ticks`` and ```fence", "~~struck~~ and ~one~ ~~~",
    "$x^2$ costs $$5$$ and $3.50", "a | b | c", "back\\slash \\* \\_ ends with \\",
    "# not a heading", "#hashtag", "## two", "1. not a list", "2) nor this", "2024. A year",
    "- dash", "+ plus", "* star", "> quote", "=== ", "---", "- - -", "___", "***",
    "Title #", "trailing ##", "[^1] footnote", "www.example.com http://x.y", "=~*_`|",
    "<div>", "</p>", "<?php", "<!DOCTYPE html>", ":::", "{curly} (round)", "a\\", "\\",
]


def inline_tokens(markdown: str) -> Iterator[object]:
    md = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    for tok in md.parse(markdown):
        yield tok
        yield from tok.children or []


def assert_plain(markdown: str) -> None:
    """Nothing in the Markdown is read as inline markup or raw HTML."""
    kinds = {t.type for t in inline_tokens(markdown)}  # type: ignore[attr-defined]
    markup = kinds & {"em_open", "strong_open", "link_open", "image", "code_inline",
                      "html_inline", "html_block", "s_open", "code_block", "fence"}
    assert not markup, (markdown, markup)


@pytest.mark.parametrize("text", HOSTILE)
def test_the_page_text_renders_as_exactly_that_text_as_a_paragraph(text: str) -> None:
    """(A line that starts with a list marker is a list item: see the list test.)"""
    text = f"Text: {text}"
    md = md_of([words_line(text, 100, 200), *paragraph_lines(BODY, 100, 400, 2)])
    assert md.endswith(" ".join(BODY))  # the body's lines ran on
    assert_plain(md)
    blocks = shown(md)
    assert blocks[0].kind == "paragraph" and blocks[0].text == " ".join(text.split())


@pytest.mark.parametrize("text", HOSTILE)
def test_the_page_text_renders_as_exactly_that_text_in_a_heading(text: str) -> None:
    text = f"Title {text}"
    md = md_of([words_line(text, 100, 200, em=2 * EM), *paragraph_lines(BODY, 100, 400, 2)])
    assert_plain(md)
    blocks = shown(md)
    assert (blocks[0].kind, blocks[0].text) == ("heading", " ".join(text.split())), md


@pytest.mark.parametrize("text", HOSTILE)
def test_the_page_text_renders_as_exactly_that_text_in_a_list_item(text: str) -> None:
    items = [words_line(f"• {t}", 100, 300 + 60 * k, block=2)
             for k, t in enumerate([text, "second item", "third item"])]
    md = md_of([*paragraph_lines(BODY, 100, 100, 1), *items])
    assert_plain(md)
    got = [b for b in shown(md) if b.kind == "item"]
    assert [b.text for b in got] == [" ".join(text.split()), "second item", "third item"], md


@pytest.mark.parametrize("text", HOSTILE)
def test_the_page_text_renders_as_exactly_that_text_in_a_table_cell(text: str) -> None:
    rows = [("Code", "Text", "Price"), ("AB-1", text, "12.50"), ("CD-22", "plain", "3.10"),
            ("EF-333", "words", "100.00")]
    lines = [*paragraph_lines(BODY, 100, 100, 1)]
    for r, row in enumerate(rows):
        y = 400 + r * 60
        cells = [words_line(row[0], 100, y), words_line(row[1], 600, y),
                 words_line(row[2], 2600, y)]
        lines.append(Line([t for c in cells for t in c.tokens], 2, 1))
    md = md_of(lines)
    assert_plain(md)
    tables = [b for b in shown(md) if b.kind == "table"]
    want = [[" ".join(c.split()) for c in row] for row in rows]
    assert len(tables) == 1 and tables[0].rows == want, md


@pytest.mark.parametrize("text", HOSTILE)
def test_plain_text_renders_as_exactly_that_text(text: str) -> None:
    md = text_to_markdown(f"Intro\n\n{text}\n\nOutro")
    assert_plain(md)
    assert [b.text for b in shown(md)] == ["Intro", " ".join(text.split()), "Outro"]


def test_random_text_renders_as_itself() -> None:
    """Seeded strings of the characters Markdown gives meaning to, in every place."""
    rng = random.Random(35)
    alphabet = "*_[]()<>!&#;`~$|\\-+=.:0123456789abAB /"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))).strip()
        if not text:
            continue
        line = escape_line(text)
        assert "\n" not in line
        for md in (line, f"- {line}", f"# {line}", f"| h |\n| --- |\n| {line} |"):
            assert_plain(md)
        blocks = shown(f"Intro\n\n{line}\n\nOutro")
        assert [b.text for b in blocks] == ["Intro", " ".join(text.split()), "Outro"], text


# -- the geometry, by hand ---------------------------------------------------------------


def test_lines_of_a_paragraph_run_on_and_a_split_word_is_whole_again() -> None:
    lines = paragraph_lines(["The delivery of the printer paper was confirmed by the ware-",
                             "house on Monday and the invoice for it follows in the next",
                             "week by post."], 100, 200, 1)
    assert md_of(lines) == ("The delivery of the printer paper was confirmed by the "
                            "warehouse on Monday and the invoice for it follows in the next "
                            "week by post.")


def test_a_hyphen_before_a_capital_stays() -> None:
    lines = paragraph_lines(["The shipment to the new office in the old town went by Anglo-",
                             "Saxon habit: slowly and with many forms on paper in the post",
                             "room."], 100, 200, 1)
    assert "Anglo-Saxon habit" in md_of(lines)


def test_short_lines_keep_their_breaks() -> None:
    address = paragraph_lines(["Jane Holloway", "12 Harbour Street", "4021 Springfield"],
                              100, 200, 1)
    md = md_of([*address, *paragraph_lines(BODY, 100, 500, 2)])
    assert md.split("\n\n")[0] == "Jane Holloway\\\n12 Harbour Street\\\n4021 Springfield"
    assert shown(md)[0].text == "Jane Holloway\n12 Harbour Street\n4021 Springfield"


def test_columns_of_prose_side_by_side_are_not_a_table() -> None:
    left = wrap("Prose in the left column goes on for several lines of text that are as "
                "wide as the column is and end where the column ends.", 32)
    right = wrap("The right column holds other words in lines of its own that sit beside "
                 "the left ones on the very same heights, line by line.", 32)
    lines = [*paragraph_lines(left, 100, 200, 1), *paragraph_lines(right, 1000, 200, 2)]
    blocks = shown(md_of(lines))
    assert [b.kind for b in blocks] == ["paragraph", "paragraph"]
    assert blocks[0].text == " ".join(left) and blocks[1].text == " ".join(right)


def test_two_rows_of_words_with_gaps_are_no_table() -> None:
    """When unsure, the lines stay as they are: two rows are too few for a table
    without rules."""
    lines = [words_line("Invoice 2024-117", 100, 200), words_line("Date 2024-03-01", 1500, 200),
             words_line("Customer 4711", 100, 260), words_line("Page 1", 1500, 260)]
    lines = [Line(lines[0].tokens + lines[1].tokens, 1, 1),
             Line(lines[2].tokens + lines[3].tokens, 1, 1)]
    md = md_of(lines)
    assert "|" not in md and "Invoice 2024-117 Date 2024-03-01" in md


def test_short_lines_on_a_wide_page_keep_their_breaks() -> None:
    """Lines that all end well short of the page's right margin (as wide as its left
    one) were broken on purpose, even where the next word would not have fitted up to
    the longest of them; the same lines filling the page's width run on."""
    lines = paragraph_lines(wrap("Report warehouse total balance delivery number account "
                                 "30. Shipment address customer revenue signature payment "
                                 "31. Contract invoice report warehouse total 32.", 58),
                            200, 200, 1)
    right = max(line.box[2] for line in lines)
    assert layout.to_markdown(Reading(lines, width=3 * right)).count("\\\n") == 2
    assert layout.to_markdown(Reading(lines, width=right + 200)).count("\\\n") == 0


def ink_of(marks: list[tuple[int, int, int, int]], size: tuple[int, int] = (3000, 2000),
           ) -> Ink:
    """Where a page drawn with these dark boxes has ink (the engine's own lookup)."""
    from PIL import Image, ImageDraw

    from ocrd.render import modes

    image = Image.new("L", size, 255)
    draw = ImageDraw.Draw(image)
    for box in marks:
        draw.rectangle(box, fill=0)
    return lambda box: modes.dark_box(image, box)


ITEMS = ["Printer paper for the office upstairs", "Toner for the laser printer",
         "Cables of every length for the meeting room"]


def item_lines(x: int) -> list[Line]:
    return [words_line(t, x, 300 + 60 * k, block=2 + k) for k, t in enumerate(ITEMS)]


def test_marks_tesseract_did_not_read_make_list_items() -> None:
    """The bullets beside indented lines are in the pixels only (tesseract drops small
    isolated marks): the lines are items all the same."""
    body = paragraph_lines(BODY, 100, 100, 1)
    bullets = [(110, 300 - 25 - 7, 124, 300 - 25 + 7) for _ in ITEMS]
    bullets = [(110, y0 + 60 * k, 124, y1 + 60 * k) for k, (_, y0, _, y1) in
               enumerate(bullets)]
    md = layout.to_markdown(Reading([*body, *item_lines(180)]), ink_of(bullets))
    assert [b.text for b in shown(md) if b.kind == "item"] == ITEMS, md


def test_a_picture_beside_indented_lines_is_no_list() -> None:
    picture = [(100, 150, 160, 900)]  # its right edge runs past every line
    md = layout.to_markdown(Reading([*paragraph_lines(BODY, 100, 100, 1),
                                             *item_lines(180)]), ink_of(picture))
    assert not [b for b in shown(md) if b.kind == "item"], md


def test_a_dash_that_starts_a_line_of_running_text_is_no_bullet() -> None:
    lines = paragraph_lines(["Any notes played are added into the track while the",
                             "sequence plays back in the studio and all of the old"],
                            100, 100, 1)
    dash = words_line("— existing notes stay as they were recorded.", 100, 100 + 2 * 52)
    md = md_of([*lines, Line(dash.tokens, 1, 1)])
    assert md == ("Any notes played are added into the track while the sequence plays "
                  "back in the studio and all of the old — existing notes stay as they "
                  "were recorded.")


def test_a_list_set_larger_than_the_body_keeps_its_items_whole() -> None:
    """Bullet points in large type over a page of smaller body text: the lines that go
    on with an item are the item's, not headings."""
    big = 1.4 * EM
    body = paragraph_lines(BODY * 3, 100, 700, 2)  # most of the page: its body size
    edge = max(line.box[2] for line in body)
    hanging = 100 + round(0.8 * big)  # where the item's words start
    item, x = [""], hanging
    for word in ("Each of the hundred sequences holds thirty two tracks and each of the "
                 "tracks may play on its own channel, so that a whole song with all its "
                 "parts fits into one of them").split():
        width = round(len(word) * big * 0.5)
        if item[-1] and x + width > edge:  # wrapped where the next word does not fit
            item.append("")
            x = hanging
        item[-1] = f"{item[-1]} {word}".strip()
        x += width + round(big * 0.3)
    lines = [words_line(f"• {item[0]}", 100, 200, big, block=1)]
    assert lines[0].tokens[1].box[0] == hanging and len(item) >= 3
    lines += [words_line(t, hanging, 200 + round((k + 1) * 1.3 * big), big, block=1)
              for k, t in enumerate(item[1:])]
    md = md_of([*lines, *body])
    assert md.split("\n\n")[0] == "- " + " ".join(item), md
    assert "#" not in md


def test_a_sentence_goes_on_in_the_next_column() -> None:
    left = wrap("The first column ends in the middle of a sentence that it begins here "
                "and that", 32)
    right = wrap("carries on at the top of the second column, where it ends.", 32)
    lines = [*paragraph_lines(left, 100, 200, 1), *paragraph_lines(right, 1000, 200, 2)]
    blocks = shown(md_of(lines))
    assert [b.text for b in blocks] == [" ".join(left + right)]


def test_a_compound_the_page_writes_with_its_hyphen_keeps_it() -> None:
    lines = paragraph_lines(["The scanned pages become machine-encoded text that a reader",
                             "can search, and this text is machine-",
                             "encoded as well as the first one was ware-",
                             "housed."], 100, 200, 1)
    md = md_of(lines)
    assert "is machine-encoded as well" in md and "was warehoused." in md, md


RECIPE = ["4 ons linzen", "3 liter water", "3 uien", "bloem, boter", "2 kopjes melk",
          "laurier, kruidnagel, kerrie, zout"]


def typed(lines: list[str], y: int, block: int, one_par_each: bool) -> list[Line]:
    """Typewriter lines: every character as wide as the next, a space as well."""
    out = []
    for k, text in enumerate(lines):
        tokens, x = [], 100
        for word in text.split():
            tokens.append(Token(word, (x, y + 52 * k - _height(word, EM), x + 24 * len(word),
                                       y + 52 * k), 90.0))
            x += 24 * (len(word) + 1)
        out.append(Line(tokens, block, k if one_par_each else 1))
    return out


def test_typed_lines_of_a_list_stay_lines_of_one_paragraph() -> None:
    """A recipe's ingredients, one a line (tesseract makes each its own paragraph): one
    paragraph whose lines keep their breaks; a typewriter's wide spaces are no table."""
    prose = wrap("De linzen wassen en in een liter kokend water een dag laten weken en "
                 "dan twee liter water bij de linzen voegen zonder het water af te gieten.",
                 46)
    md = md_of([*typed(RECIPE, 200, 1, one_par_each=True),
                *typed(prose, 600, 2, one_par_each=False)])
    assert "|" not in md
    assert md.split("\n\n")[0] == "\\\n".join(RECIPE), md


def test_a_page_read_on_its_side_has_the_structure_of_an_upright_one() -> None:
    """Sideways text that tesseract reads as it lies comes with tall, narrow boxes:
    the structure is found in the text's own frame (a quarter turn either way)."""
    upright = [words_line("Quarterly report", 100, 150, em=2 * EM, block=1),
               *paragraph_lines(BODY, 100, 300, 2),
               *[words_line(f"• {t}", 100, 500 + 60 * k, block=3 + k)
                 for k, t in enumerate(ITEMS)]]
    want = md_of(upright)
    assert want.startswith("# Quarterly report") and "- " + ITEMS[0] in want

    def turned(box: tuple[int, int, int, int], down: bool) -> tuple[int, int, int, int]:
        left, top, right, bottom = box
        return (3000 - bottom, left, 3000 - top, right) if down else \
            (top, 3000 - right, bottom, 3000 - left)

    for down in (True, False):
        lines = [Line([Token(t.text, turned(t.box, down), t.conf) for t in line.tokens],
                      line.block, line.par) for line in upright]
        assert md_of(lines) == want


def test_a_short_word_at_a_line_start_is_no_bullet() -> None:
    """"It was the year …" with a wide gap after "It" (a scan's boxes): two letters are a
    word, not a bullet read as letters."""
    first = words_line("It", 100, 200)
    rest = words_line("was the year of Our Lord one thousand seven hundred and", 190, 200)
    tall = [Token(t.text, (t.box[0], t.box[3] - 60, t.box[2], t.box[3]), t.conf)
            for t in rest.tokens]  # boxes that a skewed scan makes too tall
    md = md_of([Line(first.tokens + tall, 2, 1), *paragraph_lines(BODY, 100, 252, 2)])
    assert md.startswith("It was the year"), md


def test_a_number_that_starts_a_line_of_running_text_is_no_list() -> None:
    lines = paragraph_lines(["The figures for the year are given in the appendix, on page",
                             "3. The totals there include the taxes paid by the office in"],
                            100, 100, 1)
    lines.append(words_line("the spring.", 100, 100 + 2 * 52))
    md = md_of(lines)
    assert md == ("The figures for the year are given in the appendix, on page 3. The "
                  "totals there include the taxes paid by the office in the spring."), md


def test_two_columns_read_as_one_line_each_are_read_column_by_column() -> None:
    """tesseract sometimes reads the lines of two columns side by side as one line
    each: they are cut at the gutter, and the columns read one after the other."""
    left = wrap("The left column holds prose that goes on for some lines, each of them "
                "as long as the column is wide, until the paragraph ends here.", 34)
    right = wrap("The right column holds other words on the same heights, lines that "
                 "start at one place beside the left ones, to the very end.", 34)
    lines = []
    for k, (a, b) in enumerate(zip(left, right, strict=False)):
        y = 200 + round(k * 1.3 * EM)
        lines.append(Line(words_line(a, 100, y).tokens + words_line(b, 1000, y).tokens))
    blocks = shown(md_of(lines))
    n = min(len(left), len(right))
    assert [b.kind for b in blocks] == ["paragraph", "paragraph"]
    assert blocks[0].text == " ".join(left[:n]) and blocks[1].text == " ".join(right[:n])


def test_numbers_after_bullets_begin_a_list_of_their_own() -> None:
    lines = [words_line(f"• {t}", 100, 200 + k * 60) for k, t in
             enumerate(["First point here", "Second point there"])]
    lines += [words_line(f"{k + 1}. {t}", 100, 320 + k * 60) for k, t in
              enumerate(["One step now", "Two steps later", "Three at last"])]
    md = md_of(lines)
    assert md == ("- First point here\n- Second point there\n\n1. One step now\n"
                  "2. Two steps later\n3. Three at last"), md


def test_a_numbered_list_above_a_table_is_not_taken_into_it() -> None:
    """Items whose marker stands apart from their words (as far as cells do) right
    above a table without rules: the list stays a list, the table a table."""
    items = [words_line(f"{k + 1}. {t}", 100, 200 + k * 60, gap=0.3) for k, t in
             enumerate(["Capital building structure effect", "Working heating share",
                        "Season street estate approval office"])]
    for line in items:  # the marker a cell's gap away from its words
        m = line.tokens[0]
        line.tokens[0] = Token(m.text, (m.box[0] - EM, m.box[1], m.box[2] - EM, m.box[3]),
                               m.conf)
    rows = [["Item", "Share", "Town", "Unit"], ["Notebook", "12%", "Riverside", "946.55"],
            ["Whiteboard", "31%", "Springfield", "829.12"],
            ["Toner", "61%", "Oakhurst", "757.00"]]
    table = [Line([t for c, cell in enumerate(row)
                   for t in words_line(cell, 100 + c * 500, 380 + r * 60).tokens], 2, 1)
             for r, row in enumerate(rows)]
    md = md_of([*items, *table])
    blocks = shown(md)
    assert [b.kind for b in blocks] == ["item"] * 3 + ["table"], md
    assert [b.ordered for b in blocks[:3]] == [True] * 3
    assert blocks[3].rows == rows


@pytest.mark.parametrize(("text", "conf"), [("WPWnP", 95.0), ("Xqz Wpt", 90.0),
                                            ("Quarterly report", 40.0)])
def test_no_heading_is_made_of_noise(text: str, conf: float) -> None:
    """A large mark that tesseract read as letters (an unread list marker, a stamp):
    letters no word is made of, or read with little confidence, are no heading."""
    big = words_line(text, 100, 100, em=2 * EM, block=1)
    big = Line([Token(t.text, t.box, conf) for t in big.tokens], 1, 1)
    md = md_of([big, *paragraph_lines(BODY, 100, 250, 2)])
    assert not md.startswith("#"), md


def test_a_real_heading_of_large_words_still_is_one() -> None:
    md = md_of([words_line("Quarterly report 2024", 100, 100, em=2 * EM, block=1),
                *paragraph_lines(BODY, 100, 250, 2)])
    assert md.startswith("# Quarterly report 2024"), md
