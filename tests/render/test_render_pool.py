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

from ocrd import errors
from ocrd.render import pages, pixels
from ocrd.render.pool import RenderPool

MAX_PIXELS = 50_000_000


def shared_files() -> set[str]:
    """This process's page files (other daemons on the machine have their own)."""
    mine = f"{pixels.SHARED_PREFIX}{os.getpid()}-"
    try:
        return {n for n in os.listdir(pixels.SHARED_DIR) if n.startswith(mine)}
    except FileNotFoundError:
        return set()


@pytest.mark.skipif(not pixels._shared_dir_usable(), reason="no writable /dev/shm")
def test_pool_pages_equal_in_process_pages_and_leave_no_files(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "a.pdf", [sentence_lines(i, 6) for i in range(6)])
    img_path = tmp_path / "photo.png"
    Image.new("RGB", (900, 700), (200, 30, 30)).save(img_path)
    before = shared_files()

    async def scenario() -> tuple[list[pages.RenderedPage], pages.RenderedPage]:
        pool = RenderPool(2)
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


def _sleep_then_pid(seconds: float) -> int:
    import time

    time.sleep(seconds)
    return os.getpid()


def test_a_worker_starts_clean_for_each_file() -> None:
    """One worker, two real files in turn: the encrypted one, then a damaged one that
    PDFium refuses without saying why. PDFium's last error ("password") used to come
    over from the first file, and the damaged file was reported as encrypted."""
    real = Path(__file__).resolve().parents[1] / "real_files"

    async def scenario() -> None:
        pool = RenderPool(1)
        await pool.start()
        try:
            for _ in range(2):  # and back again: each file's turn starts clean
                async with pool.document() as locked, pool.document() as damaged:
                    with pytest.raises(errors.Encrypted):
                        await locked.call(pages.probe, str(real / "issue6010_1.pdf"),
                                          144, 50, 10**9, MAX_PIXELS)
                    with pytest.raises(errors.Damaged):
                        await damaged.call(pages.probe,
                                           str(real / "poppler-395-0-fuzzed.pdf"), 144, 50,
                                           10**9, MAX_PIXELS)
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_a_crash_fails_only_the_call_that_crashed() -> None:
    """A worker that crashes breaks every call of the pool; the calls it took down with
    it (another file's here) are tried again alone and succeed, the crashing one fails."""
    async def scenario() -> None:
        pool = RenderPool(2)
        await pool.start()
        try:
            async with pool.document() as a, pool.document() as b:
                innocent = asyncio.ensure_future(b.call(_sleep_then_pid, 1.0))
                await asyncio.sleep(0.2)  # the innocent call is running when ...
                with pytest.raises(errors.RenderFailed, match="crashed on this file twice"):
                    await a.call(os._exit, 3)  # ... another file's call kills a worker
                assert await innocent > 0
                assert await b.call(os.getpid) > 0  # the pool was rebuilt
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_an_unexpected_exception_in_a_worker_is_an_internal_error_with_its_traceback() -> None:
    async def scenario() -> errors.InternalError:
        pool = RenderPool(1)
        try:
            with pytest.raises(errors.InternalError) as e:
                await pool.call(int, "not a number")
            return e.value
        finally:
            await pool.close()

    err = asyncio.run(scenario())
    assert err.reason == "internal_error"
    assert "ValueError: invalid literal for int()" in str(err)
    assert err.details and "Traceback" in err.details and "ValueError" in err.details
