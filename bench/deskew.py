"""Deskew (render.deskew): what it costs, how often the angle is right, and whether
cleaning a page's background as well would help — each measured side by side.

    python -m bench.deskew --fetch --mirrors DIR FOLDER
    python -m bench.deskew FOLDER [--jobs N] [--quick] [--only cost,angles,cleaning]

FOLDER holds bench.markdown_corpus's documents (their 300 dpi scans, straight and
skewed 2°: `python -m bench.markdown_corpus FOLDER` makes them) and, after `--fetch`,
the real scans of `bench/deskew_sources.txt` (OCRmyPDF's test resources: letters,
typewriter pages, fax and JBIG2 scans, a page scanned askew) under FOLDER/scans-real.

- cost: every page of the corpus's scans read the daemon's way (rendered, then the
  tesseract engine's reading and Markdown) with deskew and without, in alternating
  order, one page at a time per thread; CPU of each side: rendering, measuring and
  straightening, the layout (this thread's time) and tesseract (its processes'
  rusage), the second look's process counted by its wall time. Prints the ratio of
  the whole (with ÷ without) and the deskew step's own share of a page's CPU.
- angles: how often the skew is measured right (within 0.2°) from the text lines
  (ocrd's, deskew.text_angle) and from the page's edges (`edge_angle` here: lines fit
  to where a dark scanner lid meets the paper). The truth of a real scan is what
  tesseract's word boxes say (the median slope of its lines of four words or more), of
  a corpus page 0; each page is turned by known angles too (to ±14°), on white (a
  scanner with a white lid: no edges to see) and on a dark ground.
- cleaning: word recall of tesseract's reading on scanner-noisy pages (the structure
  pages' noise: blur, grain, dust, JPEG; a tinted form) as they are, with a 3×3 median
  filter, and with the paper made white (what differs little from the paper's own grey
  lifted to white), and the CPU each cleaning costs.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench import markdown_corpus, second_look  # noqa: E402
from ocrd.config.settings import EngineConfig, RenderConfig  # noqa: E402
from ocrd.engines import tesseract as tesseract_engine  # noqa: E402
from ocrd.engines import tesseract_tsv  # noqa: E402
from ocrd.engines.base import PageRequest  # noqa: E402
from ocrd.render import deskew, modes, pages, resolution  # noqa: E402

SOURCES = Path(__file__).with_name("deskew_sources.txt")
RIGHT = 0.2  # degrees: a measured angle this close to the truth is right
TURNS = (0.0, 3.0, -6.5, 11.0, -14.0)  # degrees each page is turned by, besides
_PDFIUM = threading.Lock()  # PDFium is not thread-safe


def fetch(mirrors: Path, folder: Path) -> int:
    out = folder / "scans-real"
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for line in SOURCES.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        repo, commit, path, sha = line.split()
        gd = markdown_corpus.git_dir(mirrors, repo)
        data = subprocess.run(["git", f"--git-dir={gd}", "show", f"{commit}:{path}"],
                              check=True, capture_output=True).stdout
        if hashlib.sha256(data).hexdigest() != sha:
            raise SystemExit(f"{repo} {path}: not the listed file")
        (out / Path(path).name).write_bytes(data)
        n += 1
    return n


# -- pages as the daemon renders them ------------------------------------------------------

ENGINE = tesseract_engine.TesseractEngine(EngineConfig(kind="tesseract"))
RES = resolution.choose(RenderConfig(), ENGINE)


def page_list(paths: list[Path], limit: int | None = None) -> list[tuple[Path, int]]:
    out = []
    for path in paths:
        info = pages.probe(str(path), RES.dpi, 10_000, 10**10, 10**9)
        out.extend((path, i) for i in range(info.pages if limit is None
                                             else min(limit, info.pages)))
    return out


def render(path: Path, index: int) -> pages.RenderedPage:
    with _PDFIUM:
        info = pages.probe(str(path), RES.dpi, 10_000, 10**10, 10**9)
        return pages.render_page(str(path), info, index, RES, 10**9)


def tesseract(page: pages.RenderedPage) -> tuple[str, str, float]:
    """The engine's tesseract run on a page (same arguments, PNM on stdin): TSV, text,
    CPU seconds of the process."""
    args = ["tesseract", "stdin", "stdout", "-l", "eng", "--psm", "3"]
    if page.dpi >= 70:
        args += ["--dpi", str(round(page.dpi))]
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([*args, "tsv", "txt"], stdin=subprocess.PIPE, stdout=out,
                                stderr=subprocess.DEVNULL,
                                env={**os.environ, "OMP_THREAD_LIMIT": "1"})
        assert proc.stdin is not None
        proc.stdin.write(page.pnm_header())
        proc.stdin.write(bytes(page.data))
        proc.stdin.close()
        _, _, usage = os.wait4(proc.pid, 0)
        out.seek(0)
        raw = out.read().decode("utf-8", errors="replace")
    tsv, text = tesseract_tsv.split(raw)
    return tsv, text, usage.ru_utime + usage.ru_stime


def layout(page: pages.RenderedPage, tsv: str, text: str) -> tuple[str, float]:
    """The engine's Markdown from its reading, and its CPU: this thread's, and the
    second look's process's."""
    req = PageRequest(image=None, rendered=page, page_no=1, doc_id="bench", dpi=page.dpi)
    looked = second_look.cpu()
    t0 = time.thread_time()
    _, md, _ = tesseract_engine._structure(req, tsv, text, None, ENGINE._look(req, None),
                                           tesseract_engine._stroke(req, None))
    return md, time.thread_time() - t0 + second_look.cpu() - looked


# -- cost ----------------------------------------------------------------------------------


@dataclass
class Cost:
    render: float = 0.0
    deskew: float = 0.0
    tesseract: float = 0.0
    layout: float = 0.0

    @property
    def total(self) -> float:
        return self.render + self.deskew + self.tesseract + self.layout

    def add(self, other: Cost) -> None:
        for k in vars(self):
            setattr(self, k, getattr(self, k) + getattr(other, k))


def read_page(path: Path, index: int, straighten: bool) -> Cost:
    cost = Cost()
    t = time.thread_time()
    page = render(path, index)
    cost.render = time.thread_time() - t
    if straighten:
        t = time.thread_time()
        page, _ = deskew.deskewed(page, 10**9)
        cost.deskew = time.thread_time() - t
    tsv, text, cost.tesseract = tesseract(page)
    _, cost.layout = layout(page, tsv, text)
    return cost


def cost(folder: Path, jobs: int, quick: bool) -> dict[str, Any]:
    scans = sorted((folder / "scans").glob("*.pdf"))
    todo = page_list(scans, 2 if quick else None)
    sides = {"with": Cost(), "without": Cost()}
    by_kind: dict[str, dict[str, Cost]] = {}

    def one(k_spec: tuple[int, tuple[Path, int]]) -> tuple[str, Cost, Cost]:
        k, (path, index) = k_spec
        got = {}
        for side in (("with", "without") if k % 2 == 0 else ("without", "with")):
            got[side] = read_page(path, index, side == "with")
        kind = "skewed" if path.stem.endswith("-skewed") else "straight"
        return kind, got["with"], got["without"]

    with ThreadPoolExecutor(jobs) as pool:
        for kind, with_, without in pool.map(one, enumerate(todo)):
            sides["with"].add(with_)
            sides["without"].add(without)
            kinds = by_kind.setdefault(kind, {"with": Cost(), "without": Cost()})
            kinds["with"].add(with_)
            kinds["without"].add(without)
    out: dict[str, Any] = {"pages": len(todo)}
    for name, pair in [("all", sides), *by_kind.items()]:
        w, wo = pair["with"], pair["without"]
        out[name] = {"ratio": round(w.total / wo.total, 4),
                     "deskew_share": round(w.deskew / wo.total, 4),
                     "with": {k: round(v, 2) for k, v in vars(w).items()},
                     "without": {k: round(v, 2) for k, v in vars(wo).items()}}
    return out


# -- angles --------------------------------------------------------------------------------


def word_angle(tsv: str) -> float | None:
    """The skew tesseract's word boxes say: the median (by words) of the slopes of its
    lines of four words or more, fit through the words' middles."""
    lines: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    for row in tsv.splitlines()[1:]:
        cols = row.split("\t")
        if len(cols) != 12 or cols[0] != "5" or not cols[11].strip():
            continue
        left, top, width, height = (int(v) for v in cols[6:10])
        lines.setdefault(tuple(cols[1:5]), []).append((left + width / 2, top + height / 2))
    slopes: list[float] = []
    for points in lines.values():
        if len(points) < 4:
            continue
        mx = statistics.mean(x for x, _ in points)
        my = statistics.mean(y for _, y in points)
        sxx = sum((x - mx) ** 2 for x, _ in points)
        if sxx <= 0:
            continue
        slope = sum((x - mx) * (y - my) for x, y in points) / sxx
        slopes.extend([-math.degrees(math.atan(slope))] * len(points))
    return statistics.median(slopes) if len(slopes) >= 12 else None


def edge_angle(grey: Any) -> float | None:
    """The skew of the paper's edges against a dark scanner lid: on each side, where
    the dark ground running in from the image's border meets the paper, row by row (or
    column by column), a line fit through those points; the median of the sides that
    have enough of them. None when no side shows the paper's edge."""
    from PIL import Image

    w, h = grey.size
    dark = grey.point(lambda v: 255 if v < 80 else 0)
    rows = [dark.crop((0, y, w, y + 1)).tobytes() for y in range(0, h, 2)]
    cols_img = dark.transpose(Image.Transpose.TRANSPOSE)
    cols = [cols_img.crop((0, x, h, x + 1)).tobytes() for x in range(0, w, 2)]

    def first_paper(line: bytes) -> int | None:
        for k, v in enumerate(line):
            if not v:
                return k if k >= 3 else None
        return None

    fits = []
    for series, step, sign in ((rows, 2, 1), ([r[::-1] for r in rows], 2, -1),
                               (cols, 2, -1), ([c[::-1] for c in cols], 2, 1)):
        pts = [(k * step, e) for k, line in enumerate(series)
               if (e := first_paper(line)) is not None]
        if len(pts) < 0.3 * len(series):
            continue
        # robust: the middle half of the pairwise slopes of points far apart
        pts.sort()
        half = len(pts) // 2
        slopes = sorted((b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(pts[:half], pts[half:],
                                                                      strict=False)
                        if b[0] != a[0])
        if slopes:
            fits.append(sign * math.degrees(math.atan(slopes[len(slopes) // 2])))
    return round(statistics.median(fits), 1) if fits else None


@dataclass
class Tally:
    right: int = 0
    wrong: int = 0
    none: int = 0
    errors: list[float] = field(default_factory=list)

    def count(self, got: float | None, truth: float) -> None:
        if got is None:
            self.none += 1
            return
        err = abs(got - truth)
        self.errors.append(err)
        if err <= RIGHT:
            self.right += 1
        else:
            self.wrong += 1

    def summary(self) -> str:
        n = self.right + self.wrong + self.none
        mean = statistics.mean(self.errors) if self.errors else float("nan")
        return (f"right {self.right}/{n}, wrong {self.wrong}, no answer {self.none}, "
                f"mean error {mean:.2f}°")


def angles(folder: Path, jobs: int, quick: bool) -> dict[str, dict[str, Tally]]:
    from PIL import Image, ImageChops

    real = sorted((folder / "scans-real").glob("*"))
    corpus = sorted(p for p in (folder / "scans").glob("*.pdf")
                    if not p.stem.endswith("-skewed"))
    todo = [(p, i, True) for p, i in page_list(real, 2 if quick else 3)] + \
        [(p, i, False) for p, i in page_list(corpus, 1 if quick else 2)]
    tallies: dict[str, dict[str, Tally]] = {}
    lock = threading.Lock()

    def one(spec: tuple[Path, int, bool]) -> None:
        path, index, is_real = spec
        page = render(path, index)
        truth = 0.0
        if is_real:
            tsv, _, _ = tesseract(page)
            found = word_angle(tsv)
            if found is None or abs(found) > 2:  # a page lying on its side: no skew
                return
            truth = found
        small = deskew.reduced(page)  # as ocrd measures it
        rng = random.Random(f"{path.name}-{index}")
        for turn in TURNS:
            if abs(truth + turn) > deskew.MAX_ANGLE:
                continue
            for ground in ("white", "dark"):
                fill = 255 if ground == "white" else 35
                pad = Image.new("L", (small.width + 80, small.height + 80), 255)
                pad.paste(small, (40, 40))
                if ground == "dark":  # the paper on a dark lid, a margin of it around
                    pad = Image.new("L", (small.width + 120, small.height + 120), fill)
                    pad.paste(small, (60, 60))
                turned = pad.rotate(turn, resample=Image.Resampling.BILINEAR, expand=True,
                                    fillcolor=fill)
                grain = Image.frombytes("L", turned.size, rng.randbytes(
                    turned.width * turned.height)).point(lambda v: v // 16)
                turned = ImageChops.subtract(turned, grain)
                key = ("real scans" if is_real else "corpus pages") + f", {ground} ground"
                text = deskew.text_angle(turned)
                edge = edge_angle(turned)
                with lock:
                    by = tallies.setdefault(key, {"text lines": Tally(), "page edges": Tally()})
                    by["text lines"].count(text, truth + turn)
                    by["page edges"].count(edge, truth + turn)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, todo))
    return tallies


# -- cleaning ------------------------------------------------------------------------------


def _median(image: Any) -> Any:
    from PIL import ImageFilter
    return image.filter(ImageFilter.MedianFilter(3))


def _whiten(image: Any) -> Any:
    paper = modes.paper(image.reduce(4))
    return image.point([255 if v >= paper - 40 else v for v in range(256)])


CLEANINGS = {"as scanned": None, "median 3x3": _median, "paper made white": _whiten}


def cleaning(folder: Path, jobs: int, quick: bool) -> dict[str, Any]:
    from structure_pages import make_page, truth_blocks
    from structure_pages import render as draw_page

    seeds = (1,) if quick else (1, 2, 3)
    specs: list[tuple[str, Any, list[str]]] = []
    for kind in ("prose", "lists", "table_unruled", "two_column"):
        for seed in seeds:
            page = make_page(kind, seed)
            truth = [w for b in truth_blocks(page) for w in markdown_corpus.words(
                b.text + " " + " ".join(c for r in b.rows for c in r))]
            for dpi in (200, 300):
                specs.append((f"{page.name}@{dpi}", (page, dpi), truth))
    form = folder / "scans" / "table_mislabeled_as_picture.pdf"
    if form.exists():
        truth = [w for b in markdown_corpus.blocks(
            (folder / "table_mislabeled_as_picture.md").read_text())
            for w in markdown_corpus.block_words(b)]
        specs.append(("tinted form", (form, 0), truth))
    totals = {name: {"words": 0.0, "truth": 0, "clean_cpu": 0.0, "tesseract_cpu": 0.0}
              for name in CLEANINGS}

    def one(spec: tuple[str, Any, list[str]]) -> dict[str, tuple[float, int, float, float]]:
        _, source, truth = spec
        if isinstance(source[0], Path):
            base = render(*source)
        else:
            image = draw_page(source[0], source[1], noisy=True)
            base = pages.RenderedPage(0, image.width, image.height, image.tobytes(),
                                      float(source[1]), mode="L")
        out = {}
        for name, clean in CLEANINGS.items():
            page = base
            t = time.thread_time()
            if clean is not None:
                image = clean(base.to_image())
                page = replace(base, data=image.tobytes())
            cpu = time.thread_time() - t
            _, text, tcpu = tesseract(page)
            got = markdown_corpus.recall(truth, markdown_corpus.Counter(
                markdown_corpus.words(text)))
            out[name] = (got * len(truth), len(truth), cpu, tcpu)
        return out

    with ThreadPoolExecutor(jobs) as pool:
        for got in pool.map(one, specs):
            for name, (words, n, cpu, tcpu) in got.items():
                t = totals[name]
                t["words"] += words
                t["truth"] += n
                t["clean_cpu"] += cpu
                t["tesseract_cpu"] += tcpu
    return {name: {"word_recall": round(t["words"] / t["truth"], 4),
                   "clean_cpu_share": round(t["clean_cpu"] / t["tesseract_cpu"], 4),
                   "tesseract_cpu": round(t["tesseract_cpu"], 1)}
            for name, t in totals.items()} | {"pages": len(specs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path)
    p.add_argument("--fetch", action="store_true")
    p.add_argument("--mirrors", type=Path)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default="cost,angles,cleaning")
    args = p.parse_args(argv)
    if args.fetch:
        if args.mirrors is None:
            p.error("--fetch needs --mirrors")
        print(f"{fetch(args.mirrors, args.folder)} scans in {args.folder / 'scans-real'}")
        return 0
    ENGINE.binary = ENGINE.binary or "tesseract"
    second_look.count()
    only = set(args.only.split(","))
    if "cost" in only:
        t0 = time.time()
        c = cost(args.folder, args.jobs, args.quick)
        print(f"cost ({c['pages']} pages, {time.time() - t0:.0f} s):")
        for name in ("all", "straight", "skewed"):
            if name in c:
                r = c[name]
                print(f"  {name}: CPU with deskew / without {r['ratio']}, the deskew step "
                      f"{r['deskew_share']:.2%} of a page; with {r['with']}, without "
                      f"{r['without']}")
    if "angles" in only:
        t0 = time.time()
        tallies = angles(args.folder, args.jobs, args.quick)
        print(f"angles (right: within {RIGHT}°; turned by {TURNS}; {time.time() - t0:.0f} s):")
        for key, by in sorted(tallies.items()):
            for method, tally in by.items():
                print(f"  {key}, {method}: {tally.summary()}")
    if "cleaning" in only:
        t0 = time.time()
        result = cleaning(args.folder, args.jobs, args.quick)
        print(f"cleaning ({result.pop('pages')} pages, {time.time() - t0:.0f} s):")
        for name, r in result.items():
            print(f"  {name}: word recall {r['word_recall']}, cleaning CPU "
                  f"{r['clean_cpu_share']:.2%} of tesseract's ({r['tesseract_cpu']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
