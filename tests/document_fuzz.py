"""A seeded byte-level mutator of real documents, and one `ocrd convert` call over what
it makes, checked for its promises:

- the command ends by itself with one of its documented exit codes, never a traceback;
- every file has exactly one outcome line (converted, or FAILED with a reason), and the
  summary line counts them; a converted file has its Markdown and sidecar;
- no file fails as internal_error (an exception ocrd did not map to a reason: a bug);
- no process the command started is left once it has exited.

The seeds are files of tests/real_files/: a born-digital PDF, a 1-bit TIFF scan, a
palette PNG, a JPEG photo (real files), and, made here, the kinds that once went wrong
(Korean lines, one line on a page lying sideways, a PDF whose stream does not decode, a
PDF cut off, a colour photo of a sign). With `--tessdata-download` tesseract reads its
language data from a folder as a download gives it (no configs/). The CI test
(tests/test_document_fuzz.py) runs fixed, seeded sets; for a longer run:

    .venv/bin/python tests/document_fuzz.py --count 400 --seed 7 --out /tmp/fuzz
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REAL = Path(__file__).resolve().parent / "real_files"
SEEDS = ["opt_demo.pdf", "phototest.tif", "phototest-rotated-180.png", "hopper.jpg",
         "korean-lines.png", "note-lying-90.png", "bad-flate.pdf", "cut-off.pdf",
         "sign-photo.jpg"]
EXIT_CODES = {0, 1, 3, 4, 5, 6, 7}  # README's table, less usage (2) and interrupted
# small pages and limits: a mutant that claims a huge page or page count meets a limit
# instead of the CI's time
CONFIG = """engine: {kind: tesseract}
render: {dpi: 100, scan_max_dpi: 150}
limits: {max_pages: 20, max_pixels: 6000000}
"""
_NUMBER = re.compile(rb"\d{1,10}")
_INTERESTING = [b"0", b"1", b"-1", b"255", b"65535", b"2147483647", b"4294967295",
                b"99999999999", b"3.4e38"]


def mutate(data: bytes, rng: random.Random, others: list[bytes]) -> bytes:
    """One mutant of `data`: 1 to 6 byte-level changes."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.choice(("flip", "set", "delete", "duplicate", "truncate", "number",
                         "splice"))
        n = len(buf)
        if n < 16:
            break
        at = rng.randrange(n)
        if op == "flip":
            buf[at] ^= 1 << rng.randrange(8)
        elif op == "set":
            buf[at] = rng.choice((0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        elif op == "delete":
            del buf[at:at + rng.randint(1, 64)]
        elif op == "duplicate":
            chunk = buf[at:at + rng.randint(1, 64)]
            where = rng.randrange(n)
            buf[where:where] = chunk
        elif op == "truncate":
            del buf[max(16, at):]
        elif op == "number":  # PDF's numbers: lengths, offsets, sizes, counts
            numbers = list(_NUMBER.finditer(bytes(buf)))
            if numbers:
                m = rng.choice(numbers)
                buf[m.start():m.end()] = rng.choice(_INTERESTING)
        else:  # splice a piece of another seed in
            other = rng.choice(others)
            start = rng.randrange(len(other))
            buf[at:at] = other[start:start + rng.randint(1, 256)]
    return bytes(buf)


def make_mutants(folder: Path, count: int, seed: int) -> list[Path]:
    rng = random.Random(seed)
    seeds = {name: (REAL / name).read_bytes() for name in SEEDS}
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for i in range(count):
        name = SEEDS[i % len(SEEDS)]
        path = folder / f"m{i:03d}-{name}"
        path.write_bytes(mutate(seeds[name], rng, list(seeds.values())))
        made.append(path)
    return made


@dataclass
class Report:
    returncode: int
    seconds: float
    outcomes: dict[str, list[str]] = field(default_factory=dict)  # file → its lines
    reasons: dict[str, int] = field(default_factory=dict)
    summary: str = ""
    stderr: str = ""
    left: list[int] = field(default_factory=list)  # processes still running after
    problems: list[str] = field(default_factory=list)


def download_like_tessdata(folder: Path) -> Path:
    """tesseract's language data as a download of tessdata_best or tessdata_fast gives
    it: the system's *.traineddata (linked), and no configs/ folder."""
    out = subprocess.run(["tesseract", "--list-langs"], capture_output=True, text=True).stdout
    found = re.search(r'"([^"]+)"', out)
    assert found, out
    folder.mkdir(parents=True, exist_ok=True)
    for data in Path(found.group(1)).glob("*.traineddata"):
        (folder / data.name).symlink_to(data)
    return folder


def run(root: Path, count: int, seed: int, jobs: int = 2, timeout: float = 600,
        tessdata: Path | None = None) -> Report:
    files = make_mutants(root / "in", count, seed)
    (root / "convert.yaml").write_text(CONFIG)
    mark = f"ocrd-fuzz-{uuid.uuid4().hex}"
    env = {**os.environ, "OCRD_CONFIG": "", "OCRD_FUZZ_MARK": mark}
    if tessdata is not None:
        env["TESSDATA_PREFIX"] = str(tessdata)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", "-c", str(root / "convert.yaml"),
                        str(root / "in"), "-o", str(root / "out"), "-j", str(jobs)],
                       capture_output=True, text=True, timeout=timeout, cwd=root, env=env)
    report = Report(r.returncode, time.monotonic() - t0, stderr=r.stderr)
    report.left = _left_behind(mark)
    check(report, files, root / "out")
    return report


def _left_behind(mark: str, grace: float = 10.0) -> list[int]:
    """Processes carrying the run's mark in their environment, once they have had
    `grace` seconds to go (workers exit right after the command does)."""
    deadline = time.monotonic() + grace
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def check(report: Report, files: list[Path], out: Path) -> None:
    lines = report.stderr.splitlines()
    p = report.problems
    if report.returncode not in EXIT_CODES:
        p.append(f"exit code {report.returncode}")
    if "Traceback (most recent call last)" in report.stderr:
        p.append("a traceback on stderr")
    progress = re.compile(r"^\d+/\d+ (\S+): (ok → |FAILED \[(\w+)\] )")
    for line in lines:
        m = progress.match(line)
        if m:
            report.outcomes.setdefault(m.group(1), []).append(line)
            if m.group(3):
                report.reasons[m.group(3)] = report.reasons.get(m.group(3), 0) + 1
    report.summary = lines[-1] if lines else ""
    for f in files:
        got = report.outcomes.get(str(f), [])
        if len(got) != 1:
            p.append(f"{f.name}: {len(got)} outcome lines")
        elif ": ok → " in got[0]:
            stem = f.name.rsplit(".", 1)[0]
            if not (out / f"{stem}.md").exists() or not (out / f"{stem}.json").exists():
                p.append(f"{f.name}: converted without its Markdown and sidecar")
    if set(report.outcomes) - {str(f) for f in files}:
        p.append(f"outcomes for files not given: {set(report.outcomes) - set(map(str, files))}")
    converted = sum(": ok → " in v[0] for v in report.outcomes.values() if v)
    failed = sum(report.reasons.values())
    if not report.summary.startswith(f"{converted} converted") or \
            (failed and f", {failed} failed: " not in report.summary):
        p.append(f"summary {report.summary!r} for {converted} converted, {failed} failed")
    if report.reasons.get("internal_error"):
        p.append(f"{report.reasons['internal_error']} internal_error(s)")
    if report.left:
        p.append(f"processes left behind: {report.left}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True, help="a folder for the mutants")
    ap.add_argument("--tessdata-download", action="store_true",
                    help="language data as a download gives it (no configs/ folder)")
    args = ap.parse_args()
    tessdata = download_like_tessdata(args.out / "tessdata") if args.tessdata_download \
        else None
    report = run(args.out, args.count, args.seed, args.jobs, timeout=24 * 3600,
                 tessdata=tessdata)
    print(f"{args.count} mutants, seed {args.seed}: exit {report.returncode} in "
          f"{report.seconds:.1f} s; {report.summary}")
    for problem in report.problems:
        print("PROBLEM:", problem)
    sys.exit(1 if report.problems else 0)


if __name__ == "__main__":
    main()
