"""Real files, read by ocrd and by OCRmyPDF side by side: word recall and time per file.

    python -m bench.corpus FOLDER [--ocrmypdf PATH] [--jobs N] [--only NAME ...]
    python -m bench.corpus FOLDER --batch [--daemon] [--ocrmypdf PATH] [--om-cache DIR]

The corpus itself is never checked in: `bench/corpus_sources.txt` lists its files
(repository, commit, path, sha256), and `python -m bench.corpus --fetch
bench/corpus_sources.txt --mirrors DIR FOLDER` copies them out of local clones
(DIR/OWNER+NAME/repo or DIR/OWNER+NAME, bare or not) into FOLDER/SOURCE/.
`--select --mirrors DIR` prints such a list, chosen by fixed rules (see `select`).

`--batch` (bench/corpus_batch.py): the whole folder through ONE `ocrd convert` call (and,
with `--daemon`, through a running daemon), every file's outcome and recall beside
OCRmyPDF's, and the promises checked: a documented exit code, no traceback, exactly one
outcome per file, convert and daemon agreeing.

Without `--batch`, for every PDF and image in FOLDER (and its subfolders): the ground
truth is FILE's stem +
`.txt` beside it when there is one, else `pdftotext` of a born-digital PDF (one with at
least 20 words of text), else none. ocrd (`ocrd convert`, tesseract, its defaults) and
OCRmyPDF (`ocrmypdf --force-ocr --sidecar --output-type pdf`, when installed: pass its
path, e.g. a separate venv's bin/ocrmypdf) read each file in turn, alternating which goes
first. Printed per file: ocrd's outcome, the words of the truth that each found (recall),
how many of OCRmyPDF's words ocrd found, seconds (wall and CPU of the whole process tree)
and OCRmyPDF's time / ocrd's (above 1: ocrd is faster); then the totals, and the files
where ocrd's recall is more than 0.01 below OCRmyPDF's or where it reported a converted
file with fewer words than OCRmyPDF found.
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
import time
from dataclasses import dataclass, field
from pathlib import Path

SUFFIXES = {".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp", ".bmp", ".gif"}
_WORD = re.compile(r"\w+")
_FAILED = re.compile(r"FAILED \[(\w+)\] (.*)$", re.MULTILINE)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def recall(truth: list[str], got: list[str]) -> float | None:
    """Share of the truth's words found in `got` (as a multiset); None without truth."""
    if not truth:
        return None
    have: dict[str, int] = {}
    for w in got:
        have[w] = have.get(w, 0) + 1
    hit = 0
    for w in truth:
        if have.get(w, 0) > 0:
            have[w] -= 1
            hit += 1
    return hit / len(truth)


TRUTH = Path(__file__).resolve().parent / "truth"


# More folders of truths (SOURCE/NAME.txt), as --truth names them.
TRUTHS: list[Path] = []


def ground_truth(path: Path) -> tuple[list[str], str]:
    """The words of the file: NAME.txt beside it, bench/truth/SOURCE/NAME.txt (typed for
    the fetched corpora) or in a --truth folder, else pdftotext of a born-digital PDF;
    none."""
    for given in (path.with_suffix(".txt"),
                  *(t / path.parent.name / f"{path.name}.txt" for t in (TRUTH, *TRUTHS))):
        if given.exists():
            return words(given.read_text(errors="replace")), "given"
    if path.suffix.lower() == ".pdf" and shutil.which("pdftotext"):
        r = subprocess.run(["pdftotext", "-q", str(path), "-"], capture_output=True,
                           timeout=120)
        found = words(r.stdout.decode(errors="replace"))
        if len(found) >= 20:
            return found, "pdftotext"
    return [], "none"


@dataclass
class Run:
    ok: bool
    wall: float
    cpu: float
    text: str = ""
    note: str = ""


def timed(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> tuple[int, float,
                                                                                   float, str]:
    """Exit status, wall and CPU seconds of the whole process tree, stderr."""
    with tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err)
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.05)
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return (proc.returncode, wall, usage.ru_utime + usage.ru_stime,
                err.read().decode(errors="replace"))


def run_ocrd(path: Path, out: Path, jobs: int | None, checkout: Path) -> Run:
    env = {**os.environ, "PYTHONPATH": str(checkout), "OCRD_CONFIG": ""}
    cmd = [sys.executable, "-m", "ocrd", "convert", str(path), "-o", str(out), "-q"]
    if jobs:
        cmd += ["-j", str(jobs)]
    rc, wall, cpu, err = timed(cmd, env, out.parent, 3600)
    md = out / (path.stem + ".md")
    if rc != 0 or not md.exists():
        m = _FAILED.search(err)
        return Run(False, wall, cpu, note=f"{m.group(1)}: {m.group(2)[:60]}" if m
                   else f"exit {rc}")
    meta = json.loads((out / (path.stem + ".json")).read_text())
    blank = sum(p["status"] == "blank" for p in meta["pages"])
    turned = [p["page"] for p in meta["pages"] if p.get("rotation")]
    note = f"{meta['page_count']}p" + (f", {blank} blank" if blank else "") + \
        (f", turned {turned}" if turned else "")
    text = re.sub(r"<!-- page [^>]*-->", " ", md.read_text())
    return Run(True, wall, cpu, text, note)


def run_ocrmypdf(path: Path, out: Path, jobs: int | None, binary: str,
                 omp_one: bool = False) -> Run:
    sidecar = out / (path.stem + ".txt")
    cmd = [binary, "--force-ocr", "--output-type", "pdf", "--sidecar", str(sidecar),
           "-l", "eng", str(path), str(out / (path.stem + ".pdf"))]
    if jobs:
        cmd[1:1] = ["-j", str(jobs)]
    env = {**os.environ, **({"OMP_THREAD_LIMIT": "1"} if omp_one else {})}
    rc, wall, cpu, err = timed(cmd, env, out, 3600)
    if rc != 0 or not sidecar.exists():
        last = [line for line in err.splitlines() if line.strip()][-1:] or [""]
        return Run(False, wall, cpu, note=f"exit {rc}: {last[0][:60]}")
    return Run(True, wall, cpu, sidecar.read_text(errors="replace"))


@dataclass
class Row:
    name: str
    truth: str
    ocrd: Run
    om: Run | None
    scores: dict[str, float | None] = field(default_factory=dict)


def fmt(x: float | None) -> str:
    return "  -  " if x is None else f"{x:5.2f}"


def report(rows: list[Row]) -> None:
    print(f"\n{'file':28} {'truth':9} {'ocrd':>5} {'ocrmypdf':>8} {'vs om':>5} "
          f"{'ocrd s':>7} {'om s':>7} {'ratio':>5} {'cpu r':>5}  ocrd outcome / ocrmypdf")
    for r in rows:
        om = r.om
        ratio = om.wall / r.ocrd.wall if om and om.ok and r.ocrd.wall else None
        cpu = om.cpu / r.ocrd.cpu if om and om.ok and r.ocrd.cpu else None
        print(f"{r.name[:28]:28} {r.truth:9} {fmt(r.scores.get('ocrd'))} "
              f"{fmt(r.scores.get('om')):>8} {fmt(r.scores.get('vs_om'))} "
              f"{r.ocrd.wall:7.1f} {(om.wall if om else 0):7.1f} {fmt(ratio)} {fmt(cpu)}  "
              f"{'ok' if r.ocrd.ok else 'FAILED'} {r.ocrd.note}"
              f"{' / ' + ('ok' if om.ok else om.note) if om else ''}")
    both = [r for r in rows if r.om and r.om.ok and r.ocrd.ok]
    if both:
        ow, mw = sum(r.ocrd.wall for r in both), sum(r.om.wall for r in both)  # type: ignore[union-attr]
        oc, mc = sum(r.ocrd.cpu for r in both), sum(r.om.cpu for r in both)  # type: ignore[union-attr]
        print(f"\nfiles both converted: {len(both)}; wall ocrd {ow:.1f} s, ocrmypdf {mw:.1f} s, "
              f"speed ratio {mw / ow:.2f}; CPU ocrd {oc:.1f} s, ocrmypdf {mc:.1f} s, "
              f"ratio {mc / oc:.2f}")
    worse = [r.name for r in rows if r.scores.get("ocrd") is not None
             and r.scores.get("om") is not None
             and r.scores["ocrd"] < r.scores["om"] - 0.01]  # type: ignore[operator]
    fewer = [r.name for r in rows if r.ocrd.ok and r.om and r.om.ok
             and len(words(r.ocrd.text)) < len(words(r.om.text)) * 0.9]
    print(f"ocrd recall below OCRmyPDF's - 0.01: {worse or 'none'}")
    print(f"converted by ocrd with < 90% of OCRmyPDF's word count: {fewer or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, nargs="?")
    ap.add_argument("--select", action="store_true",
                    help="print a list of corpus files chosen from --mirrors")
    ap.add_argument("--fetch", type=Path, metavar="LIST",
                    help="copy the files LIST names from --mirrors into FOLDER")
    ap.add_argument("--mirrors", type=Path, help="folder of local clones")
    ap.add_argument("--batch", action="store_true",
                    help="one `ocrd convert` over the folder (see bench/corpus_batch.py)")
    ap.add_argument("--daemon", action="store_true", help="with --batch: the daemon too")
    ap.add_argument("--om-cache", type=Path,
                    help="with --batch: keep OCRmyPDF's results here, by file hash")
    ap.add_argument("--results", type=Path, help="with --batch: write the rows as JSON")
    ap.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                    help="with --batch: the same ocrd convert with another checkout's ocrd "
                    "(e.g. main's: git archive main | tar -x -C DIR), compared file by file")
    ap.add_argument("--lang", help="with --batch: tesseract's languages (-l), e.g. eng+kor")
    ap.add_argument("--cut-from", type=Path, metavar="DIR",
                    help="write into FOLDER a copy of every PDF under DIR cut off at "
                    "--share of its bytes (a download or a copy that stopped), then exit")
    ap.add_argument("--share", type=float, default=0.95, help="with --cut-from")
    ap.add_argument("--truth", type=Path, action="append", default=[],
                    help="a folder of truths SOURCE/NAME.txt (as bench/truth/)")
    ap.add_argument("--tessdata-download", action="store_true",
                    help="with --batch: language data as a download of tessdata_best gives "
                    "it (the system's *.traineddata, no configs/ folder) via TESSDATA_PREFIX")
    ap.add_argument("--ocrmypdf", default=shutil.which("ocrmypdf"),
                    help="the ocrmypdf program (default: on PATH; none: ocrd only)")
    ap.add_argument("--jobs", type=int, help="-j for both (default: their own)")
    ap.add_argument("--only", nargs="*", help="file names to run (default: all)")
    ap.add_argument("--omp-one", action="store_true",
                    help="OMP_THREAD_LIMIT=1 for OCRmyPDF's tesseract too, as ocrd sets it "
                    "(by default tesseract's OpenMP threads oversubscribe a small machine)")
    args = ap.parse_args()
    from bench import corpus  # this module as corpus_batch imports it (not __main__)

    corpus.TRUTHS.extend(args.truth)
    if args.cut_from:
        if args.folder is None:
            ap.error("--cut-from needs FOLDER")
        args.folder.mkdir(parents=True, exist_ok=True)
        n = 0
        for pdf in sorted(args.cut_from.rglob("*.pdf")):
            data = pdf.read_bytes()
            cut = data[:int(len(data) * args.share)]
            if b"%%EOF" not in cut[-2048:]:  # cut before its (last) end marker
                dest = args.folder / f"{pdf.parent.name}__{pdf.name}"
                dest.write_bytes(cut)
                truth, how = ground_truth(pdf)  # the whole file's words: its truth
                if how == "pdftotext":
                    folder = args.folder.parent / f"{args.folder.name}.truth" / \
                        args.folder.name
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / f"{dest.name}.txt").write_text(" ".join(truth))
                n += 1
        print(f"{n} PDFs cut off at {args.share:.0%} in {args.folder}; the whole files' "
              f"words (their truth) in {args.folder.name}.truth/ beside it (--truth)")
        return
    if args.select or args.fetch or args.batch:
        from bench import corpus_batch

        corpus_batch.main(args)
        return
    if args.folder is None:
        ap.error("FOLDER is needed")
    checkout = Path(__file__).resolve().parent.parent
    files = sorted(p for p in args.folder.rglob("*") if p.is_file()
                   and p.suffix.lower() in SUFFIXES and (not args.only or p.name in args.only))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="ocrd-corpus-") as tmp:
        for k, path in enumerate(files):
            truth, source = ground_truth(path)
            out = Path(tmp) / f"{k}"
            (out / "ocrd").mkdir(parents=True)
            (out / "om").mkdir()
            order = ["ocrd", "om"] if k % 2 == 0 else ["om", "ocrd"]
            runs: dict[str, Run | None] = {"om": None}
            for who in order:
                if who == "ocrd":
                    runs["ocrd"] = run_ocrd(path, out / "ocrd", args.jobs, checkout)
                elif args.ocrmypdf:
                    runs["om"] = run_ocrmypdf(path, out / "om", args.jobs, args.ocrmypdf,
                                              args.omp_one)
            ocrd, om = runs["ocrd"], runs["om"]
            assert ocrd is not None
            row = Row(path.name, source, ocrd, om)
            row.scores["ocrd"] = recall(truth, words(ocrd.text)) if ocrd.ok else \
                (0.0 if truth else None)
            if om is not None:
                row.scores["om"] = recall(truth, words(om.text)) if om.ok else None
                if om.ok and ocrd.ok:
                    row.scores["vs_om"] = recall(words(om.text), words(ocrd.text))
            rows.append(row)
            print(f"{path.name}: ocrd {fmt(row.scores.get('ocrd'))} in {ocrd.wall:.1f} s "
                  f"({ocrd.note}); ocrmypdf {fmt(row.scores.get('om'))} in "
                  f"{om.wall if om else 0:.1f} s {om.note if om else ''}", flush=True)
    report(rows)


if __name__ == "__main__":
    main()
