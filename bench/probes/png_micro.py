"""CPU cost of a page's PNG on its way to a vLLM server (ocrd/engines/remote.py): Pillow's
PNG writer at compression level 1 (what ocrd used) against ocrd's own writer (rows left
unfiltered, deflated at level 1), side by side, interleaved.

    PYTHONPATH=$PWD .venv/bin/python bench/probes/png_micro.py [--rounds 7]

Pages (RGB): a page of bench/gpu/run.py's PDFs as ocrd renders it (144 dpi: an A4 page
image in a PDF), a rendered text page, a scan-like page (paper grain over a gradient)
and a photo-like one. Per page: ms per encoding (median of the rounds) for each writer
and the ratio ocrd ÷ Pillow (< 1: ocrd's faster), the bytes of each, whether the PNG
decodes to the same pixels, and the time Pillow takes to decode each (the server's front
end does). Then every page 4 times over in as many threads as
there are cores (the daemon encodes in threads): pages per second for each writer.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from ocrd.engines.remote import png_bytes  # noqa: E402


def pillow_png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def pages() -> dict[str, Image.Image]:
    import pypdfium2 as pdfium
    from helpers import sentence_lines, text_image

    from bench.gpu import inputs as gpu_inputs

    w, h = gpu_inputs.A4
    with tempfile.TemporaryDirectory() as tmp:
        [pdf] = gpu_inputs.make_pdfs(Path(tmp), 1, 1, 600_000)
        doc = pdfium.PdfDocument(str(pdf))
        bench_page = doc[0].render(scale=144 / 72).to_pil().convert("RGB")
        doc.close()
    text = text_image(sentence_lines(1, 40), size=(w, h)).convert("RGB")
    grain = Image.effect_noise((w, h), 12).convert("L")
    gradient = Image.linear_gradient("L").resize((w, h))
    scan = Image.merge("RGB", [Image.blend(grain, gradient, 0.3)] * 3)
    photo = Image.effect_mandelbrot((w, h), (-2, -1.5, 1, 1.5), 100).convert("RGB")
    return {"bench PDF page, rendered": bench_page, "text page": text,
            "scan-like": scan, "photo-like": photo}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    images = pages()
    print(f"{'page':<26} {'Pillow ms':>10} {'ocrd ms':>8} {'ratio':>6} "
          f"{'Pillow KB':>10} {'ocrd KB':>8}  same pixels")
    for name, image in images.items():
        times: dict[str, list[float]] = {"pillow": [], "ocrd": []}
        decode: dict[str, list[float]] = {"pillow": [], "ocrd": []}
        out: dict[str, bytes] = {}
        for _ in range(args.rounds):
            for key, fn in (("pillow", pillow_png), ("ocrd", png_bytes)):
                t0 = time.perf_counter()
                out[key] = fn(image)
                times[key].append(time.perf_counter() - t0)
                t0 = time.perf_counter()  # what the server's front end does with it
                Image.open(io.BytesIO(out[key])).load()
                decode[key].append(time.perf_counter() - t0)
        back = Image.open(io.BytesIO(out["ocrd"]))
        back.load()
        same = back.mode == "RGB" and back.tobytes() == image.tobytes()
        a, b = (statistics.median(times[k]) * 1000 for k in ("pillow", "ocrd"))
        da, db = (statistics.median(decode[k]) * 1000 for k in ("pillow", "ocrd"))
        print(f"{name:<26} {a:>10.1f} {b:>8.1f} {b / a:>6.2f} "
              f"{len(out['pillow']) / 1024:>10.0f} {len(out['ocrd']) / 1024:>8.0f}  {same}"
              f"   decode {da:.1f} -> {db:.1f} ms ({db / da:.2f})")
        if not same:
            raise SystemExit(f"{name}: ocrd's PNG does not decode to the page's pixels")
    work = list(images.values()) * 4
    threads = os.cpu_count() or 1
    rates = {}
    for key, fn in (("pillow", pillow_png), ("ocrd", png_bytes), ("pillow", pillow_png),
                    ("ocrd", png_bytes)):
        with ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            list(pool.map(fn, work))
            rates.setdefault(key, []).append(len(work) / (time.perf_counter() - t0))
    a, b = (max(rates[k]) for k in ("pillow", "ocrd"))
    print(f"{len(work)} pages in {threads} threads: Pillow {a:.1f} pages/s, ocrd {b:.1f} "
          f"pages/s (ratio {b / a:.2f}; best of 2 each)")


if __name__ == "__main__":
    main()
