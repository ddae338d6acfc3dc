"""The Markdown's structure on real documents whose Markdown is known, read as scans.

    python -m bench.markdown_corpus --fetch --mirrors DIR FOLDER
    python -m bench.markdown_corpus FOLDER [--jobs N] [--only NAME,...] [--show NAME]
                                           [--deskew on|off|both] [--cache]

The corpus (`bench/markdown_corpus_sources.txt`: repository, commit, path and sha256 of
each PDF and of its ground-truth Markdown) is docling's test set: born-digital PDFs
(papers, a report, forms, a handbook, office documents) whose Markdown docling's
maintainers checked in. It is never checked in here: `--fetch` copies it out of a local
clone (`DIR/OWNER+NAME/repo` or `DIR/OWNER+NAME`, as `fetch` or `git clone --mirror`
leaves it) and checks each file's hash.

Each PDF is rasterised at 300 dpi (grey, as a scanner delivers it) into an image-only
PDF, so that the OCR must read every word, and again with every page skewed by 2°
(alternately counter-clockwise and clockwise, as sheet-fed scanners skew). Each page
goes the daemon's way: probed and rendered as ocrd renders a scan, straightened
(`render.deskew`) or not, read by the tesseract engine (its defaults; tesseract's
output is kept by the image's hash under bench/out/markdown-corpus-cache with
`--cache`, so that changes after tesseract are scored in seconds), and the pages'
Markdown joined into the document's.

Scores, against the truth, over the whole set: headings found (a heading of the same
text, 0.8 of its characters in common) among those whose words were read at all (0.8 of
them anywhere in the output), list items likewise, headings and items that stand for
nothing in the truth ("extra"), tables found (a table of ours holding half of the truth
table's words or more) and their cell cover (the truth's cells found in the row of ours
that matches theirs best), word recall (the truth's words found, as a multiset) and
reading order (the edit distance between the truth's word sequence and ours, over the
longer one's length: 0 is the same order).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import hashlib
import io
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOURCES = Path(__file__).with_name("markdown_corpus_sources.txt")
CACHE = ROOT / "bench" / "out" / "markdown-corpus-cache"
DPI = 300
SKEW = 2.0
SIMILAR = 0.8  # characters in common for a heading or an item to be "the same"
READ = 0.8  # share of a heading's or item's words found anywhere: its text was read
TABLE_FOUND = 0.5  # share of a truth table's words in one table of ours
_WORD = re.compile(r"\w+")
# what leads a list item's text but is its marker, not its words: a check box, or a
# glyph the truth's own reading made a letter or a code of ("r", "SM590000")
_BOXES = re.compile(r"^\s*(?:\[[ xX]\]|[☐☑☒]|SM590000\b|[a-z]\s(?=[A-Z]))\s*")


# -- the corpus --------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    repo: str
    commit: str
    pdf: str
    pdf_sha: str
    truth: str
    truth_sha: str

    @property
    def name(self) -> str:
        return Path(self.pdf).stem


def sources() -> list[Source]:
    out = []
    for line in SOURCES.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            out.append(Source(*line.split()))
    return out


def git_dir(mirrors: Path, repo: str) -> Path:
    base = mirrors / repo.replace("/", "+")
    for cand in (base / "repo", base, mirrors / repo):
        if cand.exists():
            return cand
    raise SystemExit(f"no clone of {repo} under {mirrors}")


def fetch(mirrors: Path, folder: Path) -> int:
    """Copy the listed PDFs and their truths into folder, each checked by its hash."""
    folder.mkdir(parents=True, exist_ok=True)
    for src in sources():
        gd = git_dir(mirrors, src.repo)
        git = ["git", f"--git-dir={gd}" if (gd / "HEAD").exists() else
               f"--git-dir={gd / '.git'}", "show"]
        for path, sha, suffix in ((src.pdf, src.pdf_sha, ".pdf"), (src.truth, src.truth_sha,
                                                                    ".md")):
            data = subprocess.run([*git, f"{src.commit}:{path}"], check=True,
                                  capture_output=True).stdout
            if hashlib.sha256(data).hexdigest() != sha:
                raise SystemExit(f"{src.repo} {path}: not the listed file")
            (folder / (src.name + suffix)).write_bytes(data)
    return len(sources())


def scans(folder: Path) -> None:
    """FOLDER/scans/NAME.pdf (straight) and NAME-skewed.pdf: every page an image at DPI,
    made once."""
    import pypdfium2 as pdfium
    from PIL import Image

    out = folder / "scans"
    out.mkdir(exist_ok=True)
    for n, src in enumerate(sources()):
        straight, skewed = out / f"{src.name}.pdf", out / f"{src.name}-skewed.pdf"
        if straight.exists() and skewed.exists():
            continue
        doc = pdfium.PdfDocument(str(folder / f"{src.name}.pdf"))
        try:
            images = [doc[k].render(scale=DPI / 72, grayscale=True).to_pil().convert("L")
                      for k in range(len(doc))]
        finally:
            doc.close()
        turned = [im.rotate(SKEW if (n + k) % 2 == 0 else -SKEW,
                            resample=Image.Resampling.BICUBIC, fillcolor=255)
                  for k, im in enumerate(images)]
        for path, pages in ((straight, images), (skewed, turned)):
            buf = io.BytesIO()
            pages[0].save(buf, "PDF", resolution=DPI, save_all=True,
                          append_images=pages[1:])
            path.write_bytes(buf.getvalue())


# -- reading the scans as the daemon does -------------------------------------------------


async def engine(jobs: int, cache: Path | None) -> Any:
    from ocrd.config.settings import EngineConfig
    from ocrd.engines.tesseract import TesseractEngine

    eng = TesseractEngine(EngineConfig(kind="tesseract", tesseract={"workers": jobs}))
    await eng.start()
    if cache is not None:
        run = eng._tesseract
        cache.mkdir(parents=True, exist_ok=True)

        async def cached(image: tuple[bytes, Any], args: list[str]) -> bytes:
            key = hashlib.sha256(" ".join(args).encode() + image[0])
            key.update(image[1])
            path = cache / key.hexdigest()
            if path.exists():
                return path.read_bytes()
            out = await run(image, args)
            path.write_bytes(out)
            return out

        eng._tesseract = cached  # type: ignore[method-assign]
    return eng


async def read(eng: Any, pdf: Path, deskew: bool) -> tuple[str, list[float | None]]:
    """The document's Markdown, page by page as the daemon makes it, and each page's
    skew as measured (None: not measured)."""
    from ocrd.config.settings import RenderConfig
    from ocrd.engines.base import PageRequest
    from ocrd.render import pages, resolution

    res = resolution.choose(RenderConfig(), eng)
    info = pages.probe(str(pdf), res.dpi, 10_000, 10**10, 10**9)

    async def page(i: int) -> tuple[str, float | None]:
        if deskew:
            from ocrd.render import deskew as straighten
            rendered, skew = straighten.render_straight_page(str(pdf), info, i, res, 10**9,
                                                             True)
        else:
            rendered, skew = pages.render_page(str(pdf), info, i, res, 10**9), None
        out = await eng.ocr(PageRequest(image=None, rendered=rendered, page_no=i + 1,
                                        doc_id=pdf.name, dpi=rendered.dpi))
        return out.text, skew.angle if skew is not None else None

    got = await asyncio.gather(*(page(i) for i in range(info.pages)))
    return "\n\n".join(md for md, _ in got), [s for _, s in got]


# -- Markdown as blocks ------------------------------------------------------------------


@dataclass
class Block:
    kind: str  # heading, item, table, paragraph
    text: str = ""
    ordered: bool = False
    rows: list[list[str]] = field(default_factory=list)


def blocks(markdown: str) -> list[Block]:
    """The Markdown's headings, list items (their own words, not their sub-lists'),
    tables and paragraphs, in order; comments and pictures left out."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    out: list[Block] = []
    lists: list[bool] = []
    item: Block | None = None
    table: Block | None = None
    heading = False
    for t in tokens:
        if t.type in ("bullet_list_open", "ordered_list_open"):
            lists.append(t.type == "ordered_list_open")
        elif t.type in ("bullet_list_close", "ordered_list_close"):
            lists.pop()
        elif t.type == "list_item_open":
            item = Block("item", ordered=lists[-1])
            out.append(item)
        elif t.type == "list_item_close":
            item = None
        elif t.type == "heading_open":
            heading = True
        elif t.type == "table_open":
            table = Block("table")
        elif t.type == "table_close" and table is not None:
            out.append(table)
            table = None
        elif t.type == "tr_open" and table is not None:
            table.rows.append([])
        elif t.type == "inline":
            text = _plain(t)
            if table is not None:
                table.rows[-1].append(text)
            elif heading:
                out.append(Block("heading", text))
                heading = False
            elif item is not None:
                item.text = f"{item.text} {text}".strip()
            else:
                out.append(Block("paragraph", text))
    return out


def _plain(inline: Any) -> str:
    parts = []
    for c in inline.children or []:
        if c.type in ("text", "code_inline"):
            parts.append(c.content)
        elif c.type in ("softbreak", "hardbreak"):
            parts.append(" ")
    return " ".join("".join(parts).split())


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def block_words(b: Block) -> list[str]:
    if b.kind == "table":
        return [w for row in b.rows for cell in row for w in words(cell)]
    return words(b.text)


def _norm(text: str) -> str:
    return " ".join(words(_BOXES.sub("", text)))


def similar(a: str, b: str) -> bool:
    x, y = _norm(a), _norm(b)
    if x == y:
        return True
    if not x or not y or min(len(x), len(y)) < SIMILAR * max(len(x), len(y)):
        return False
    return difflib.SequenceMatcher(None, x, y, autojunk=False).ratio() >= SIMILAR


def recall(truth: list[str], got: Counter[str]) -> float:
    if not truth:
        return 1.0
    have = Counter(got)
    hit = 0
    for w in truth:
        if have[w] > 0:
            have[w] -= 1
            hit += 1
    return hit / len(truth)


def edit_distance(a: list[str], b: list[str]) -> int:
    """Levenshtein distance between two word sequences, bit-parallel (Myers, in
    Hyyrö's form): a row of the table at a time, as one integer."""
    if not a or not b:
        return len(a) + len(b)
    m = len(a)
    full = (1 << m) - 1
    last = 1 << (m - 1)
    peq: dict[str, int] = {}
    for i, w in enumerate(a):
        peq[w] = peq.get(w, 0) | (1 << i)
    pv, mv, score = full, 0, m
    for w in b:
        eq = peq.get(w, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | (~(xh | pv) & full)
        mh = pv & xh
        if ph & last:
            score += 1
        elif mh & last:
            score -= 1
        ph = ((ph << 1) | 1) & full
        mh = (mh << 1) & full
        pv = mh | (~(xv | ph) & full)
        mv = ph & xv
    return score


# -- scoring -----------------------------------------------------------------------------


@dataclass
class Score:
    headings: int = 0
    headings_read: int = 0
    headings_found: int = 0
    headings_extra: int = 0
    items: int = 0
    items_read: int = 0
    items_found: int = 0
    items_extra: int = 0
    tables: int = 0
    tables_found: int = 0
    cover: list[float] = field(default_factory=list)  # per truth table (0 when not found)
    truth_words: int = 0
    words_found: float = 0.0
    order: list[tuple[int, int]] = field(default_factory=list)  # (distance, length)

    def add(self, other: Score) -> None:
        for k, v in vars(other).items():
            if isinstance(v, list):
                getattr(self, k).extend(v)
            else:
                setattr(self, k, getattr(self, k) + v)

    def summary(self) -> dict[str, Any]:
        def share(a: float, b: float) -> float | None:
            return round(a / b, 3) if b else None
        found = [c for c in self.cover if c > 0]
        return {
            "headings": share(self.headings_found, self.headings_read),
            "headings_n": f"{self.headings_found}/{self.headings_read}/{self.headings}",
            "headings_extra": self.headings_extra,
            "items": share(self.items_found, self.items_read),
            "items_n": f"{self.items_found}/{self.items_read}/{self.items}",
            "items_extra": self.items_extra,
            "tables": share(self.tables_found, self.tables),
            "tables_n": f"{self.tables_found}/{self.tables}",
            "cover": round(sum(found) / len(found), 3) if found else None,
            "word_recall": share(self.words_found, self.truth_words),
            "order": round(sum(d for d, _ in self.order) / sum(n for _, n in self.order), 3)
            if self.order else None,
        }


def score(truth_md: str, ours_md: str) -> Score:
    truth, ours = blocks(truth_md), blocks(ours_md)
    s = Score()
    truth_words = [w for b in truth for w in block_words(b)]
    our_words = [w for b in ours for w in block_words(b)]
    bag = Counter(our_words)
    s.truth_words = len(truth_words)
    s.words_found = recall(truth_words, bag) * len(truth_words)
    s.order.append((edit_distance(truth_words, our_words),
                    max(len(truth_words), len(our_words))))
    for kind in ("heading", "item"):
        want = [b for b in truth if b.kind == kind]
        got = [b for b in ours if b.kind == kind]
        used: set[int] = set()
        read = found = 0
        for t in want:
            if recall(words(_BOXES.sub("", t.text)), bag) < READ:
                continue
            read += 1
            for k, g in enumerate(got):
                if k not in used and similar(g.text, t.text):
                    used.add(k)
                    found += 1
                    break
        extra = sum(1 for k, g in enumerate(got) if k not in used
                    and not any(similar(g.text, t.text) for t in truth))
        if kind == "heading":
            s.headings, s.headings_read, s.headings_found = len(want), read, found
            s.headings_extra = extra
        else:
            s.items, s.items_read, s.items_found, s.items_extra = len(want), read, found, \
                extra
    our_tables = [b for b in ours if b.kind == "table"]
    for t in (b for b in truth if b.kind == "table"):
        s.tables += 1
        want = block_words(t)
        best, share = None, 0.0
        for g in our_tables:
            got = recall(want, Counter(block_words(g)))
            if got > share:
                best, share = g, got
        if best is None or share < TABLE_FOUND:
            s.cover.append(0.0)
            continue
        s.tables_found += 1
        s.cover.append(cell_cover(t.rows, best.rows))
    return s


def cell_cover(want: list[list[str]], got: list[list[str]]) -> float:
    """The share of the truth's cells (not empty) found in the row of ours that holds
    most of that row's cells."""
    total = hit = 0
    for row in want:
        cells = [c for c in row if _norm(c)]
        total += len(cells)
        if not cells:
            continue
        hit += max((sum(1 for c in cells if any(similar(c, g) for g in grow))
                    for grow in got), default=0)
    return hit / total if total else 1.0


# -- the run -----------------------------------------------------------------------------


async def run(folder: Path, jobs: int, only: list[str], deskew_modes: list[bool],
              cache: Path | None, show: str) -> dict[tuple[str, bool], dict[str, Score]]:
    scans(folder)
    eng = await engine(jobs, cache)
    results: dict[tuple[str, bool], dict[str, Score]] = {}
    for src in sources():
        if only and src.name not in only:
            continue
        truth = (folder / f"{src.name}.md").read_text()
        for variant in ("straight", "skewed"):
            pdf = folder / "scans" / (src.name + ("-skewed" if variant == "skewed" else "")
                                      + ".pdf")
            for on in deskew_modes:
                t0 = time.time()
                md, skews = await read(eng, pdf, on)
                s = score(truth, md)
                results.setdefault((variant, on), {})[src.name] = s
                print(f"{src.name} {variant} deskew={'on' if on else 'off'}: "
                      f"{s.summary()} skews={skews} {time.time() - t0:.0f} s", flush=True)
                if show and show in src.name:
                    print(md)
    return results


_COLUMNS = [("headings", "headings found / read"), ("headings_n", "(n)"),
            ("headings_extra", "extra headings"), ("items", "list items found / read"),
            ("items_n", "(n)"), ("items_extra", "extra items"), ("tables", "tables found"),
            ("tables_n", "(n)"), ("cover", "cell cover"), ("word_recall", "word recall"),
            ("order", "order distance")]


def print_table(results: dict[tuple[str, bool], dict[str, Score]], label: str) -> None:
    print("| pages | " + " | ".join(t for _, t in _COLUMNS) + " |")
    print("|---" * (len(_COLUMNS) + 1) + "|")
    for (variant, on), by_doc in results.items():
        total = Score()
        for s in by_doc.values():
            total.add(s)
        row = total.summary()
        name = f"{label} {variant}, deskew {'on' if on else 'off'}"
        print(f"| {name} | " + " | ".join("–" if row[k] is None else str(row[k])
                                          for k, _ in _COLUMNS) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path)
    p.add_argument("--fetch", action="store_true", help="copy the corpus into FOLDER")
    p.add_argument("--mirrors", type=Path, help="with --fetch: the folder of local clones")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--only", default="", help="document names, comma-separated")
    p.add_argument("--show", default="", help="print the Markdown of documents whose "
                   "name contains this")
    p.add_argument("--deskew", choices=("on", "off", "both"), default="both")
    p.add_argument("--cache", nargs="?", type=Path, const=CACHE, help="keep tesseract's "
                   f"output in this folder ({CACHE.relative_to(ROOT)} without one) and read "
                   "it from there")
    p.add_argument("--label", default="ocrd", help="the table rows' first word")
    args = p.parse_args(argv)
    if args.fetch:
        if args.mirrors is None:
            p.error("--fetch needs --mirrors")
        print(f"{fetch(args.mirrors, args.folder)} documents in {args.folder}")
        return 0
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.deskew]
    t0 = time.time()
    results = asyncio.run(run(args.folder, args.jobs, [n for n in args.only.split(",") if n], modes,
                  args.cache, args.show))
    print_table(results, args.label)
    print(f"{time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
