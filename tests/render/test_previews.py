"""Page previews, made on demand: rendered from the original in the previews' own worker
process when first asked for, turned upright as the engine read the page, cached (and
served from the cache after), within their age and byte limits; conversion renders none."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import structlog
from helpers import make_pdf, sentence_lines
from PIL import Image

from ocrd.render.pages import RenderedPage
from ocrd.render.previews import SIZES, Previews, encode
from ocrd.safefs import fd_path

LONG_SIDE = SIZES["page"][1]


def _page(w: int = 1191, h: int = 1684) -> RenderedPage:
    img = Image.new("RGB", (w, h), "white")
    for y in range(100, h - 100, 40):
        img.paste((20, 20, 20), (100, y, w - 100, y + 12))
    return RenderedPage(0, w, h, img.tobytes(), 144.0)


def test_encode_is_a_jpeg_within_the_long_side() -> None:
    # A4 at 144, 200 and 300 dpi, a wide scan, a small image
    for w, h, long_side in ((1191, 1684, 1600), (1654, 2339, 1170), (2480, 3508, 1600),
                            (3000, 2000, 1500), (400, 300, 400)):
        img = Image.open(io.BytesIO(encode(_page(w, h).to_image(), LONG_SIDE)))
        assert img.format == "JPEG"
        assert max(img.size) == long_side <= LONG_SIDE
        assert abs(img.size[0] / img.size[1] - w / h) < 0.01


def _bar_pdf(path: Path) -> Path:
    """One A4 page with a black bar at its top."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    c = canvas.Canvas(str(path), pagesize=A4)
    c.rect(40, A4[1] - 90, A4[0] - 80, 50, fill=1)
    c.showPage()
    c.save()
    return path


def _top_is_dark(jpeg: bytes) -> bool:
    img = Image.open(io.BytesIO(jpeg)).convert("L")
    top = img.crop((0, 0, img.width, img.height // 10)).getextrema()[0]
    bottom = img.crop((0, img.height * 9 // 10, img.width, img.height)).getextrema()[0]
    return top < 50 < bottom


def test_made_on_demand_upright_and_cached(tmp_path: Path) -> None:
    pdf = _bar_pdf(tmp_path / "bar.pdf")
    p = Previews(tmp_path / "previews", days=30, max_bytes=10**9)
    p.start()
    sha = "cd" * 32
    fd = os.open(pdf, os.O_RDONLY)
    try:
        with structlog.testing.capture_logs() as logs:
            plain = p.make(sha, 1, "page", fd_path(fd), None)
            turned = p.make("ef" * 32, 1, "page", fd_path(fd), 180)
            full = p.make("ab" * 32, 1, "full", fd_path(fd), None)
            missing = p.make("ab" * 32, 2, "page", fd_path(fd), None)  # no page 2
    finally:
        os.close(fd)
        p.stop()
    assert plain is not None and _top_is_dark(plain)
    assert turned is not None and not _top_is_dark(turned)  # turned 180°: bar at bottom
    assert max(Image.open(io.BytesIO(plain)).size) == LONG_SIDE
    assert full is not None and max(Image.open(io.BytesIO(full)).size) > 3000
    assert missing is None
    assert [e["page"] for e in logs if e["event"] == "preview_failed"] == [2]
    assert (p.folder(sha) / "p0001.jpg").read_bytes() == plain
    assert (p.folder("ab" * 32) / "p0001-full.jpg").exists()
    assert p.path("../../etc", 1) is None and p.path(sha, 0) is None
    assert p.path(sha, 1, "huge") is None


def test_a_hostile_document_does_not_take_the_caller_down(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pdf"
    junk.write_bytes(b"%PDF-1.4\n" + os.urandom(4000))
    good = make_pdf(tmp_path / "good.pdf", [sentence_lines(1)])
    p = Previews(tmp_path / "previews", days=30, max_bytes=10**9)
    p.start()
    try:
        for path, sha in ((junk, "11" * 32), (good, "22" * 32)):
            fd = os.open(path, os.O_RDONLY)
            try:
                result = p.make(sha, 1, "page", fd_path(fd), None)
            finally:
                os.close(fd)
            assert (result is None) == (path == junk)
    finally:
        p.stop()


def _doc(root: Path, k: int, size: int, age_days: float) -> Path:
    sha = f"{k:064x}"
    folder = root / sha[:2] / sha
    folder.mkdir(parents=True)
    (folder / "p0001.jpg").write_bytes(b"x" * size)
    t = time.time() - age_days * 86400
    os.utime(folder, (t, t))
    return folder


def test_sweep_keeps_days_and_bytes(tmp_path: Path) -> None:
    root = tmp_path / "previews"
    old = _doc(root, 1, 100, 40)
    docs = [_doc(root, k, 1000, 10 - k) for k in range(2, 8)]  # oldest first
    p = Previews(root, days=30, max_bytes=3300)
    # over the limit: the expired one, then the oldest down to 90 % of the limit
    assert p.sweep() == 1 + 4
    assert not old.exists()
    assert [d.exists() for d in docs] == [False, False, False, False, True, True]
    assert p.sweep() == 0
    _doc(root, 9, 1000, 0)  # 3000 bytes: within the limit, nothing goes
    assert p.sweep() == 0
