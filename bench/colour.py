"""Grey against colour: what tesseract reads from a page rendered grey (as ocrd's
tesseract engine gets it: `page_mode` L, PDFium rendering grey) and from the same page
rendered in colour, per kind of page, and what each costs.

    python -m bench.colour FILE_OR_FOLDER... [--max-pages N]

Only pages with colour are measured (on the others both are the same picture). A page is
a *photo* (an image file without a scanner's resolution: a camera's), a *scan* (an image
stating 150 dpi or more, or a PDF page that is one image) or *born-digital* (a PDF page
drawn from text and vectors). Truth: `bench/truth/SOURCE/NAME.txt` (typed from the
picture, for the photos), `NAME.txt` beside the file, else `pdftotext` of a born-digital page
(20 words at least); a page without truth counts words read with a confidence of 80 or
more. Printed per kind: pages, word recall grey → colour, the words read well, tesseract's
CPU seconds (the child's own), and what the picture weighs (colour: 3 bytes a pixel, grey
1); then per page, and the policies: always grey (ocrd before), always colour, colour
for photos and scans only, and grey first with colour read too where the grey reading is
weak (keeping the better).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.corpus import recall, words

ROOT = Path(__file__).resolve().parent.parent
TRUTH = Path(__file__).resolve().parent / "truth"
SUFFIXES = {".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp", ".bmp", ".gif"}
WELL = 80.0


@dataclass
class Reading:
    words: list[str]
    well: int  # words read with a confidence of WELL or more
    conf: float
    cpu: float


@dataclass
class Row:
    name: str
    page: int
    kind: str
    pixels: int
    truth: list[str]
    grey: Reading
    colour: Reading

    def score(self, r: Reading) -> float:
        got = recall(self.truth, r.words)
        return got if got is not None else float(r.well)


def tesseract(pnm: bytes, dpi: float) -> Reading:
    """tesseract as ocrd's engine runs it (ocrd.engines.tesseract.read_args), on a PNM."""
    from ocrd.config.engine import TesseractConfig
    from ocrd.engines import tesseract_tsv
    from ocrd.engines.tesseract import read_args

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(["tesseract", "stdin", "stdout", *read_args(TesseractConfig(), dpi)],
                       input=pnm, capture_output=True, timeout=600,
                       env={**os.environ, "OMP_THREAD_LIMIT": "1"}, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tsv, text = tesseract_tsv.split(r.stdout.decode("utf-8", errors="replace"))
    found = tesseract_tsv.parse(tsv)[1]
    return Reading(words(text), sum((w.conf or 0) >= WELL for w in found),
                   tesseract_tsv.confidence(tsv),
                   (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime))


def truth_for(path: Path, page: int, kind: str) -> list[str]:
    for t in (TRUTH / path.parent.name / f"{path.name}.txt", path.with_suffix(".txt")):
        if t.exists():
            return words(t.read_text())
    if kind == "born-digital":
        r = subprocess.run(["pdftotext", "-q", "-f", str(page), "-l", str(page), str(path), "-"],
                           capture_output=True, timeout=120)
        found = words(r.stdout.decode(errors="replace"))
        return found if len(found) >= 20 else []
    return []


def measure(path: Path, max_pages: int) -> list[Row]:
    from ocrd.render import pages
    from ocrd.render.pixels import pixels
    from ocrd.render.resolution import Resolution

    try:
        info = pages.probe(str(path), 300, 1000, 1 << 40, 200_000_000, finished=True)
    except Exception:  # noqa: BLE001 - a file ocrd does not read: nothing to compare
        return []
    rows = []
    for i in range(min(info.pages, max_pages)):
        try:
            colour = pages.render_page(str(path), info, i, Resolution(300, 200, 600), 60_000_000)
            grey = pages.render_page(str(path), info, i, Resolution(300, 200, 600, grey=True),
                                     60_000_000)
        except Exception:  # noqa: BLE001 - a page that does not render
            continue
        image = colour.to_image(pixels(colour))
        if pages._colourless(image):
            continue
        kind = _kind(path, info, i, colour.dpi)
        rgb_pnm = colour.pnm_header() + pixels(colour)
        if grey.mode == "RGB":  # a colour photo stays in colour: the engine makes it grey
            g = image.convert("L")
            grey_pnm = b"P5\n%d %d\n255\n" % g.size + g.tobytes()
        else:
            grey_pnm = grey.pnm_header() + pixels(grey)
        rows.append(Row(path.name, i + 1, kind, colour.width * colour.height,
                        truth_for(path, i + 1, kind), tesseract(grey_pnm, grey.dpi),
                        tesseract(rgb_pnm, colour.dpi)))
    return rows


def _kind(path: Path, info: object, index: int, dpi: float) -> str:
    if getattr(info, "kind", "") == "image":
        return "scan" if dpi >= 150 else "photo"
    import pypdfium2 as pdfium

    from ocrd.render import resolution

    try:
        doc = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError:  # read by poppler or from a repaired copy: not looked into
        return "born-digital"
    try:
        return "scan" if resolution.scan(doc[index]) else "born-digital"
    finally:
        doc.close()


def weak(r: Reading) -> bool:
    """A grey reading that may have missed what colour shows: few words read well."""
    return r.well < 20 or r.conf < 70


def report(rows: list[Row]) -> None:
    print("\n| kind | pages | with truth | recall grey → colour | words read well grey → "
          "colour | tesseract CPU s grey → colour | MB a page grey → colour |")
    print("|---|---:|---:|---|---|---|---|")
    for kind in ("photo", "scan", "born-digital", "all"):
        rs = [r for r in rows if kind in ("all", r.kind)]
        if not rs:
            continue
        withtruth = [r for r in rs if r.truth]
        rg = sum(recall(r.truth, r.grey.words) or 0 for r in withtruth) / max(1, len(withtruth))
        rc = sum(recall(r.truth, r.colour.words) or 0 for r in withtruth) / max(1, len(withtruth))
        mb = sum(r.pixels for r in rs) / len(rs) / 1e6
        print(f"| {kind} | {len(rs)} | {len(withtruth)} | {rg:.3f} → {rc:.3f} | "
              f"{sum(r.grey.well for r in rs)} → {sum(r.colour.well for r in rs)} | "
              f"{sum(r.grey.cpu for r in rs):.1f} → {sum(r.colour.cpu for r in rs):.1f} | "
              f"{mb:.1f} → {3 * mb:.1f} |")
    print("\nper page (recall, or words read well without truth): grey → colour")
    for r in rows:
        print(f"  {r.name} p{r.page} [{r.kind}]: {r.score(r.grey):.3f} → {r.score(r.colour):.3f}"
              f" (cpu {r.grey.cpu:.1f} → {r.colour.cpu:.1f} s)")
    policies = {
        "always grey": lambda r: (r.grey, r.grey.cpu),
        "always colour": lambda r: (r.colour, r.colour.cpu),
        "colour for photos": lambda r: (r.colour, r.colour.cpu)
        if r.kind == "photo" else (r.grey, r.grey.cpu),
        "colour for photos and scans": lambda r: (r.colour, r.colour.cpu)
        if r.kind != "born-digital" else (r.grey, r.grey.cpu),
        "grey, and colour where grey reads weakly (the better kept)": lambda r: (
            max((r.grey, r.colour), key=lambda x: (x.well, x.conf)),
            r.grey.cpu + r.colour.cpu) if weak(r.grey) else (r.grey, r.grey.cpu),
        "grey, and colour for photos whose grey reading is weak (the better kept)": lambda r: (
            max((r.grey, r.colour), key=lambda x: (x.well, x.conf)),
            r.grey.cpu + r.colour.cpu) if r.kind == "photo" and weak(r.grey)
        else (r.grey, r.grey.cpu),
    }
    withtruth = [r for r in rows if r.truth]
    print("\n| policy | recall (pages with truth) | words read well (all) | tesseract CPU s |")
    print("|---|---:|---:|---:|")
    for name, pick in policies.items():
        chosen = [(r, *pick(r)) for r in rows]
        rec = sum(recall(r.truth, got.words) or 0 for r, got, _ in chosen if r.truth) / \
            max(1, len(withtruth))
        print(f"| {name} | {rec:.3f} | {sum(got.well for _, got, _ in chosen)} | "
              f"{sum(cpu for *_, cpu in chosen):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--max-pages", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    files = []
    for p in args.paths:
        files += sorted(f.resolve() for f in p.rglob("*") if f.suffix.lower() in SUFFIXES) \
            if p.is_dir() else [p.resolve()]  # ocrd reads no links: what they point to
    rows: list[Row] = []
    for f in files:
        got = measure(f, args.max_pages)
        for r in got:
            print(f"{r.name} p{r.page} [{r.kind}]: grey {r.score(r.grey):.3f}, colour "
                  f"{r.score(r.colour):.3f}", flush=True)
        rows += got
    report(rows)


if __name__ == "__main__":
    main()
