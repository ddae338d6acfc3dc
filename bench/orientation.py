"""Pages with few words, lying at 0, 90, 180 and 270 degrees: does ocrd turn each upright
and read it, and what does that cost? Side by side with another checkout (`--baseline`).

    python -m bench.orientation IMAGE... [--baseline CHECKOUT] [--out DIR] [--jobs N]

The pages are made from real scans (the IMAGEs: e.g. tesseract-ocr/test's phototest.tif,
eurotext.tif, 8071_093.3B.tif … from the corpus, `bench/corpus_sources.txt`): tesseract
finds the text lines of each upright image; one, two and three of them (from the top)
are cut out and laid near the top of an otherwise blank A4 page at the image's
resolution — a short note, an address label, a stamp's line — which is then turned
counter-clockwise by each angle (a sheet fed into the scanner that way). The truth is
what tesseract reads on the upright crop.

Each checkout reads every page with one `ocrd convert` (tesseract, its defaults). Per
angle: pages read upright (the sidecar's rotation is the turn that makes the page
upright, and the Markdown has at least 0.8 of the truth's words), the mean word recall,
and the seconds of the whole call (CPU of the process tree). A page read as it lies
(rotation 0 on a sideways page) counts as not upright even where its words came out:
the console shows it sideways, and its layout was read sideways.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from bench.corpus import recall, timed, words

ROOT = Path(__file__).resolve().parent.parent
ANGLES = (0, 90, 180, 270)
LINES = (1, 2, 3)
A4_INCHES = (8.27, 11.69)
GOOD_RECALL = 0.8


@dataclass
class Page:
    name: str
    angle: int
    truth: list[str]


@dataclass
class Side:
    label: str
    wall: float = 0.0
    cpu: float = 0.0
    rows: dict[str, tuple[int | None, float, str]] = field(default_factory=dict)


def text_lines(image: Image.Image, dpi: float) -> list[tuple[int, int, int, int]]:
    """Line boxes (left, top, right, bottom) tesseract finds on an upright image, top
    first, of lines with at least two words."""
    grey = image.convert("L")
    r = subprocess.run(["tesseract", "stdin", "stdout", "--dpi", str(round(dpi)), "-c",
                        "tessedit_create_tsv=1"], input=_png(grey), capture_output=True,
                       env={**os.environ, "OMP_THREAD_LIMIT": "1"}, timeout=300, check=True)
    lines: dict[tuple[str, str, str], list[tuple[int, int, int, int]]] = {}
    for row in r.stdout.decode(errors="replace").splitlines()[1:]:
        cols = row.split("\t")
        if len(cols) != 12 or cols[0] != "5" or not cols[11].strip() or float(cols[10]) < 60:
            continue
        left, top, w, h = map(int, cols[6:10])
        lines.setdefault((cols[2], cols[3], cols[4]), []).append((left, top, left + w, top + h))
    boxes = [(min(b[0] for b in bs), min(b[1] for b in bs), max(b[2] for b in bs),
              max(b[3] for b in bs)) for bs in lines.values() if len(bs) >= 2]
    return sorted(boxes, key=lambda b: b[1])


def _png(image: Image.Image) -> bytes:
    import io

    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def read_truth(image: Image.Image, dpi: float) -> list[str]:
    r = subprocess.run(["tesseract", "stdin", "stdout", "--dpi", str(round(dpi))],
                       input=_png(image), capture_output=True, timeout=300,
                       env={**os.environ, "OMP_THREAD_LIMIT": "1"}, check=True)
    return words(r.stdout.decode(errors="replace"))


def make_pages(images: list[Path], folder: Path) -> list[Page]:
    folder.mkdir(parents=True, exist_ok=True)
    made: list[Page] = []
    for path in images:
        with Image.open(path) as im:
            dpi = float((im.info.get("dpi") or (300, 300))[0]) or 300.0
            dpi = dpi if 150 <= dpi <= 600 else 300.0
            image = im.convert("L")
        found = text_lines(image, dpi)
        for n in LINES:
            if len(found) < n:
                continue
            box = (min(b[0] for b in found[:n]), found[0][1],
                   max(b[2] for b in found[:n]), found[n - 1][3])
            # a little white around the lines, none of the next line's ink
            pad = int(dpi / 12)
            below = found[n][1] if len(found) > n else image.height
            crop = Image.new("L", (box[2] - box[0] + 2 * pad, box[3] - box[1] + 2 * pad), 255)
            crop.paste(image.crop((box[0], box[1], box[2], min(box[3], below))), (pad, pad))
            truth = read_truth(crop, dpi)
            if len(truth) < 2:
                continue
            page = Image.new("L", (round(A4_INCHES[0] * dpi), round(A4_INCHES[1] * dpi)), 255)
            page.paste(crop, (round(dpi), round(dpi)))
            stem = re.sub(r"\W+", "_", path.stem)[-40:] + f"-{n}l"
            for angle in ANGLES:
                name = f"{stem}-{angle:03d}"
                turned = page.rotate(angle, expand=True) if angle else page
                turned.save(folder / f"{name}.png", dpi=(dpi, dpi))
                made.append(Page(name, angle, truth))
    return made


def run_side(label: str, checkout: Path, folder: Path, out: Path, jobs: int | None,
             pages: list[Page]) -> Side:
    env = {**os.environ, "PYTHONPATH": str(checkout), "OCRD_CONFIG": ""}
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "ocrd", "convert", str(folder), "-o", str(out), "-q"]
    if jobs:
        cmd += ["-j", str(jobs)]
    rc, wall, cpu, err = timed(cmd, env, out.parent, 4 * 3600)
    side = Side(label, wall, cpu)
    for page in pages:
        side_json, md = out / f"{page.name}.json", out / f"{page.name}.md"
        if not side_json.exists():
            side.rows[page.name] = (None, 0.0, "failed")
            continue
        meta = json.loads(side_json.read_text())
        rotation = meta["pages"][0].get("rotation")
        text = re.sub(r"<!-- page [^>]*-->", " ", md.read_text())
        side.rows[page.name] = (rotation, recall(page.truth, words(text)) or 0.0,
                                meta["pages"][0]["status"])
    if rc not in (0, 1, 3):
        print(f"{label}: ocrd convert exited {rc}: {err[-500:]}", file=sys.stderr)
    return side


def upright(page: Page, row: tuple[int | None, float, str]) -> bool:
    rotation, got, _status = row
    return rotation == page.angle and got >= GOOD_RECALL


def report(pages: list[Page], sides: list[Side]) -> None:
    print(f"\n{len(pages)} pages ({len(pages) // len(ANGLES)} crops of 1-3 lines × "
          f"{len(ANGLES)} angles), words per page: mean "
          f"{sum(len(p.truth) for p in pages) / max(1, len(pages)):.1f}\n")
    head = "| angle | " + " | ".join(f"{s.label}: upright | {s.label}: recall" for s in sides)
    print(head + " |")
    print("|---:|" + "---:|---:|" * len(sides))
    for angle in (*ANGLES, None):
        these = [p for p in pages if angle is None or p.angle == angle]
        cells = []
        for s in sides:
            ok = sum(upright(p, s.rows[p.name]) for p in these)
            rec = sum(s.rows[p.name][1] for p in these) / max(1, len(these))
            cells += [f"{ok}/{len(these)}", f"{rec:.3f}"]
        print(f"| {'all' if angle is None else angle} | " + " | ".join(cells) + " |")
    print()
    for s in sides:
        print(f"{s.label}: one ocrd convert, {s.wall:.1f} s wall, {s.cpu:.1f} s CPU")
    if len(sides) == 2:
        a, b = sides
        print(f"CPU {a.label} ÷ {b.label}: {a.cpu / max(b.cpu, 0.1):.2f}")
        wrong = [(p.name, a.rows[p.name][:2]) for p in pages if not upright(p, a.rows[p.name])]
        print(f"{a.label}: not upright: {wrong or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("images", nargs="+", type=Path)
    ap.add_argument("--baseline", type=Path, help="another checkout, e.g. main's")
    ap.add_argument("--out", type=Path, help="keep the pages and results here")
    ap.add_argument("--jobs", type=int)
    args = ap.parse_args()
    sys.executable = os.path.abspath(sys.executable)
    work = args.out or Path(tempfile.mkdtemp(prefix="ocrd-orientation-"))
    if (work / "pages").exists():
        shutil.rmtree(work / "pages")
    pages = make_pages(args.images, work / "pages")
    sides = [run_side("ocrd", ROOT, work / "pages", work / "ocrd", args.jobs, pages)]
    if args.baseline:
        sides.append(run_side("baseline", args.baseline.resolve(), work / "pages",
                              work / "baseline", args.jobs, pages))
    report(pages, sides)


if __name__ == "__main__":
    main()
