"""Probing and rendering real files with real PDFium, poppler and Pillow."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from helpers import make_pdf, sentence_lines
from PIL import Image

from ocrd import errors
from ocrd.render import pages
from ocrd.render.pool import RenderPool

LIMITS = {"dpi": 144, "max_pages": 50, "max_bytes": 10**9, "max_pixels": 50_000_000}


def probe(path: Path, **over: int) -> pages.DocInfo:
    args = {**LIMITS, **over}
    return pages.probe(str(path), args["dpi"], args["max_pages"], args["max_bytes"],
                       args["max_pixels"])


def test_pdf_probe_and_render(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "a.pdf", [sentence_lines(1, 2)] * 3)
    info = probe(pdf)
    assert (info.kind, info.pages, info.renderer) == ("pdf", 3, "pypdfium2")
    page = pages.render_page(str(pdf), info, 2, 144, 50_000_000)
    assert (page.width, page.height) == (1191, 1684)  # A4 at 144 dpi
    img = page.to_image()
    assert img.mode == "RGB" and img.getextrema()[0][0] < 50  # has dark text pixels
    poppler = pages.render_page(str(pdf), info, 0, 144, 50_000_000, renderer="pdf2image")
    assert abs(poppler.width - 1191) <= 2 and abs(poppler.height - 1684) <= 2


@pytest.mark.parametrize("data,reason", [
    (b"", errors.EmptyFile),
    (b"%PDF-1.7\n1 0 obj\n<<>>\nendobj\n", errors.Truncated),
    (b"hello world, not a document\n" * 5, errors.UnsupportedFormat),
    (b"GIF89a" + b"\x00" * 3, errors.Truncated),
])
def test_probe_classifies_bad_files(tmp_path: Path, data: bytes, reason: type) -> None:
    p = tmp_path / "x.bin"
    p.write_bytes(data)
    with pytest.raises(reason):
        probe(p)


def test_limits(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "a.pdf", [["x"]] * 5)
    with pytest.raises(errors.TooManyPages, match="5 pages"):
        probe(pdf, max_pages=4)
    with pytest.raises(errors.TooLarge):
        probe(pdf, max_bytes=100)
    big = tmp_path / "big.png"
    Image.new("L", (4000, 4000)).save(big)
    with pytest.raises(errors.TooLarge, match="decompression bomb"):
        probe(big, max_pixels=1_000_000)


def test_encrypted_pdf_says_how_to_fix_it(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "a.pdf", [["secret"]], encrypt="pw")
    with pytest.raises(errors.Encrypted, match="qpdf --decrypt"):
        probe(pdf)


def test_symlink_and_fifo_are_never_opened(tmp_path: Path) -> None:
    target = make_pdf(tmp_path / "real.pdf", [["x"]])
    link = tmp_path / "link.pdf"
    link.symlink_to(target)
    with pytest.raises(errors.NotRegularFile):
        probe(link)
    fifo = tmp_path / "pipe.pdf"
    os.mkfifo(fifo)
    with pytest.raises(errors.NotRegularFile):  # and it does not block
        probe(fifo)


@pytest.mark.parametrize("mode", ["CMYK", "I;16", "RGBA", "P", "LA", "1", "F"])
def test_every_image_mode_becomes_rgb(tmp_path: Path, mode: str) -> None:
    src = Image.new("RGB", (300, 200), "white")
    src.paste((0, 0, 0), (50, 50, 250, 150))
    if mode == "I;16":
        img = src.convert("L").point(lambda v: v * 40).convert("I").convert("I;16")
    elif mode == "F":
        img = src.convert("F")
    else:
        img = src.convert(mode)
    fmt = "TIFF" if mode in ("CMYK", "F") else "PNG"
    path = tmp_path / f"x.{fmt.lower()}"
    img.save(path, fmt)
    info = probe(path)
    out = pages.render_page(str(path), info, 0, 144, 50_000_000).to_image()
    assert out.mode == "RGB" and out.size == (300, 200)
    # the black box stays dark and the background light, whatever the mode
    assert sum(out.getpixel((150, 100))) < 150 and sum(out.getpixel((10, 10))) > 500


def test_transparent_png_lands_on_white(tmp_path: Path) -> None:
    img = Image.new("RGBA", (100, 100), (0, 0, 0, 0))
    img.paste((0, 0, 0, 255), (40, 40, 60, 60))
    img.save(tmp_path / "a.png")
    out = pages.render_page(str(tmp_path / "a.png"), probe(tmp_path / "a.png"), 0, 144,
                            10**7).to_image()
    assert out.getpixel((5, 5)) == (255, 255, 255) and out.getpixel((50, 50)) == (0, 0, 0)


def test_multipage_tiff_is_a_document_and_animated_gif_is_one_page(tmp_path: Path) -> None:
    frames = [Image.new("L", (200, 100), v) for v in (0, 128, 255)]
    frames[0].save(tmp_path / "a.tif", save_all=True, append_images=frames[1:])
    info = probe(tmp_path / "a.tif")
    assert info.pages == 3
    third = pages.render_page(str(tmp_path / "a.tif"), info, 2, 144, 10**7).to_image()
    assert third.getpixel((0, 0)) == (255, 255, 255)
    frames[0].save(tmp_path / "a.gif", save_all=True, append_images=frames[1:])
    assert probe(tmp_path / "a.gif").pages == 1


def test_oversized_pdf_page_is_rendered_smaller_not_refused(tmp_path: Path) -> None:
    from reportlab.pdfgen import canvas

    c = canvas.Canvas(str(tmp_path / "poster.pdf"), pagesize=(200 * 72, 100 * 72))
    c.drawString(100, 100, "poster")
    c.showPage()
    c.save()
    info = probe(tmp_path / "poster.pdf")
    page = pages.render_page(str(tmp_path / "poster.pdf"), info, 0, 144, 4_000_000)
    assert page.width * page.height <= 4_000_000 and page.dpi < 144


def test_render_pool_survives_a_crashing_worker(tmp_path: Path) -> None:
    async def main() -> None:
        pool = RenderPool(1)
        await pool.start()
        try:
            with pytest.raises(errors.RenderFailed, match="crashed"):
                await pool.call(os._exit, 3)
            # the pool was rebuilt and works again
            assert await pool.call(os.getpid) > 0
            with pytest.raises(errors.RenderFailed, match="longer than"):
                await pool.call(__import__("time").sleep, 5, timeout=0.5)
            assert await pool.call(os.getpid) > 0
        finally:
            await pool.close()

    asyncio.run(main())


def test_render_workers_die_with_the_daemon(tmp_path: Path) -> None:
    """SIGKILL of the main process (OOM killer, outside systemd) leaves no workers."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "pool.py"
    script.write_text(
        "import asyncio, os, sys\n"
        "from ocrd.render.pool import RenderPool\n"
        "async def main():\n"
        "    pool = RenderPool(2)\n"
        "    await pool.start()\n"
        "    pids = await asyncio.gather(*(pool.call(os.getpid) for _ in range(8)))\n"
        "    print(' '.join(str(p) for p in set(pids)), flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "if __name__ == '__main__':\n"
        "    asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    workers = [int(p) for p in proc.stdout.readline().split()]
    assert workers and all(os.path.exists(f"/proc/{p}") for p in workers)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in workers):
        time.sleep(0.05)
    alive = [p for p in workers if os.path.exists(f"/proc/{p}")
             and Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0] != "Z"]
    assert alive == [], "render workers outlived the daemon"


def test_an_image_says_its_resolution_when_a_scan_would(tmp_path: Path) -> None:
    """A scanner's 300 dpi reaches the page (tesseract's --dpi, the sidecar, hOCR's
    scan_res); a photo's 72 dpi, or none, says nothing of its text: 0, not known."""
    from PIL import Image

    from ocrd.render.pages import probe, render_page

    for name, dpi, want in (("scan.png", (300, 300), 300.0), ("photo.jpg", (72, 72), 0.0),
                            ("plain.png", None, 0.0)):
        path = tmp_path / name
        Image.new("RGB", (400, 300), "white").save(path, **({"dpi": dpi} if dpi else {}))
        info = probe(str(path), 144, 100, 1 << 30, 1 << 28)
        assert render_page(str(path), info, 0, 144, 1 << 28).dpi == want, name
