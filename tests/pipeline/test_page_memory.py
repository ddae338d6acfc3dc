"""Pages stay in their own mode on their way to tesseract (grey; 1-bit scans as packed
bits) and page images in flight are bounded by a memory budget (ocrd/render/modes.py,
ocrd/pipeline/budget.py) — real PDFs, PDFium and tesseract."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import make_pdf, sentence_lines
from simulated_engines import SIMULATED

from bench.memory import TEXT, huge_pdf
from ocrd.pipeline.budget import MemoryBudget, Reservation
from ocrd.render import pages, resolution

TESSERACT = resolution.Resolution(300, 200, 600, grey=True)


@pytest.mark.e2e
def test_a_one_bit_scan_stays_packed_bits_and_tesseract_reads_it(tmp_path: Path) -> None:
    pdf = huge_pdf(tmp_path / "mono.pdf", 3000)  # 10 in square, 1-bit at 300 dpi
    info = pages.probe(str(pdf), 144, 10, 10**9, 10**9)
    page = pages.render_page(str(pdf), info, 0, TESSERACT, 10**9)
    assert (page.mode, page.width, page.height, page.dpi) == ("1", 3000, 3000, 300)
    assert len(page.data) == 375 * 3000  # 1 bit a pixel, not 24
    assert page.pnm_header() == b"P4\n3000 3000\n"
    text = make_pdf(tmp_path / "text.pdf", [sentence_lines(80, 3)])
    grey = pages.render_page(str(text), pages.probe(str(text), 144, 10, 10**9, 10**9), 0,
                             TESSERACT, 10**9)
    assert grey.mode == "L" and len(grey.data) == grey.width * grey.height
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", str(pdf), "-o", "out"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "OCRD_CONFIG": ""})
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "out" / "mono.md").read_text()
    assert sum(w in md for w in TEXT.split()) >= 9, md


def test_no_page_may_cost_more_than_the_budget(tmp_path: Path) -> None:
    pdf = huge_pdf(tmp_path / "mono.pdf", 3000)
    info = pages.probe(str(pdf), 144, 10, 10**9, 10**9)
    res = resolution.Resolution(300, 200, 600, grey=True, page_budget=20 * 2**20,
                                pixel_bytes=(("1", 7.5), ("L", 11.0)))
    page = pages.render_page(str(pdf), info, 0, res, 10**9)
    assert page.mode == "1" and res.cost("1", page.width * page.height) <= 20 * 2**20
    assert page.dpi < 300
    # grey pages cost more a pixel: they get fewer
    assert res.max_pixels("L", 10**9) < res.max_pixels("1", 10**9) < 10**9


def test_memory_budget_is_first_come_first_served() -> None:
    async def scenario() -> list[str]:
        budget = MemoryBudget(100)
        order: list[str] = []
        a = Reservation(budget)
        await a.reserve(60)

        async def want(name: str, n: int) -> Reservation:
            r = Reservation(budget)
            await r.reserve(n)
            order.append(name)
            return r

        big = asyncio.create_task(want("big", 500))  # more than all: waits to be alone
        await asyncio.sleep(0)
        small = asyncio.create_task(want("small", 10))  # would fit, but queues behind
        await asyncio.sleep(0)
        assert order == [] and budget.used == 60
        a.release()
        got_big = await big
        assert budget.used == 100 and order == ["big"]
        got_big.release()
        await small
        assert order == ["big", "small"] and budget.used == 10
        await (await small).settle(40)  # a page found to be larger queues for the rest
        assert budget.used == 40
        return order

    assert asyncio.run(scenario()) == ["big", "small"]


def test_a_larger_budget_lets_waiting_pages_in() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(100)
        await Reservation(budget).reserve(80)
        waiting = asyncio.create_task(Reservation(budget).reserve(50))
        await asyncio.sleep(0)
        assert not waiting.done()
        budget.resize(200)  # a reload raised limits.memory_bytes
        await asyncio.wait_for(waiting, 5)
        assert budget.used == 130

    asyncio.run(scenario())


def test_a_cancelled_wait_gives_nothing_away() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(100)
        first = Reservation(budget)
        await first.reserve(100)
        waiting = asyncio.create_task(Reservation(budget).reserve(50))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        first.release()
        assert budget.used == 0

    asyncio.run(scenario())


@pytest.mark.e2e
def test_the_budget_setting_reaches_the_sidecar_page_size(tmp_path: Path) -> None:
    pdf = huge_pdf(tmp_path / "mono.pdf", 3000)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("limits: {memory_bytes: 67108864}\n")  # 64 MiB: 8.9 Mpx of 1-bit
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", "-c", str(cfg), str(pdf),
                        "-o", "out"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env={**os.environ, "OCRD_CONFIG": ""})
    assert r.returncode == 0, r.stderr
    page = json.loads((tmp_path / "out" / "mono.json").read_text())["pages"][0]
    assert page["width"] * page["height"] * 7.5 <= 64 * 2**20 and page["dpi"] < 300


# ---- the default budget and the engine's pages in flight ---------------------------------

def converter_for(engine_cfg: dict, slots: int, memory_bytes: int | None = None) -> Any:
    from ocrd.config.settings import Config
    from ocrd.engines import create_engine
    from ocrd.pipeline.document import Converter
    from ocrd.pipeline.schedule import FairSlots

    cfg = Config.model_validate({"engine": engine_cfg, "inboxes": [], "state_dir": "/nonexistent",
                                 "limits": {"memory_bytes": memory_bytes}})
    return Converter(cfg, create_engine(cfg.engine), None, FairSlots(slots))  # type: ignore[arg-type]


def test_the_default_budget_holds_the_engines_pages_in_flight() -> None:
    """limits.memory_bytes unset: a GPU engine's hundreds of pages in flight fit (two
    servers on an H200: 544); a fixed 1 GiB let 76 A4 pages in and starved the GPU. One
    page may still cost at most 1 GiB (the scans' bound of issue 16)."""
    gpu = converter_for({"kind": SIMULATED, "options": {"concurrency": 544}}, 544)
    a4 = gpu.resolution.cost("RGB", gpu.resolution.a4_pixels())
    assert a4 > 12 * 2**20  # A4 at 144 dpi, packed and as an image
    assert gpu.memory.total // a4 >= 544 > 2**30 // a4
    assert gpu.resolution.page_budget == 2**30
    # a small engine keeps the 1 GiB floor (tesseract on 2 cores: ~192 MB of pages)
    cpu = converter_for({"kind": "tesseract"}, 2)
    assert cpu.memory.total == cpu.resolution.page_budget == 2**30
    # a value set is the budget and each page's cap, as before
    fixed = converter_for({"kind": SIMULATED}, 544, 64 * 2**20)
    assert fixed.memory.total == fixed.resolution.page_budget == 64 * 2**20
    # a reload follows the slots (more pages in flight, more budget) and the setting
    gpu.slots.resize(1000)
    gpu.set_memory(None)
    assert gpu.memory.total // a4 >= 1000
    gpu.set_memory(256 * 2**20)
    assert gpu.memory.total == gpu.resolution.page_budget == 256 * 2**20


@pytest.mark.e2e
def test_a_daemon_keeps_as_many_a4_pages_in_flight_as_its_engine_takes(tmp_path: Path) -> None:
    """The daemon with a simulated continuous-batching engine that takes 120 pages at
    once and 16 eight-page A4 PDFs at 144 dpi: the engine gets 120 pages (with the old
    fixed 1 GiB: 76). No page finishes within the test (each takes ~30 min), so the
    peak does not depend on how fast this machine renders; the stop does not wait."""
    from helpers import Daemon, drop

    from bench.gpu.inputs import make_pdfs

    pdfs = make_pdfs(tmp_path / "pdfs", 128, 8, 1000)
    engine = {"kind": SIMULATED, "options": {
        "max_batch": 120, "concurrency": 120, "step_seconds": 0.1,
        "step_per_page_seconds": 0.0, "prefill_seconds_per_megapixel": 0.0,
        "decode_steps": 18_000, "decode_jitter": 0.0}}
    with Daemon(tmp_path / "d", engine=engine, drain_timeout_seconds=0) as d:
        ready = d.start().event("ready")
        assert ready["pages_in_flight"] == 120
        assert ready["memory_budget_bytes"] > 2**30
        for pdf in pdfs:
            drop(pdf, d.inbox / pdf.name)
        peak, deadline = 0.0, time.monotonic() + 600
        while peak < 120 and time.monotonic() < deadline:
            peak = max(peak, d.metric("ocrd_pages_in_flight") or 0)
            time.sleep(0.2)
        assert peak == 120
        d.stop(strict=False)
