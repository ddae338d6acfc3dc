"""Page previews: JPEG, long side at most 1600 px, written by one thread without holding
up the caller; the store stays within its age and byte limits."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

from helpers import wait_for
from PIL import Image

from ocrd.pages import RenderedPage
from ocrd.previews import LONG_SIDE, QUEUE_PAGES, Previews, encode


def _page(w: int = 1191, h: int = 1684) -> RenderedPage:
    img = Image.new("RGB", (w, h), "white")
    for y in range(100, h - 100, 40):
        img.paste((20, 20, 20), (100, y, w - 100, y + 12))
    return RenderedPage(0, w, h, img.tobytes(), 144.0)


def test_encode_is_a_jpeg_within_the_long_side() -> None:
    for w, h in ((1191, 1684), (3000, 2000), (400, 300)):
        img = Image.open(io.BytesIO(encode(_page(w, h))))
        assert img.format == "JPEG"
        assert max(img.size) == min(LONG_SIDE, max(w, h))
        assert abs(img.size[0] / img.size[1] - w / h) < 0.01


def test_writer_thread_writes_and_a_full_queue_skips(tmp_path: Path) -> None:
    p = Previews(tmp_path / "previews", days=30, max_bytes=10**9)
    sha = "cd" * 32
    page = _page()
    # not started: nothing takes from the queue, so after QUEUE_PAGES pages the rest are
    # skipped at once instead of waiting
    t0 = time.monotonic()
    for n in range(1, QUEUE_PAGES + 3):
        p.page(sha, n, page)
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
