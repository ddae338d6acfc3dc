"""Pages whose structure is known: paragraphs, lists, tables, headings, two columns.

Drawn with reportlab's canvas (every line placed here, so the truth is exact: which
words a line holds, where a word was hyphenated, which breaks are deliberate), rendered
with PDFium at a chosen resolution, optionally with scanner noise. The structure tests
(tests/layout/test_markdown_structure.py, the console's in tests/web/test_web_browser.py) and the
benchmark (bench/structure.py) read them.
Everything is seeded: the same name gives the same page, pixel for pixel.
"""

from __future__ import annotations

import io
import random
import threading
from dataclasses import dataclass, field
from typing import Any

# -- the truth --------------------------------------------------------------------------


@dataclass(frozen=True)
class Heading:
    text: str
    level: int  # 1 or 2 (larger than the body), 3: bold in the body's size


@dataclass(frozen=True)
class Paragraph:
    text: str  # the words as written (hyphenation at line ends is only in the drawing)


@dataclass(frozen=True)
class Lines:
    """Lines broken on purpose (an address, a signature): kept as they are."""
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Item:
    text: str  # without its marker
    depth: int = 0
    marker: str = "•"  # as drawn: "•", "–", "-", "*", "3.", "b)", …


@dataclass(frozen=True)
class ListBlock:
    items: tuple[Item, ...]


@dataclass(frozen=True)
class Table:
    rows: tuple[tuple[str, ...], ...]  # the first row is the header
    ruled: bool


@dataclass(frozen=True)
class Columns:
    left: tuple[Any, ...]
    right: tuple[Any, ...]


Block = Heading | Paragraph | Lines | ListBlock | Table | Columns


@dataclass
class Page:
    name: str
    kind: str  # prose, lists, table_ruled, table_unruled, headings, two_column
    blocks: list[Block]
    font: str = "Helvetica"
    size: float = 11.0
    justify: bool = False
    hyphenate: bool = False
    indent_style: bool = False  # paragraphs marked by a first-line indent, no gap
    pdf: bytes = b""
    hyphenated: list[str] = field(default_factory=list)  # words split at a line end

    def flat(self) -> list[Block]:
        """The blocks in reading order, columns read left then right."""
        out: list[Block] = []
        for b in self.blocks:
            if isinstance(b, Columns):
                out.extend(b.left)
                out.extend(b.right)
            else:
                out.append(b)
        return out


# -- words ------------------------------------------------------------------------------

VOCAB = """
account address agreement amount annual answer apply approval april arrive article
assets audit august balance bank basis before beyond board branch budget building
business calendar capital carrier central certain change charge client closing
company complete condition contract control copy corner cost council county credit
current customer damage daily deadline december delivery department deposit design
detail direct district document domestic during early effect electric employee
energy engine equal estate evening event exact expense export factory family
february field figure final finance first floor following forward freight friday
further garden general goods ground group growth harbour health heating history
holder holiday house import include income index inland insurance interest invoice
issue january journal july june kitchen label labour land language later ledger
letter level licence limit local machine maintain manager march market material
meeting member method middle minute model monday month morning motor nation network
notice number object office option order owner package paper parcel partner payment
period permit person place planning policy portion post premium present price
private product profit project property public purpose quality quarter question
railway rate receipt record region register remain rental repair report request
return revenue river road safety salary sample season second section service
settle share shipment signature simple single source station statement steel
storage street structure summer supply surface system table taxes terms through
timber total trade transfer travel treasury trust tuesday union update usage valley
value vehicle volume warehouse water weekly winter without working yearly
""".split()

LONG = """
administration accommodation announcement arrangement certificate circumstances
communication consideration construction consultation contribution correspondence
distribution documentation environmental establishment headquarters identification
implementation infrastructure international investigation maintenance manufacturer
notification organisation particularly performance professional qualification
recommendation registration reimbursement representative responsibility
specification subscription telecommunications transportation understanding
""".split()

STREETS = ["Harbour Street", "Mill Lane", "Station Road", "Garden Row", "Church Walk",
           "Bridge Street", "Market Square", "Valley Road"]
TOWNS = ["Springfield", "Riverside", "Oakhurst", "Fairview", "Kingsbridge", "Lakeside"]
NAMES = ["Jane Holloway", "Peter Marsh", "Anna Keller", "Tom Barrett", "Lucy Fenwick",
         "Omar Haddad", "Mia Larsen", "Karl Brenner"]
ITEMS = ["Printer paper", "Toner cartridge", "Desk lamp", "Office chair", "Cable set",
         "Label roll", "Stapler", "Filing box", "Whiteboard", "Marker pens", "Paper clips",
         "Monitor arm", "Keyboard", "Headset", "Notebook", "Shelf unit"]


def sentence(rng: random.Random, n: int | None = None, long_words: bool = False) -> str:
    n = n or rng.randint(7, 15)
    words = []
    for _ in range(n):
        pool = LONG if long_words and rng.random() < 0.3 else VOCAB
        words.append(rng.choice(pool))
    words[0] = words[0].capitalize()
    return " ".join(words) + "."


def prose(rng: random.Random, sentences: tuple[int, int] = (3, 6),
          long_words: bool = False) -> str:
    return " ".join(sentence(rng, long_words=long_words)
                    for _ in range(rng.randint(*sentences)))


def short_text(rng: random.Random, lo: int = 3, hi: int = 9) -> str:
    words = [rng.choice(VOCAB) for _ in range(rng.randint(lo, hi))]
    return " ".join(words).capitalize()


def address(rng: random.Random) -> Lines:
    return Lines((rng.choice(NAMES), f"{rng.randint(2, 180)} {rng.choice(STREETS)}",
                  f"{rng.randint(1000, 9899)} {rng.choice(TOWNS)}"))


# -- tables -----------------------------------------------------------------------------

def _cell(rng: random.Random, kind: str, row: int) -> str:
    if kind == "item":
        return rng.choice(ITEMS)
    if kind == "qty":
        return str(rng.randint(1, 250))
    if kind == "price":
        return f"{rng.randint(1, 999)}.{rng.randint(0, 99):02d}"
    if kind == "date":
        return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if kind == "code":
        return f"{rng.choice('ABCDEFGHKLMNPRST')}{rng.choice('ABCDEFGHKLMNPRST')}-" \
               f"{rng.randint(100, 9999)}"
    if kind == "word":
        return rng.choice(VOCAB).capitalize()
    if kind == "pct":
        return f"{rng.randint(0, 99)}%"
    return rng.choice(TOWNS)


_COLUMN_KINDS = {"Item": "item", "Qty": "qty", "Unit": "price", "Total": "price",
                 "Date": "date", "Code": "code", "Status": "word", "Town": "town",
                 "Share": "pct", "Price": "price", "Group": "word", "Ref": "code"}


def table(rng: random.Random, columns: int, rows: int, ruled: bool) -> Table:
    first = rng.choice(["Item", "Code", "Date"])
    others = [k for k in _COLUMN_KINDS if k != first]
    rng.shuffle(others)
    header = [first, *others[:columns - 1]]
    body = [tuple(_cell(rng, _COLUMN_KINDS[h], r) for h in header) for r in range(rows)]
    return Table((tuple(header), *body), ruled)


# -- pages ------------------------------------------------------------------------------

BULLETS = ["•", "–", "-", "*"]


def _list(rng: random.Random, style: str, n: int, nested: bool) -> ListBlock:
    items: list[Item] = []
    for i in range(n):
        k = i + 1
        text = short_text(rng, 3, 16 if rng.random() < 0.4 else 8)
        if style == "number":
            marker = f"{k}."
        elif style == "paren":
            marker = f"{k})"
        elif style == "letter":
            marker = f"{'abcdefghij'[k - 1]})"
        else:
            marker = style
        items.append(Item(text, 0, marker))
        if nested and i == 1:
            sub = rng.choice(["•", "–", "letter"])
            for j in range(rng.randint(2, 3)):
                m = f"{'abc'[j]})" if sub == "letter" else sub
                items.append(Item(short_text(rng, 3, 7), 1, m))
    return ListBlock(tuple(items))


def make_page(kind: str, seed: int) -> Page:
    """One page of the given kind, different per seed (drawn again with other words
    until it fits on the page)."""
    for attempt in range(20):
        page = _page(kind, seed, random.Random(f"{kind}-{seed}-{attempt}" if attempt
                                               else f"{kind}-{seed}"))
        if page.pdf:
            page.name = f"{kind}-{seed}"
            return page
    raise ValueError(f"no {kind} page fits")


def _page(kind: str, seed: int, rng: random.Random) -> Page:
    font = rng.choice(["Helvetica", "Times-Roman"])
    page = Page(f"{kind}-{seed}", kind, [], font=font, size=rng.choice([10.5, 11.0, 12.0]))
    b = page.blocks
    if kind == "prose":
        page.justify = rng.random() < 0.5
        page.hyphenate = True
        page.indent_style = rng.random() < 0.3
        if rng.random() < 0.5:
            b.append(address(rng))
        for _ in range(rng.randint(3, 5)):
            b.append(Paragraph(prose(rng, long_words=True)))
        if rng.random() < 0.5:
            b.append(Lines((rng.choice(["Yours sincerely", "Kind regards", "With thanks"]),
                            rng.choice(NAMES))))
    elif kind == "lists":
        b.append(Paragraph(prose(rng, (1, 2))))
        styles = ["•", "number", rng.choice(["–", "-", "*"]), rng.choice(["letter", "paren"])]
        rng.shuffle(styles)
        for style in styles[:3]:
            b.append(_list(rng, style, rng.randint(3, 5), nested=rng.random() < 0.5))
            b.append(Paragraph(prose(rng, (1, 2))))
    elif kind in ("table_ruled", "table_unruled"):
        b.append(Paragraph(prose(rng, (1, 3))))
        b.append(table(rng, rng.randint(3, 7), rng.randint(4, 9), kind == "table_ruled"))
        b.append(Paragraph(prose(rng, (1, 3))))
    elif kind == "headings":
        page.hyphenate = rng.random() < 0.5
        b.append(Heading(short_text(rng, 2, 5), 1))
        b.append(Paragraph(prose(rng, (2, 3))))
        for _ in range(rng.randint(2, 3)):
            b.append(Heading(short_text(rng, 2, 5), 2))
            for _ in range(rng.randint(1, 2)):
                b.append(Paragraph(prose(rng, (2, 3))))
    elif kind == "bold_headings":  # a report's: bold, in the body's own size
        b.append(Paragraph(prose(rng, (1, 2))))
        for _ in range(rng.randint(3, 4)):
            b.append(Heading(short_text(rng, 2, 5), 3))
            b.append(Paragraph(prose(rng, (2, 3))))
    elif kind == "two_column":
        page.justify = rng.random() < 0.5
        page.hyphenate = True
        b.append(Heading(short_text(rng, 2, 5), 1))
        for part in range(rng.choice([1, 2])):
            if part:  # a full-width paragraph between two runs of columns
                b.append(Paragraph(prose(rng, (2, 2))))
            n = rng.randint(2, 3) - part
            left = [Paragraph(prose(rng, (2, 4))) for _ in range(n)]
            right = [Paragraph(prose(rng, (2, 4))) for _ in range(rng.randint(1, n + 1))]
            if rng.random() < 0.5:
                right.insert(1, Heading(short_text(rng, 2, 4), 2))
            b.append(Columns(tuple(left), tuple(right)))
    elif kind == "mixed":  # one of each: the drawn-page check
        b.append(Heading(short_text(rng, 2, 4), 1))
        b.append(Paragraph(prose(rng, (1, 2))))
        b.append(Paragraph(prose(rng, (1, 2))))
        b.append(ListBlock(tuple(Item(short_text(rng, 3, 7)) for _ in range(5))))
        b.append(ListBlock(tuple(Item(short_text(rng, 3, 7), 0, f"{k}.")
                                 for k in range(1, 6))))
        b.append(table(rng, 4, 4, ruled=False))
        b.append(Columns((Paragraph(prose(rng, (2, 2))),), (Paragraph(prose(rng, (2, 2))),)))
    else:
        raise ValueError(kind)
    page.pdf = draw(page)  # empty when it does not fit
    return page


KINDS = ("prose", "lists", "table_ruled", "table_unruled", "headings", "two_column")
# a title, two paragraphs, five bullets, five numbered items, a table of 4 columns and 5
# rows without rules, two columns: the page every structure must survive, skewed too
MIXED = "mixed"


# -- drawing ----------------------------------------------------------------------------

A4 = (595.0, 842.0)
_PDFIUM = threading.Lock()
MARGIN = 64.0


class _Pen:
    """Lays text on a reportlab canvas from the top down inside [x0, x1]."""

    def __init__(self, canvas: Any, page: Page, x0: float, x1: float, y: float) -> None:
        self.c, self.page, self.x0, self.x1, self.y = canvas, page, x0, x1, y
        self.rng = random.Random(page.name + f"{x0}")

    def width(self, text: str, font: str | None = None, size: float | None = None) -> float:
        from reportlab.pdfbase.pdfmetrics import stringWidth
        return stringWidth(text, font or self.page.font, size or self.page.size)

    @property
    def leading(self) -> float:
        return self.page.size * 1.3

    def gap(self, lines: float = 0.8) -> None:
        self.y -= self.leading * lines

    def line(self, text: str, x: float | None = None, font: str | None = None,
             size: float | None = None) -> None:
        size = size or self.page.size
        self.y -= size * 1.3 if size == self.page.size else size * 1.25
        self.c.setFont(font or self.page.font, size)
        self.c.drawString(self.x0 if x is None else x, self.y, text)

    def wrap(self, words: list[str], x0: float, x1: float,
             first_indent: float = 0.0) -> list[tuple[list[str], bool, float]]:
        """Words into lines (words, is_last, indent); a long word at a line end is
        split with a hyphen when the page hyphenates."""
        lines: list[tuple[list[str], bool, float]] = []
        cur: list[str] = []
        indent = first_indent
        space = self.width(" ")
        queue = list(words)
        while queue:
            w = queue.pop(0)
            trial = " ".join([*cur, w])
            if self.width(trial) <= x1 - x0 - indent:
                cur.append(w)
                continue
            if self.page.hyphenate and len(w) >= 8 and cur:
                room = x1 - x0 - indent - self.width(" ".join(cur)) - space
                core = w.rstrip(".,;")
                for cut in range(len(core) - 3, 3, -1):
                    if self.width(core[:cut] + "-") <= room:
                        cur.append(core[:cut] + "-")
                        self.page.hyphenated.append(w.rstrip(".,;"))
                        queue.insert(0, w[cut:])
                        w = ""
                        break
                if not w:
                    lines.append((cur, False, indent))
                    cur, indent = [], 0.0
                    continue
            if cur:
                lines.append((cur, False, indent))
            cur, indent = [w], 0.0
        if cur:
            lines.append((cur, True, indent))
        return lines

    def paragraph(self, text: str, x0: float | None = None, first_indent: float = 0.0,
                  hanging: float = 0.0) -> None:
        x0 = self.x0 if x0 is None else x0
        for words, last, indent in self.wrap(text.split(), x0 + hanging, self.x1,
                                             first_indent):
            self.y -= self.leading
            self.c.setFont(self.page.font, self.page.size)
            x = x0 + hanging + indent
            if self.page.justify and not last and len(words) > 1:
                room = self.x1 - x - self.width("".join(words))
                step = room / (len(words) - 1)
                for w in words:
                    self.c.drawString(x, self.y, w)
                    x += self.width(w) + step
            else:
                self.c.drawString(x, self.y, " ".join(words))

    def block(self, block: Block) -> None:
        if isinstance(block, Heading):
            size = self.page.size * {1: 1.9, 2: 1.45}.get(block.level, 1.0)
            self.gap(0.6)
            self.line(block.text, font="Helvetica-Bold", size=size)
            self.gap(0.5)
        elif isinstance(block, Paragraph):
            if self.page.indent_style:
                self.paragraph(block.text, first_indent=self.page.size * 2)
            else:
                self.paragraph(block.text)
                self.gap()
        elif isinstance(block, Lines):
            for text in block.lines:
                self.line(text)
            self.gap()
        elif isinstance(block, ListBlock):
            self.items(block)
            self.gap()
        elif isinstance(block, Table):
            self.table(block)
            self.gap()
        else:
            raise TypeError(block)

    def items(self, block: ListBlock) -> None:
        step = self.page.size * 1.6
        for item in block.items:
            x = self.x0 + item.depth * step * 1.5
            self.y -= self.leading * 0.25
            self.c.setFont(self.page.font, self.page.size)
            top = self.y - self.leading
            self.c.drawString(x, top, item.marker)
            hanging = max(step, self.width(item.marker + "  "))
            self.paragraph(item.text, x0=x, hanging=hanging)

    def table(self, block: Table) -> None:
        size = self.page.size
        cols = len(block.rows[0])
        pad = size * 0.6
        widths = [max(self.width(r[k], size=size) for r in block.rows) + 2 * pad
                  for k in range(cols)]
        total = sum(widths)
        room = self.x1 - self.x0
        if total < room:  # spread the columns over the width, as word processors do
            extra = (room - total) * 0.6 / cols
            widths = [w + extra for w in widths]
        xs = [self.x0]
        for w in widths:
            xs.append(xs[-1] + w)
        row_h = size * (1.9 if block.ruled else 1.6)
        top = self.y
        numeric = [all(_numeric(r[k]) for r in block.rows[1:]) for k in range(cols)]
        for i, row in enumerate(block.rows):
            self.y -= row_h
            font = "Helvetica-Bold" if i == 0 else self.page.font
            self.c.setFont(font, size)
            for k, text in enumerate(row):
                if numeric[k]:
                    self.c.drawRightString(xs[k + 1] - pad, self.y + row_h * 0.3, text)
                else:
                    self.c.drawString(xs[k] + pad, self.y + row_h * 0.3, text)
            if not block.ruled and i == 0:
                self.c.setLineWidth(0.8)
                self.c.line(xs[0], self.y, xs[-1], self.y)
        if block.ruled:
            self.c.setLineWidth(0.7)
            for k in range(len(block.rows) + 1):
                y = top - k * row_h
                self.c.line(xs[0], y, xs[-1], y)
            for x in xs:
                self.c.line(x, top, x, self.y)


def _numeric(text: str) -> bool:
    return any(ch.isdigit() for ch in text) and not any(ch.isalpha() for ch in text)


def draw(page: Page) -> bytes:
    from reportlab.pdfgen import canvas

    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=A4, invariant=1)
    pen = _Pen(c, page, MARGIN, A4[0] - MARGIN, A4[1] - MARGIN)
    for block in page.blocks:
        if isinstance(block, Columns):
            mid = A4[0] / 2
            gutter = 14.0
            top = pen.y
            left = _Pen(c, page, MARGIN, mid - gutter, top)
            right = _Pen(c, page, mid + gutter, A4[0] - MARGIN, top)
            for b in block.left:
                left.block(b)
            for b in block.right:
                right.block(b)
            pen.y = min(left.y, right.y)
        else:
            pen.block(block)
    if pen.y < MARGIN:
        return b""
    c.showPage()
    c.save()
    return buf.getvalue()


# -- pixels -----------------------------------------------------------------------------

def render(page: Page, dpi: int, noisy: bool = False, skew: float = 0.0) -> Any:
    """The page as a grey Pillow image at dpi; `noisy`: as a worn scanner sees it;
    `skew`: turned by that many degrees (counter-clockwise), as a sheet-fed scanner
    takes a page that went in askew."""
    import pypdfium2 as pdfium

    with _PDFIUM:  # PDFium is not thread-safe
        doc = pdfium.PdfDocument(page.pdf)
        try:
            image = doc[0].render(scale=dpi / 72, grayscale=True).to_pil().convert("L")
        finally:
            doc.close()
    if skew:
        from PIL import Image
        image = image.rotate(skew, resample=Image.Resampling.BICUBIC, fillcolor=255)
    if noisy:
        image = scanner_noise(image, random.Random(f"{page.name}-{dpi}"), dpi)
    return image


def scanner_noise(image: Any, rng: random.Random, dpi: int) -> Any:
    """A slight skew, blur, grain, dust specks and JPEG artefacts, all seeded."""
    from PIL import Image, ImageChops, ImageDraw, ImageFilter

    image = image.rotate(rng.uniform(-0.6, 0.6), resample=Image.Resampling.BICUBIC,
                         fillcolor=255, expand=False)
    image = image.filter(ImageFilter.GaussianBlur(dpi / 300 * 0.7))
    w, h = image.size
    grain = Image.frombytes("L", (w, h), rng.randbytes(w * h)).point(lambda v: v // 12)
    image = ImageChops.subtract(image, grain)  # up to 21 grey levels darker, at random
    draw = ImageDraw.Draw(image)
    for _ in range(round(w * h / dpi / dpi * 3)):  # about 300 specks on an A4 page
        x, y = rng.uniform(0, w), rng.uniform(0, h)
        r = rng.uniform(0.2, 1.0) * dpi / 150
        draw.ellipse((x - r, y - r, x + r, y + r), fill=rng.randint(0, 90))
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=55)
    return Image.open(io.BytesIO(buf.getvalue())).convert("L")


# -- what a reader sees ------------------------------------------------------------------

@dataclass
class Shown:
    """A block of rendered Markdown, as a reader sees it."""

    kind: str  # heading, paragraph, item, table
    text: str = ""  # words, whitespace collapsed; a paragraph's lines joined by "\n"
    level: int = 0  # heading level; an item's depth
    ordered: bool = False  # an item of a numbered list
    rows: list[list[str]] = field(default_factory=list)


def shown_blocks(html_text: str) -> list[Shown]:
    """The blocks of HTML from the console's renderer (ocrd/web/render.py), in order:
    headings, paragraphs (line breaks kept as newlines), list items (depth, numbered
    or not; the item's own words, without its sub-lists), tables (cells)."""
    from html.parser import HTMLParser

    out: list[Shown] = []

    class Reader(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.lists: list[bool] = []  # open lists: ordered?
            self.items: list[Shown] = []  # open items
            self.buf: list[str] | None = None
            self.block: Shown | None = None
            self.table: Shown | None = None
            self.cell: list[str] | None = None

        def handle_starttag(self, tag: str, attrs: list) -> None:
            if tag in ("ul", "ol"):
                if self.items and self.buf is not None:
                    self._close_item_text()
                self.lists.append(tag == "ol")
            elif tag == "li":
                item = Shown("item", level=len(self.lists) - 1, ordered=self.lists[-1])
                out.append(item)
                self.items.append(item)
                self.buf = []
            elif tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
                self.block, self.buf = Shown("heading", level=int(tag[1])), []
            elif tag == "p" and not self.items:
                self.block, self.buf = Shown("paragraph"), []
            elif tag == "table":
                self.table = Shown("table")
            elif tag == "tr" and self.table is not None:
                self.table.rows.append([])
            elif tag in ("td", "th"):
                self.cell = []
            elif tag == "br" and self.buf is not None:
                self.buf.append("\n")

        def handle_endtag(self, tag: str) -> None:
            if tag in ("ul", "ol"):
                self.lists.pop()
            elif tag == "li":
                if self.buf is not None:
                    self._close_item_text()
                self.items.pop()
            elif tag in ("h1", "h2", "h3", "h4", "h5", "h6", "p") and self.block is not None:
                self.block.text = _collapse("".join(self.buf or []))
                out.append(self.block)
                self.block, self.buf = None, None
            elif tag in ("td", "th") and self.cell is not None and self.table is not None:
                self.table.rows[-1].append(_collapse("".join(self.cell)))
                self.cell = None
            elif tag == "table" and self.table is not None:
                out.append(self.table)
                self.table = None

        def _close_item_text(self) -> None:
            self.items[-1].text = _collapse("".join(self.buf or []))
            self.buf = None

        def handle_data(self, data: str) -> None:
            data = data.replace("\n", " ")  # a soft line break shows as a space
            if self.cell is not None:
                self.cell.append(data)
            elif self.buf is not None:
                self.buf.append(data)
            elif data.strip() and not self.items and self.table is None:
                out.append(Shown("paragraph", _collapse(data)))

    reader = Reader()
    reader.feed(html_text)
    reader.close()
    return out


def _collapse(text: str) -> str:
    return "\n".join(" ".join(part.split()) for part in text.split("\n")).strip()


def shown(markdown: str) -> list[Shown]:
    """Markdown as the console shows it, read back into blocks."""
    from ocrd.web.render import to_html
    return shown_blocks(to_html(markdown))


def truth_blocks(page: Page) -> list[Shown]:
    """The page's blocks as a reader should see them."""
    out: list[Shown] = []
    for b in page.flat():
        if isinstance(b, Heading):
            out.append(Shown("heading", b.text, b.level))
        elif isinstance(b, Paragraph):
            out.append(Shown("paragraph", b.text))
        elif isinstance(b, Lines):
            out.append(Shown("paragraph", "\n".join(b.lines)))
        elif isinstance(b, ListBlock):
            for item in b.items:
                numbered = item.marker[:-1].isdigit()
                text = item.text if item.marker in BULLETS or numbered else \
                    f"{item.marker} {item.text}"
                out.append(Shown("item", text, item.depth, numbered))
        elif isinstance(b, Table):
            out.append(Shown("table", rows=[list(r) for r in b.rows]))
    return out


def _same(got: str, want: str) -> bool:
    """The same text but for a misread letter or two (the OCR's, not the structure's):
    0.9 of the characters in common."""
    import difflib
    a, b = " ".join(got.split()), " ".join(want.split())
    return a == b or difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= 0.9


def kept_structures(page: Page, markdown: str) -> dict[str, bool]:
    """Which of a mixed page's six structures its Markdown keeps, as a reader sees them:
    the title as the page's `#` heading, both paragraphs, five bullets as one list,
    five items numbered 1 to 5, the table row by row and column by column (its cells'
    words right but for the OCR's misreading of one in ten at most), and the two columns
    each as its own paragraph, left before right."""
    import re

    got = shown(markdown)
    title, first, second, bullets, numbers, table, columns = page.blocks
    assert isinstance(title, Heading) and isinstance(first, Paragraph)
    assert isinstance(second, Paragraph) and isinstance(bullets, ListBlock)
    assert isinstance(numbers, ListBlock) and isinstance(table, Table)
    assert isinstance(columns, Columns)
    paragraphs = [b.text for b in got if b.kind == "paragraph"]
    items = [b for b in got if b.kind == "item"]

    def run(want: ListBlock, ordered: bool) -> bool:
        texts = [i.text for i in want.items]
        for k in range(len(items) - len(texts) + 1):
            window = items[k:k + len(texts)]
            if all(_same(g.text, t) and g.ordered == ordered and g.level == 0
                   for g, t in zip(window, texts, strict=True)):
                return True
        return False

    numbered = re.findall(r"^(\d+)[.)] ", markdown, re.MULTILINE)
    tables = [b for b in got if b.kind == "table"]
    left, right = columns.left[0], columns.right[0]
    assert isinstance(left, Paragraph) and isinstance(right, Paragraph)
    at = {text: k for k, text in enumerate(paragraphs)}
    where = [next((at[p] for p in paragraphs if _same(p, want.text)), None)
             for want in (left, right)]
    return {
        "title": any(b.kind == "heading" and b.level == 1 and _same(b.text, title.text)
                     for b in got),
        "paragraphs": all(any(_same(p, want.text) for p in paragraphs)
                          for want in (first, second)),
        "bullets": run(bullets, ordered=False),
        "numbered": run(numbers, ordered=True) and numbered[:5] == ["1", "2", "3", "4", "5"],
        "table": len(tables) == 1 and len(tables[0].rows) == len(table.rows) and all(
            len(g) == len(w) for g, w in zip(tables[0].rows, table.rows, strict=True))
        and sum(_same(a, b) for g, w in zip(tables[0].rows, table.rows, strict=True)
                for a, b in zip(g, w, strict=True)) >= 0.9 * sum(len(w) for w in table.rows),
        "two_columns": None not in where and where[0] < where[1],  # type: ignore[operator]
    }
