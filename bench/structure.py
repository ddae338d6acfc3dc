"""The Markdown's structure on the CPU engine, measured on pages whose structure is known,
against tesseract's own text output (the baseline: what OCRmyPDF's sidecar holds).

    python -m bench.structure [--quick] [--jobs N] [--kinds prose,lists] [--show NAME]

Pages (tests/structure_pages.py): prose (hyphenation, addresses), lists (bullets, numbers,
letters, nested), ruled and unruled tables of 3-7 columns, headings, two columns; each at
150, 200 and 300 dpi, clean and with scanner noise. Each page is read by tesseract once
(`tsv txt`, as the engine asks), and scored twice from that one run: ocrd's Markdown as
the console renders it, and tesseract's text read as generously as plain text allows
(a blank line ends a paragraph; a line that starts with a bullet or a number starts a
list item; no tables, no headings — its lines carry no sizes or cells).

Scores: table cells exactly right (clean pages, noisy pages), list items recognised (the
item's words as one list item), nesting depth right, paragraph boundaries (F1 over where
blocks start in the page's words), reading order (longest common subsequence of the
words ÷ words in common; right when ≥ 0.97), word recall, headings with the right
level, deliberate line breaks kept (addresses). CPU: tesseract plus ocrd's work on its
output, ocrd's now against the plain parse it replaces (`OLD_COMMIT`), per page side by
side, tesseract run both ways in alternating order on a subset.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from structure_pages import (  # noqa: E402
    KINDS,
    Lines,
    Shown,
    make_page,
    render,
    shown,
    truth_blocks,
)

from bench import second_look  # noqa: E402
from bench.cases import Result  # noqa: E402
from bench.corpus import recall as corpus_recall  # noqa: E402
from ocrd.config.settings import EngineConfig  # noqa: E402
from ocrd.engines import tesseract as tesseract_engine  # noqa: E402
from ocrd.engines import tesseract_tsv  # noqa: E402
from ocrd.engines.base import PageRequest  # noqa: E402
from ocrd.engines.tesseract import TesseractEngine, pnm  # noqa: E402

# main before the structure: tesseract's TSV parsed into plain text and words
OLD_COMMIT = "0277faf"
DPIS = (150, 200, 300)
ORDER_RIGHT = 0.97
_WORD = re.compile(r"\w+")
_MARKER = re.compile(r"^(?:[•·●○◦▪■□‣⁃\-–—*+¢©®«»°eo]|\(?\d{1,3}[.)]|\(?([a-zA-Z])[.)]|"
                     r"\(?[ivx]{1,4}[.)])\s+(?=\S)")


# -- reading a page ----------------------------------------------------------------------


@dataclass
class Read:
    tsv: str
    text: str
    cpu: float  # tesseract's CPU seconds


def tesseract(image: Any, dpi: int, formats: tuple[str, ...] = ("tsv", "txt"),
              lang: str = "eng") -> Read:
    """The engine's tesseract run (same arguments, PNM on stdin, one OMP thread), with
    its CPU time."""
    data = pnm(image)
    cmd = ["tesseract", "stdin", "stdout", "-l", lang, "--psm", "3", "--dpi", str(dpi),
           *formats]
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out,
                                stderr=subprocess.DEVNULL, env=env)
        assert proc.stdin is not None
        proc.stdin.write(data)
        proc.stdin.close()
        _, _, usage = os.wait4(proc.pid, 0)
        out.seek(0)
        raw = out.read().decode("utf-8", errors="replace")
    tsv, text = tesseract_tsv.split(raw)
    return Read(tsv, text, usage.ru_utime + usage.ru_stime)


ENGINE = TesseractEngine(EngineConfig(kind="tesseract"))  # its second look (not started)


def ours(read: Read, image: Any, dpi: int) -> tuple[str, float]:
    """ocrd's Markdown from the run, made as the engine makes it (its pixels: marks,
    ruling lines, strokes, the second look's tesseract run), and the CPU seconds it took
    (this thread's, and the second look's process's)."""
    req = PageRequest(image=image, page_no=1, doc_id="bench", dpi=dpi)
    looked = second_look.cpu()
    t0 = time.thread_time()
    _, markdown, _ = tesseract_engine._structure(
        req, read.tsv, read.text, None, ENGINE._look(req, None),
        tesseract_engine._stroke(req, None))
    return markdown, time.thread_time() - t0 + second_look.cpu() - looked


_old_parse: Any = None
_old_lock = threading.Lock()


def old_parse() -> Any:
    """`parse` of ocrd/engines/tesseract_tsv.py as it was at OLD_COMMIT."""
    global _old_parse
    with _old_lock:
        if _old_parse is None:
            src = subprocess.run(["git", "show", f"{OLD_COMMIT}:ocrd/engines/tesseract_tsv.py"],
                                 cwd=ROOT, capture_output=True, text=True, check=True).stdout
            src = src.replace("from .base import Word", "from ocrd.outputs.page import Word")
            spec = importlib.util.spec_from_loader("old_tesseract_tsv", loader=None)
            assert spec is not None
            module = importlib.util.module_from_spec(spec)
            exec(compile(src, "old_tesseract_tsv.py", "exec"), module.__dict__)  # noqa: S102
            _old_parse = module.parse
    return _old_parse


def plain_cpu(read: Read) -> float:
    t0 = time.thread_time()
    old_parse()(read.tsv)
    return time.thread_time() - t0


# -- tesseract's text, read as plain text ------------------------------------------------


def plain_blocks(text: str) -> list[Shown]:
    """Plain text read as generously as it allows: paragraphs between blank lines, a
    line that starts with a bullet or a number starts a list item."""
    out: list[Shown] = []
    for chunk in re.split(r"\n\s*\n", text.replace("\f", "\n")):
        cur: Shown | None = None
        for line in chunk.split("\n"):
            line = " ".join(line.split())
            if not line:
                continue
            m = _MARKER.match(line)
            if m:
                numbered = line[0].isdigit() or line[:2] == "(" and line[1].isdigit()
                words = line if m.group(1) else line[m.end():]
                cur = Shown("item", words, 0, numbered)
                out.append(cur)
            elif cur is not None:
                cur.text += " " + line
            else:
                cur = Shown("paragraph", line)
                out.append(cur)
    return out


# -- scoring -----------------------------------------------------------------------------


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def block_words(b: Shown) -> list[str]:
    if b.kind == "table":
        return [w for row in b.rows for cell in row for w in words(cell)]
    return words(b.text)


def recall(truth: list[str], got: list[str]) -> float:
    """Share of the truth's words found (as a multiset); 1 without any."""
    found = corpus_recall(truth, got)
    return 1.0 if found is None else found


def lcs(a: list[str], b: list[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def order_score(truth: list[str], got: list[str]) -> float:
    common = recall(truth, got) * len(truth)
    return lcs(truth, got) / common if common else 0.0


def boundaries(blocks: list[Shown], truth_words: list[str]) -> set[int]:
    """Where blocks start, as places in the truth's words (via an alignment)."""
    got: list[str] = []
    starts: list[int] = []
    for b in blocks:
        w = block_words(b)
        if w:
            starts.append(len(got))
            got.extend(w)
    matcher = difflib.SequenceMatcher(None, truth_words, got, autojunk=False)
    to_truth: dict[int, int] = {}
    for a, b, n in matcher.get_matching_blocks():
        for k in range(n):
            to_truth[b + k] = a + k
    out = set()
    for s in starts[1:]:
        for k in range(s, min(s + 3, len(got))):  # the block's first word, or the next
            if k in to_truth:
                out.add(to_truth[k] - (k - s))
                break
    out.discard(0)
    return out


def _norm(text: str) -> str:
    return " ".join(text.split())


def _item_text(text: str) -> str:
    return _norm(text.replace("\n", " "))


def _similar(got: str, want: str) -> bool:
    """The same item, allowing for a misread letter or two (the OCR's, not the
    structure's): 0.9 of the characters in common."""
    a, b = _item_text(got), _item_text(want)
    return a == b or difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= 0.9


@dataclass
class Score:
    cells: int = 0
    cells_right: int = 0
    items: int = 0
    items_found: int = 0
    items_depth: int = 0
    items_extra: int = 0
    tp: int = 0
    fp: int = 0
    fn: int = 0
    headings: int = 0
    headings_right: int = 0
    breaks: int = 0
    breaks_kept: int = 0
    truth_words: int = 0
    words_found: float = 0.0
    order: list[float] = field(default_factory=list)

    def add(self, other: Score) -> None:
        for k, v in vars(other).items():
            if isinstance(v, list):
                getattr(self, k).extend(v)
            else:
                setattr(self, k, getattr(self, k) + v)

    def summary(self) -> dict[str, Any]:
        f1 = 2 * self.tp / (2 * self.tp + self.fp + self.fn) if self.tp else 0.0
        return {
            "table_cells": round(self.cells_right / self.cells, 4) if self.cells else None,
            "list_items": round(self.items_found / self.items, 4) if self.items else None,
            "list_depth": round(self.items_depth / self.items, 4) if self.items else None,
            "false_items": self.items_extra,
            "paragraph_f1": round(f1, 4),
            "headings": round(self.headings_right / self.headings, 4) if self.headings
            else None,
            "breaks_kept": round(self.breaks_kept / self.breaks, 4) if self.breaks else None,
            "word_recall": round(self.words_found / self.truth_words, 4)
            if self.truth_words else None,
            "order_min": round(min(self.order), 4) if self.order else None,
            "order_right": sum(o >= ORDER_RIGHT for o in self.order),
            "pages": len(self.order),
        }


def score(page: Any, got: list[Shown]) -> Score:
    truth = truth_blocks(page)
    s = Score()
    truth_words = [w for b in truth for w in block_words(b)]
    got_words = [w for b in got for w in block_words(b)]
    s.truth_words = len(truth_words)
    s.words_found = recall(truth_words, got_words) * len(truth_words)
    s.order.append(order_score(truth_words, got_words))
    want = {0} | boundaries(truth, truth_words)
    found = {0} | boundaries(got, truth_words)
    s.tp, s.fp, s.fn = len(want & found) - 1, len(found - want), len(want - found)
    tables = [b for b in got if b.kind == "table"]
    for t in (b for b in truth if b.kind == "table"):
        n = sum(len(r) for r in t.rows)
        s.cells += n
        s.cells_right += max((_cells_right(t.rows, g.rows) for g in tables), default=0)
    items = [b for b in got if b.kind == "item"]
    used: set[int] = set()
    for t in (b for b in truth if b.kind == "item"):
        s.items += 1
        for k, g in enumerate(items):
            if k not in used and _similar(g.text, t.text):
                used.add(k)
                s.items_found += 1
                s.items_depth += g.level == t.level and g.ordered == t.ordered
                break
    s.items_extra = len(items) - len(used)
    heads = [b for b in got if b.kind == "heading"]
    for t in (b for b in truth if b.kind == "heading"):
        s.headings += 1
        s.headings_right += any(_norm(g.text) == _norm(t.text) and g.level == t.level
                                for g in heads)
    paragraphs = [b.text for b in got if b.kind == "paragraph"]
    for b in page.flat():
        if isinstance(b, Lines):
            s.breaks += 1
            s.breaks_kept += "\n".join(b.lines) in paragraphs
    return s


def _cells_right(want: list[list[str]], got: list[list[str]]) -> int:
    return sum(1 for r, row in enumerate(want) for c, cell in enumerate(row)
               if r < len(got) and c < len(got[r]) and _norm(got[r][c]) == _norm(cell))


# -- the run -----------------------------------------------------------------------------


@dataclass
class PageResult:
    name: str
    kind: str
    dpi: int
    noisy: bool
    ours: Score
    plain: Score
    tesseract_cpu: float
    ours_cpu: float
    plain_cpu: float
    markdown: str = ""


def corpus(quick: bool, kinds: list[str]) -> list[tuple[str, int, int, bool]]:
    seeds = (1, 2) if quick else (1, 2, 3, 4, 5)
    return [(kind, seed, dpi, noisy) for kind in kinds for seed in seeds for dpi in DPIS
            for noisy in (False, True)]


CACHE: Path | None = None  # --cache: tesseract's output kept between runs (tuning)


def one(kind: str, seed: int, dpi: int, noisy: bool) -> PageResult:
    page = make_page(kind, seed)
    image = render(page, dpi, noisy)
    read = _cached(page, dpi, noisy)
    if read is None:
        read = tesseract(image, dpi)
        if CACHE is not None:
            key = CACHE / f"{_key(page, dpi, noisy)}"
            key.with_suffix(".tsv").write_text(read.tsv)
            key.with_suffix(".txt").write_text(read.text)
    markdown, cpu = ours(read, image, dpi)
    return PageResult(f"{page.name}@{dpi}{'n' if noisy else ''}", kind, dpi, noisy,
                      score(page, shown(markdown)), score(page, plain_blocks(read.text)),
                      read.cpu, cpu, plain_cpu(read), markdown)


def _key(page: Any, dpi: int, noisy: bool) -> str:
    import hashlib
    return hashlib.sha256(page.pdf + f"{dpi}{noisy}".encode()).hexdigest()[:20]


def _cached(page: Any, dpi: int, noisy: bool) -> Read | None:
    if CACHE is None:
        return None
    key = CACHE / _key(page, dpi, noisy)
    if not key.with_suffix(".tsv").exists():
        return None
    return Read(key.with_suffix(".tsv").read_text(), key.with_suffix(".txt").read_text(),
                0.0)


def speed(jobs: int, rounds: int = 2) -> dict[str, Any]:
    """CPU per page, end to end: tesseract with `tsv txt` plus ocrd's structure against
    tesseract with `tsv` plus the plain parse, in alternating order, on a subset."""
    pages = [(kind, 1, dpi) for kind in KINDS for dpi in (150, 300)]
    totals = {"ours": 0.0, "plain": 0.0, "ours_python": 0.0, "plain_python": 0.0}

    def run(spec: tuple[str, int, int]) -> dict[str, float]:
        kind, seed, dpi = spec
        image = render(make_page(kind, seed), dpi)
        got = {"ours": 0.0, "plain": 0.0, "ours_python": 0.0, "plain_python": 0.0}
        for r in range(rounds):
            for side in (("ours", "plain") if r % 2 == 0 else ("plain", "ours")):
                if side == "ours":
                    read = tesseract(image, dpi, ("tsv", "txt"))
                    _, cpu = ours(read, image, dpi)
                else:
                    read = tesseract(image, dpi, ("tsv",))
                    cpu = plain_cpu(read)
                got[side] += read.cpu + cpu
                got[side + "_python"] += cpu
        return got

    with ThreadPoolExecutor(jobs) as pool:
        for got in pool.map(run, pages):
            for k, v in got.items():
                totals[k] += v
    return {"pages": len(pages), "rounds": rounds,
            **{k: round(v, 3) for k, v in totals.items()},
            "ratio": round(totals["ours"] / totals["plain"], 4)}


def measure(quick: bool, jobs: int, kinds: list[str]) -> tuple[list[PageResult], dict]:
    second_look.count()
    specs = corpus(quick, kinds)
    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(lambda s: one(*s), specs))
    return results, speed(jobs, 1 if quick else 2)


def table(results: list[PageResult]) -> list[dict[str, Any]]:
    """Per kind (and all), ocrd against plain text."""
    rows = []
    groups: dict[str, list[PageResult]] = {}
    for r in results:
        groups.setdefault(r.kind, []).append(r)
        groups.setdefault(f"{r.kind} clean" if not r.noisy else f"{r.kind} noisy",
                          []).append(r)
    groups["all"] = results
    groups["all clean"] = [r for r in results if not r.noisy]
    groups["all noisy"] = [r for r in results if r.noisy]
    for name, rs in groups.items():
        for side in ("ours", "plain"):
            s = Score()
            for r in rs:
                s.add(getattr(r, side))
            rows.append({"group": name, "side": side, **s.summary()})
    return rows


def results(quick: bool) -> list[Result]:
    """The bench/run.py case."""
    found, cpu = measure(quick, os.cpu_count() or 1, list(KINDS))
    rows = {(r["group"], r["side"]): r for r in table(found)}
    ours, plain = rows[("all", "ours")], rows[("all", "plain")]
    clean = rows[("all clean", "ours")]
    two = [r for r in found if r.kind == "two_column"]
    right = sum(r.ours.order[0] >= ORDER_RIGHT for r in two)
    plain_right = sum(r.plain.order[0] >= ORDER_RIGHT for r in two)
    details = {"table": list(rows.values()), "cpu": cpu, "pages": len(found)}

    def said(text: str) -> dict[str, Any]:
        return {**details, "summary": text}

    return [
        Result("structure_table_cells_clean", clean["table_cells"], 0.90, ">=",
               said(f"{clean['table_cells']} of the cells exact on clean pages, "
                    f"{rows[('all noisy', 'ours')]['table_cells']} noisy; plain text has "
                    "no cells")),
        Result("structure_list_items", ours["list_items"], 0.95, ">=",
               said(f"items recognised {ours['list_items']} (plain text read generously "
                    f"{plain['list_items']}), depth and numbering right {ours['list_depth']}"
                    f" ({plain['list_depth']})")),
        Result("structure_paragraph_f1", ours["paragraph_f1"], 0.90, ">=",
               said(f"F1 of block boundaries {ours['paragraph_f1']} (plain text "
                    f"{plain['paragraph_f1']})")),
        Result("structure_two_column_order", right / max(1, len(two)), 1.0, ">=",
               said(f"{right} of {len(two)} two-column pages in order (plain text "
                    f"{plain_right})")),
        Result("structure_word_recall_vs_plain", ours["word_recall"] / plain["word_recall"],
               1.0, ">=", said(f"word recall {ours['word_recall']} vs plain text "
                               f"{plain['word_recall']}, {len(found)} pages")),
        Result("structure_cpu_vs_plain", cpu["ratio"], 1.05, "<=",
               said(f"CPU {cpu['ours']} s (tesseract tsv+txt, structure) vs {cpu['plain']} s "
                    f"(tesseract tsv, plain parse), {cpu['pages']} pages x {cpu['rounds']}; "
                    f"structure {cpu['ours_python']} s")),
    ]


STRUCTURE_CASES = {"structure": results}


_COLUMNS = [("table_cells", "table cells exact"), ("list_items", "list items"),
            ("list_depth", "depth + numbering"), ("false_items", "false items"),
            ("paragraph_f1", "paragraph F1"), ("headings", "headings"),
            ("breaks_kept", "breaks kept"), ("word_recall", "word recall"),
            ("order_right", "in order")]


def print_table(rows: list[dict[str, Any]]) -> None:
    """A Markdown table: per group, ocrd / plain text."""
    by = {(r["group"], r["side"]): r for r in rows}
    print("| pages | " + " | ".join(title for _, title in _COLUMNS) + " |")
    print("|---" * (len(_COLUMNS) + 1) + "|")
    for group in dict.fromkeys(r["group"] for r in rows):
        ours, plain = by[(group, "ours")], by[(group, "plain")]
        cells = []
        for key, _ in _COLUMNS:
            a, b = ours[key], plain[key]
            if key == "order_right":
                a, b = f"{a}/{ours['pages']}", f"{b}/{plain['pages']}"
            if key == "breaks_kept" and a is not None:
                b = "n/a"
            cells.append("–" if a is None else f"{a} / {b}")
        print(f"| {group} ({ours['pages']}) | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--show", default="", help="print the Markdown of pages whose name "
                   "contains this")
    p.add_argument("--no-speed", action="store_true")
    p.add_argument("--cache", action="store_true", help="keep tesseract's output in "
                   "bench/out/structure-cache and read it from there (for tuning)")
    args = p.parse_args(argv)
    if args.cache:
        global CACHE
        CACHE = ROOT / "bench" / "out" / "structure-cache"
        CACHE.mkdir(parents=True, exist_ok=True)
    kinds = [k for k in args.kinds.split(",") if k]
    second_look.count()
    t0 = time.time()
    specs = corpus(args.quick, kinds)
    with ThreadPoolExecutor(args.jobs) as pool:
        found = list(pool.map(lambda s: one(*s), specs))
    print_table(table(found))
    for r in found:
        if args.show and args.show in r.name:
            print(f"\n===== {r.name}\n{r.markdown}")
    bad = [r for r in found if r.kind == "two_column" and r.ours.order[0] < ORDER_RIGHT]
    if bad:
        print("two-column pages read out of order:", ", ".join(r.name for r in bad))
    if not args.no_speed:
        print("cpu:", speed(args.jobs, 1 if args.quick else 2))
    print(f"{time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
