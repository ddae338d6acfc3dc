"""Page previews: JPEG, long side at most 1600 px, written by one thread without holding
up the caller; the store stays within its age and byte limits."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

from helpers import wait_for
from PIL import Image

from ocrd import pages
from ocrd.pages import RenderedPage
from ocrd.previews import LONG_SIDE, QUEUE_PAGES, Previews, encode, render_with_preview


def _page(w: int = 1191, h: int = 1684) -> RenderedPage:
    img = Image.new("RGB", (w, h), "white")
    for y in range(100, h - 100, 40):
        img.paste((20, 20, 20), (100, y, w - 100, y + 12))
    return RenderedPage(0, w, h, img.tobytes(), 144.0)


def test_encode_is_a_jpeg_within_the_long_side() -> None:
    # A4 at 144, 200 and 300 dpi, a wide scan, a small image
    for w, h, long_side in ((1191, 1684, 1600), (1654, 2339, 1170), (2480, 3508, 1600),
                            (3000, 2000, 1500), (400, 300, 400)):
        img = Image.open(io.BytesIO(encode(_page(w, h).to_image())))
        assert img.format == "JPEG"
        assert max(img.size) == long_side <= LONG_SIDE
        assert abs(img.size[0] / img.size[1] - w / h) < 0.01


def test_the_render_worker_makes_the_preview(tmp_path: Path) -> None:
    """In the daemon's render pool (processes, pages through tmpfs): the page comes back
    with its pixels as before and its preview beside them."""
    import asyncio

    from helpers import make_pdf, sentence_lines

    pdf = make_pdf(tmp_path / "a.pdf", [sentence_lines(1), sentence_lines(2)])

    async def run() -> list[RenderedPage]:
        pool = pages.RenderPool(1)
        await pool.start()
        try:
            info = await pool.call(pages.probe, str(pdf), 144, 10, 2**31, 200_000_000)
            return [await pool.call(render_with_preview, str(pdf), info, i, 144, 200_000_000)
                    for i in range(info.pages)]
        finally:
            await pool.close()

    for got in asyncio.run(run()):
        plain = pages.render_page(str(pdf), pages.probe(str(pdf), 144, 10, 2**31, 200_000_000),
                                  got.index, 144, 200_000_000)
        assert got.data == plain.data and got.preview is not None
        img = Image.open(io.BytesIO(got.preview))
        assert img.format == "JPEG" and max(img.size) == LONG_SIDE


def test_writer_thread_writes_and_a_full_queue_skips(tmp_path: Path) -> None:
    p = Previews(tmp_path / "previews", days=30, max_bytes=10**9)
    sha = "cd" * 32
    page = RenderedPage(0, 1, 1, b"\0\0\0", 72.0, preview=b"\xff\xd8 jpeg")
    # not started: nothing takes from the queue, so after QUEUE_PAGES previews the rest
    # are skipped at once instead of waiting
    t0 = time.monotonic()
    for n in range(1, QUEUE_PAGES + 3):
        p.page(sha, n, page)
    p.page(sha, 1000, RenderedPage(0, 1, 1, b"\0\0\0", 72.0))  # no preview: nothing
    assert time.monotonic() - t0 < 5
    assert p.stats.skipped == 2
    p.start()
    wait_for(lambda: p.stats.written == QUEUE_PAGES, 120, "previews written")
    p.stop()
    assert sorted(f.name for f in p.folder(sha).iterdir()) == \
        [f"p{n:04d}.jpg" for n in range(1, QUEUE_PAGES + 1)]
    assert p.path("../../etc", 1) is None and p.path(sha, 0) is None


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
