"""Peak memory of the whole process tree (daemon, render workers, tesseract) converting
huge 1-bit scans: one 35,000 × 35,000 px page (OCRmyPDF's hugemono.pdf, generated here
as a Flate-compressed 1-bit image with a line of text), then several such files at once.

    python -m bench.memory                        # this checkout
    python -m bench.memory --baseline /tmp/main   # and a checkout of main, side by side
    python -m bench.memory --files 3 --budget 1073741824 --side 35000

Prints, per run, the peak RSS summed over the process tree (sampled every 20 ms), the
seconds, what the page became (size, dpi) and the words read; with --baseline, the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

TEXT = "This is a very big image with a tiny amount of text."


def huge_pdf(path: Path, side: int, text: str = TEXT) -> Path:
    """A PDF page (side/300 inches square) holding one side×side 1-bit image at 300 dpi:
    white, with one line of large text. Written row by row (never side² bytes at once)."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype("DejaVuSans.ttf", max(20, side // 140))
    box = font.getbbox(text)
    band = Image.new("1", (box[2] + 40, box[3] + 40), 1)
    ImageDraw.Draw(band).text((20, 20), text, fill=0, font=font)
    row_bytes = (side + 7) // 8
    x0 = (side // 8 // 8) * 8  # byte-aligned left edge of the text
    band_rows = band.tobytes()
    band_stride = (band.width + 7) // 8
    y0 = side // 3
    white = b"\xff" * row_bytes
    z = zlib.compressobj(9)
    chunks = []
    for y in range(side):
        if y0 <= y < y0 + band.height:
            r = (y - y0) * band_stride
            seg = band_rows[r:r + band_stride][:row_bytes - x0 // 8]
            row = white[:x0 // 8] + seg + white[x0 // 8 + len(seg):]
            chunks.append(z.compress(row))
        else:
            chunks.append(z.compress(white))
    stream = b"".join(chunks) + z.flush()
    pt = side * 72 / 300
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %.2f %.2f] /Contents 4 0 R "
            b"/Resources << /XObject << /Im0 5 0 R >> >> >>" % (pt, pt)]
    content = b"q %.2f 0 0 %.2f 0 0 cm /Im0 Do Q" % (pt, pt)
    objs.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
    objs.append(b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace "
                b"/DeviceGray /BitsPerComponent 1 /Filter /FlateDecode /Length %d >>\n"
                b"stream\n" % (side, side, len(stream)) + stream + b"\nendstream")
    path.write_bytes(pdf_bytes(objs))
    return path


def pdf_bytes(objs: list[bytes]) -> bytes:
    """A PDF of these objects (numbered from 1; 1 is the catalog), with its xref."""
    out = bytearray(b"%PDF-1.5\n")
    offsets = []
    for i, obj in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objs) + 1, xref)
    return bytes(out)


def tree_rss(root: int) -> int:
    """Bytes resident in `root` and all its descendants now."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        rss[pid] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def run(checkout: Path, files: list[Path], out: Path, budget: int | None) -> dict:
    cfg = out.with_suffix(".yaml")
    limits = {"limits": {"memory_bytes": budget}} if budget else {}
    cfg.write_text(json.dumps({"state_dir": str(out.parent), "engine": {"kind": "tesseract"},
                               **limits}))
    env = {**os.environ, "PYTHONPATH": str(checkout), "OCRD_CONFIG": ""}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ocrd", "convert", "-c", str(cfg),
                             *map(str, files), "-o", str(out)], env=env, cwd=out.parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.02)
    seconds = time.monotonic() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    pages = []
    for f in files:
        side = out / (f.stem + ".json")
        if side.exists():
            p = json.loads(side.read_text())["pages"][0]
            md = (out / (f.stem + ".md")).read_text()
            pages.append({"size": f"{p['width']}x{p['height']}", "dpi": p["dpi"],
                          "words": sum(w in md for w in TEXT.split())})
    return {"rc": proc.returncode, "peak_mb": round(peak / 2**20), "seconds": round(seconds, 1),
            "pages": pages, "stderr": err.strip().splitlines()[-3:] if proc.returncode else []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", type=int, default=35000)
    ap.add_argument("--files", type=int, default=3, help="files at once in the second run")
    ap.add_argument("--budget", type=int, default=None, help="limits.memory_bytes")
    ap.add_argument("--file", type=Path, help="use this PDF instead (e.g. hugemono.pdf)")
    ap.add_argument("--baseline", type=Path, help="a checkout of ocrd to compare with")
    args = ap.parse_args()
    here = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="ocrd-mem-") as tmp:
        root = Path(tmp)
        src = args.file or huge_pdf(root / "huge.pdf", args.side)
        copies = []
        for k in range(args.files):
            copies.append(root / f"huge{k}.pdf")
            copies[-1].write_bytes(src.read_bytes())
        checkouts = [("ocrd", here)] + ([("baseline", args.baseline)] if args.baseline else [])
        runs = [("1 file", copies[:1])]
        if args.files > 1:
            runs.append((f"{args.files} files", copies))
        for label, files in runs:
            row = {}
            for name, checkout in checkouts:
                out = root / f"out-{name}-{len(files)}"
                out.mkdir()
                row[name] = run(checkout, files, out,
                                args.budget if name == "ocrd" else None)
                print(f"{label:>8} {name:>8}: {json.dumps(row[name])}", flush=True)
            if "baseline" in row and row["baseline"]["peak_mb"]:
                ratio = row["ocrd"]["peak_mb"] / row["baseline"]["peak_mb"]
                print(f"{label:>8}: peak RSS ocrd/baseline = {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
