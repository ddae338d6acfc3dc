"""Pages rendered in the worker processes reach the daemon intact, through tmpfs files
that are removed as they are read (real PDFium, real worker processes)."""

from __future__ import annotations

import asyncio
import os
import pickle
from pathlib import Path

import pytest
from helpers import make_pdf, sentence_lines
from PIL import Image

from ocrd import pages

MAX_PIXELS = 50_000_000


def shared_files() -> set[str]:
    """This process's page files (other daemons on the machine have their own)."""
    mine = f"{pages.SHARED_PREFIX}{os.getpid()}-"
    try:
        return {n for n in os.listdir(pages.SHARED_DIR) if n.startswith(mine)}
    except FileNotFoundError:
        return set()


@pytest.mark.skipif(not pages._shared_dir_usable(), reason="no writable /dev/shm")
def test_pool_pages_equal_in_process_pages_and_leave_no_files(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "a.pdf", [sentence_lines(i, 6) for i in range(6)])
    img_path = tmp_path / "photo.png"
    Image.new("RGB", (900, 700), (200, 30, 30)).save(img_path)
    before = shared_files()

    async def scenario() -> tuple[list[pages.RenderedPage], pages.RenderedPage]:
        pool = pages.RenderPool(2)
        await pool.start()
        try:
            info = await pool.call(pages.probe, str(pdf), 144, 50, 10**9, MAX_PIXELS)
            got = await asyncio.gather(*(
                pool.call(pages.render_page, str(pdf), info, i, 144, MAX_PIXELS)
                for i in range(info.pages)))
            img_info = await pool.call(pages.probe, str(img_path), 144, 50, 10**9,
                                       MAX_PIXELS)
            photo = await pool.call(pages.render_page, str(img_path), img_info, 0, 144,
                                    MAX_PIXELS)
            return got, photo
        finally:
            await pool.close()

    got, photo = asyncio.run(scenario())
    info = pages.probe(str(pdf), 144, 50, 10**9, MAX_PIXELS)
    for i, page in enumerate(got):
        local = pages.render_page(str(pdf), info, i, 144, MAX_PIXELS)
        assert (page.index, page.width, page.height) == (i, local.width, local.height)
        assert page.shared is None  # a normal page in the daemon's process
        assert page.data == local.data  # pixel for pixel
    assert photo.to_image().getpixel((10, 10)) == (200, 30, 30)
    assert shared_files() - before == set()  # every file was read and removed


def test_outside_a_worker_pages_pickle_as_plain_bytes() -> None:
    page = pages.RenderedPage(0, 600, 400, bytes(600 * 400 * 3), 144.0)
    before = shared_files()
    copy = pickle.loads(pickle.dumps(page))
    assert copy == page and copy.data == page.data
    assert shared_files() == before
