"""The benchmarks. Each measures ocrd and its peer side by side in the same run and
returns ratios, so that a busy or slow machine moves both sides alike.

Every case takes `quick` (smaller inputs, the whole set in under ten minutes on two
cores) and returns a list of `Result` rows.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import (
    OUT,
    PAGE_DESIGNS,
    PAGE_KINDS,
    ROOT,
    SIMULATED_ENGINE,
    DaemonProcess,
    TreeRss,
    daemon_config,
    drop_file,
    event_time,
    markdown_files,
    mixed_pdf_bytes,
    pdf_bytes,
    png_bytes,
    sha256,
    wait_for,
    write_pdf,
)

DPI = 144
# The simulated engine as configured by default: a batching GPU doing ~15 pages/s.
SIMULATED: dict[str, Any] = {"kind": SIMULATED_ENGINE}
# Zero engine time: what is left is the daemon's own per-file and per-page work.
INSTANT: dict[str, Any] = {"kind": SIMULATED_ENGINE, "options": {"instant": True}}


@dataclass
class Result:
    name: str
    value: float
    target: float
    op: str  # ">=" or "<="
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        if self.error is not None:
            return False
        return self.value >= self.target if self.op == ">=" else self.value <= self.target

    def row(self) -> dict[str, Any]:
        return {"name": self.name, "ratio": round(self.value, 4), "target": self.target,
                "op": self.op, "ok": self.ok, "error": self.error, "details": self.details}


def fresh(name: str) -> Path:
    root = OUT / name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    return root


def _log(msg: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- 1. engine saturation -----------------------------------------------------------------

# Page counts of the documents dropped at once: receipts to manuals, 240 pages.
SATURATION_DOCS = [1, 4, 30, 2, 12, 45, 6, 20, 1, 60, 8, 25, 3, 23]


@dataclass
class Doc:
    name: str
    data: bytes
    pages: int
    first_design: int

    @property
    def doc_id(self) -> str:
        return sha256(self.data)  # what the daemon passes to the engine as doc_id

    def designs(self) -> list[int]:
        return [(self.first_design + k) % PAGE_DESIGNS for k in range(self.pages)]


def saturation_docs(quick: bool) -> list[Doc]:
    sizes = SATURATION_DOCS if quick else SATURATION_DOCS * 2
    return [Doc(f"doc{i:02d}.pdf", pdf_bytes(n, i * 7), n, i * 7)
            for i, n in enumerate(sizes)]


def design_images(dpi: int = DPI) -> list[Any]:
    """Every page design rendered exactly as the daemon renders it."""
    from ocrd.render import pages

    root = fresh("designs")
    path = write_pdf(root / "designs.pdf", PAGE_DESIGNS)
    info = pages.probe(str(path), dpi, 10_000, 2**31, 200_000_000)
    images = [pages.render_page(str(path), info, i, dpi, 200_000_000).to_image()
              for i in range(PAGE_DESIGNS)]
    pages.forget(str(path))
    return images


async def _drive(engine_cfg: dict, requests: list[Any], concurrency: int) -> dict:
    """The engine on its own: every page submitted, at most `concurrency` at once."""
    from ocrd.config.settings import EngineConfig
    from ocrd.engines import create_engine

    engine = create_engine(EngineConfig.model_validate(engine_cfg))
    await engine.start()
    sem = asyncio.Semaphore(concurrency)

    async def one(req: Any) -> None:
        async with sem:
            await engine.ocr(req)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(r) for r in requests))
        seconds = time.perf_counter() - t0
    finally:
        await engine.close()
    return {"concurrency": concurrency, "pages": len(requests), "seconds": round(seconds, 3),
            "pages_per_s": len(requests) / seconds}


async def _fixed_batches(engine_cfg: dict, docs: list[Doc], batch: int = 4) -> dict:
    """What a typical script does: render every page, then generate `batch` pages at a
    time and wait for the whole batch before the next."""
    import pypdfium2 as pdfium

    from ocrd.config.settings import EngineConfig
    from ocrd.engines import create_engine
    from ocrd.engines.base import PageRequest

    engine = create_engine(EngineConfig.model_validate(engine_cfg))
    await engine.start()
    try:
        t0 = time.perf_counter()
        requests = []
        for doc in docs:
            pdf = pdfium.PdfDocument(doc.data)
            for k in range(len(pdf)):
                img = pdf[k].render(scale=DPI / 72, rev_byteorder=True).to_pil()
                requests.append(PageRequest(image=img.convert("RGB"), page_no=k + 1,
                                            doc_id=doc.doc_id))
            pdf.close()
        rendered = time.perf_counter() - t0
        for i in range(0, len(requests), batch):
            await asyncio.gather(*(engine.ocr(r) for r in requests[i:i + batch]))
        seconds = time.perf_counter() - t0
    finally:
        await engine.close()
    return {"pages": len(requests), "seconds": round(seconds, 3),
            "render_seconds": round(rendered, 3), "pages_per_s": len(requests) / seconds}


def _run_daemon_on(root: Path, engine_cfg: dict, docs: list[Doc], timeout: float,
                   **top: Any) -> dict:
    """Drop every document into a running daemon's inbox at once; pages/s from the
    first byte written to the last Markdown file written."""
    with DaemonProcess(root, daemon_config(root, engine_cfg, **top)).start() as d:
        t0 = time.time()
        for doc in docs:
            drop_file(d.inbox / doc.name, doc.data)
        done = d.wait_markdown(len(docs), timeout)
        seconds = done[-1] - t0
        claims = [event_time(e) for e in d.events("file_claimed")]
    pages = sum(doc.pages for doc in docs)
    return {"pages": pages, "files": len(docs), "seconds": round(seconds, 3),
            "pages_per_s": pages / seconds,
            "first_claim_after_s": round(min(claims) - t0, 3) if claims else None}


def engine_saturation(engine_cfg: dict, quick: bool, label: str = "simulated",
                      concurrencies: Iterable[int] | None = None, target: float = 0.95,
                      docs: list[Doc] | None = None) -> list[Result]:
    """Daemon pages/s ÷ the same engine driven directly with the same page images at its
    best concurrency, and daemon ÷ a fixed-batch loop. Takes any engine config (a dict
    as under `engine:` in config.yaml), so a real engine can be measured the same way:
    e.g. `engine_saturation({"kind": "vllm", "model": ...}, quick)`."""
    from ocrd.config.settings import EngineConfig
    from ocrd.engines import create_engine
    from ocrd.engines.base import PageRequest

    root = fresh(f"saturation-{label}")
    docs = docs or saturation_docs(quick)
    images = design_images()
    requests = [PageRequest(image=images[design], page_no=k + 1, doc_id=doc.doc_id)
                for doc in docs for k, design in enumerate(doc.designs())]
    probe_engine = create_engine(EngineConfig.model_validate(engine_cfg))
    preferred = probe_engine.max_concurrency
    batch = getattr(getattr(probe_engine, "cfg", None), "max_batch", preferred)
    if concurrencies is None:
        concurrencies = sorted({batch, preferred, 2 * batch})

    _log(f"saturation[{label}]: {len(requests)} pages in {len(docs)} documents")
    direct = []
    for c in concurrencies:
        direct.append(asyncio.run(_drive(engine_cfg, requests, c)))
        _log(f"  engine alone, {c} at once: {direct[-1]['pages_per_s']:.2f} pages/s")
    best = max(direct, key=lambda r: r["pages_per_s"])

    daemon = _run_daemon_on(root, engine_cfg, docs, timeout=60 + 3 * best["seconds"])
    _log(f"  daemon: {daemon['pages_per_s']:.2f} pages/s")

    # The fixed-batch loop is slow: measure it on the first documents (~60 pages).
    subset, n = [], 0
    for doc in docs:
        if n >= 60:
            break
        subset.append(doc)
        n += doc.pages
    fixed = asyncio.run(_fixed_batches(engine_cfg, subset))
    _log(f"  fixed batches of 4: {fixed['pages_per_s']:.2f} pages/s")

    del requests, images
    return [
        Result(f"saturation_{label}", daemon["pages_per_s"] / best["pages_per_s"], target,
               ">=", {"daemon": daemon, "engine_alone": direct, "best": best["concurrency"],
                      "engine": engine_cfg}),
        Result(f"vs_fixed_batch_{label}", daemon["pages_per_s"] / fixed["pages_per_s"], 1.5,
               ">=", {"daemon": daemon, "fixed_batch": fixed, "engine": engine_cfg}),
    ]


# -- 2. rendering -------------------------------------------------------------------------


async def _render_ocrd(path: Path, pages_n: int, workers: int) -> dict:
    from ocrd.render import pages
    from ocrd.render.pool import RenderPool

    pool = RenderPool(workers)
    await pool.start()  # the fork server is the daemon's, once: not per page
    try:
        # as the daemon: the document's own workers (started within the timing)
        t0 = time.perf_counter()
        async with pool.document() as doc:
            info = await doc.call(pages.probe, str(path), DPI, 10_000, 2**31, 200_000_000)
            sem = asyncio.Semaphore(2 * workers)  # as the daemon: a bounded look-ahead

            async def one(i: int) -> int:
                async with sem:
                    page = await doc.call(pages.render_page, str(path), info, i, DPI,
                                          200_000_000)
                    return len(page.data)

            sizes = await asyncio.gather(*(one(i) for i in range(pages_n)))
            seconds = time.perf_counter() - t0
    finally:
        await pool.close()
    return {"pages": pages_n, "seconds": round(seconds, 3), "pages_per_s": pages_n / seconds,
            "bytes_per_page": sizes[0], "workers": workers}


def _render_pdftoppm(path: Path, pages_n: int, workers: int) -> dict:
    """poppler with every core busy: one pdftoppm per page range, PPM (its fastest
    output) on tmpfs when there is one."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else str(OUT)
    with tempfile.TemporaryDirectory(dir=base, prefix="ocrd-bench-") as tmp:
        ranges = []
        per = -(-pages_n // workers)
        for w in range(workers):
            first, last = w * per + 1, min(pages_n, (w + 1) * per)
            if first <= last:
                ranges.append((first, last))
        t0 = time.perf_counter()
        procs = [subprocess.Popen(["pdftoppm", "-r", str(DPI), "-f", str(a), "-l", str(b),
                                   str(path), f"{tmp}/p{w}"])
                 for w, (a, b) in enumerate(ranges)]
        codes = [p.wait() for p in procs]
        seconds = time.perf_counter() - t0
        made = len(os.listdir(tmp))
    if any(codes) or made != pages_n:
        raise RuntimeError(f"pdftoppm failed: exit codes {codes}, {made} of {pages_n} pages")
    return {"pages": pages_n, "seconds": round(seconds, 3), "pages_per_s": pages_n / seconds,
            "processes": len(ranges)}


def rendering(quick: bool) -> list[Result]:
    root = fresh("rendering")
    n = 120 if quick else 300
    path = root / "render.pdf"
    path.write_bytes(mixed_pdf_bytes(n))
    workers = os.cpu_count() or 1
    _log(f"rendering: {n} pages ({', '.join(PAGE_KINDS)}) at {DPI} dpi, "
         f"{workers} processes each")
    # Alternate the two, twice, and keep each one's best: both see the same machine.
    ours, theirs = [], []
    for _ in range(2):
        ours.append(asyncio.run(_render_ocrd(path, n, workers)))
        theirs.append(_render_pdftoppm(path, n, workers))
    best_ours = max(r["pages_per_s"] for r in ours)
    best_theirs = max(r["pages_per_s"] for r in theirs)
    _log(f"  ocrd RenderPool {best_ours:.1f} pages/s, pdftoppm {best_theirs:.1f} pages/s")
    # Each kind of page on its own, once each, for the details.
    per_kind = {}
    for kind in PAGE_KINDS:
        kpath = root / f"{kind}.pdf"
        kpath.write_bytes(mixed_pdf_bytes(24 if quick else 60, (kind,)))
        k_ours = asyncio.run(_render_ocrd(kpath, 24 if quick else 60, workers))
        k_theirs = _render_pdftoppm(kpath, 24 if quick else 60, workers)
        per_kind[kind] = {"ocrd": round(k_ours["pages_per_s"], 1),
                          "pdftoppm": round(k_theirs["pages_per_s"], 1),
                          "ratio": round(k_ours["pages_per_s"] / k_theirs["pages_per_s"], 2)}
        _log(f"  {kind}: ocrd {per_kind[kind]['ocrd']} vs pdftoppm "
             f"{per_kind[kind]['pdftoppm']} pages/s")
    return [Result("rendering", best_ours / best_theirs, 2.0, ">=",
                   {"ocrd": ours, "pdftoppm": theirs, "per_kind": per_kind})]


# -- 3. memory ----------------------------------------------------------------------------


def _peak_rss_converting(root: Path, pages_n: int, engine_cfg: dict,
                         inbox: dict | None = None) -> dict:
    data = pdf_bytes(pages_n)
    with DaemonProcess(root, daemon_config(root, engine_cfg, inbox=inbox or {})).start() as d:
        with TreeRss(d.pid, interval=0.01) as rss:
            idle = rss.sample()
            t0 = time.time()
            drop_file(d.inbox / f"doc{pages_n}.pdf", data)
            done = d.wait_markdown(1, timeout=120 + pages_n * 0.5, every=0.1)
        return {"pages": pages_n, "peak_rss_mb": round(rss.peak / 2**20, 1),
                "idle_rss_mb": round(idle / 2**20, 1), "processes": rss.peak_procs,
                "peak_by_process_mb": rss.peak_by_process,
                "samples": rss.samples, "seconds": round(done[-1] - t0, 2)}


def memory(quick: bool) -> list[Result]:
    _log("memory: a 10-page and a 1,000-page PDF, each through a fresh daemon")
    small = _peak_rss_converting(fresh("memory-10"), 10, SIMULATED)
    _log(f"  10 pages: peak {small['peak_rss_mb']} MB")
    big = _peak_rss_converting(fresh("memory-1000"), 1000, SIMULATED)
    _log(f"  1,000 pages: peak {big['peak_rss_mb']} MB ({big['seconds']} s)")
    return [Result("memory_1000_vs_10_pages", big["peak_rss_mb"] / small["peak_rss_mb"],
                   1.25, "<=", {"10_pages": small, "1000_pages": big})]


def memory_pdf(quick: bool) -> list[Result]:
    """The same with the searchable PDF on (outputs: [markdown, pdf]), a layer on every
    page (pdf_text_layer: add; the bench's pages are born-digital text, which
    skip_if_text would leave alone). Checks that the PDF has every page."""
    import pikepdf

    inbox = {"outputs": ["markdown", "pdf"], "pdf_text_layer": "add"}
    _log("memory_pdf: the same two PDFs with the searchable PDF written too")
    rows = {}
    for n in (10, 1000):
        root = fresh(f"memory-pdf-{n}")
        rows[n] = _peak_rss_converting(root, n, SIMULATED, inbox)
        with pikepdf.open(root / "outbox" / f"doc{n}.pdf") as pdf:
            if len(pdf.pages) != n:
                raise RuntimeError(f"doc{n}.pdf has {len(pdf.pages)} pages, not {n}")
        rows[n]["pdf_bytes"] = (root / "outbox" / f"doc{n}.pdf").stat().st_size
        _log(f"  {n} pages: peak {rows[n]['peak_rss_mb']} MB ({rows[n]['seconds']} s)")
    return [Result("memory_pdf_1000_vs_10_pages",
                   rows[1000]["peak_rss_mb"] / rows[10]["peak_rss_mb"], 1.25, "<=",
                   {"10_pages": rows[10], "1000_pages": rows[1000]})]


# -- 4. pick-up latency -------------------------------------------------------------------


def pickup(quick: bool) -> list[Result]:
    root = fresh("pickup")
    n = 30 if quick else 80
    png = png_bytes(1)
    pdf = pdf_bytes(1)
    _log(f"pickup: {n} files written one at a time into an idle daemon's inbox")
    closed: dict[str, float] = {}
    with DaemonProcess(root, daemon_config(root, INSTANT)).start() as d:
        for i in range(n):
            name = f"p{i:03d}.png" if i % 2 == 0 else f"p{i:03d}.pdf"
            closed[name] = drop_file(d.inbox / name, png if i % 2 == 0 else pdf)
            time.sleep(0.2)
        d.wait_markdown(n, timeout=60)
        claims = {e["file"]: event_time(e) for e in d.events("file_claimed")}
    lat = sorted((claims[name] - t) * 1000 for name, t in closed.items() if name in claims)
    if len(lat) != n:
        raise RuntimeError(f"only {len(lat)} of {n} files were claimed")
    p50 = statistics.median(lat)
    p95 = lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))]
    _log(f"  p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {lat[-1]:.1f} ms")
    details = {"files": n, "p50_ms": round(p50, 2), "p95_ms": round(p95, 2),
               "max_ms": round(lat[-1], 2), "latencies_ms": [round(x, 2) for x in lat]}
    return [Result("pickup_p50_vs_100ms", p50 / 100, 1.0, "<=", details),
            Result("pickup_p95_vs_250ms", p95 / 250, 1.0, "<=", details)]


def pickup_moved(quick: bool) -> list[Result]:
    """A file renamed into the inbox (written elsewhere, then `mv`: complete when it
    appears) against one written in place and closed, interleaved in one daemon with the
    default quiet period (5 s). Both take the fast path; before IN_MOVED_TO did, a moved-in
    file waited the whole quiet period."""
    root = fresh("pickup_moved")
    n = 20 if quick else 60
    staging = root / "staging"
    staging.mkdir(parents=True)
    pdf = pdf_bytes(1)
    _log(f"pickup_moved: {n} files, every other one moved in, quiet_seconds 5")
    at: dict[str, tuple[str, float]] = {}
    with DaemonProcess(root, daemon_config(root, INSTANT)).start() as d:
        for i in range(n):
            name = f"m{i:03d}.pdf"
            if i % 2:
                (staging / name).write_bytes(pdf)
                os.rename(staging / name, d.inbox / name)
                at[name] = ("moved", time.time())
            else:
                at[name] = ("closed", drop_file(d.inbox / name, pdf))
            time.sleep(0.3)
        d.wait_markdown(n, timeout=120)
        claims = {e["file"]: event_time(e) for e in d.events("file_claimed")}
    lat: dict[str, list[float]] = {"moved": [], "closed": []}
    for name, (how, t) in at.items():
        lat[how].append((claims[name] - t) * 1000)
    p50 = {how: statistics.median(v) for how, v in lat.items()}
    _log(f"  p50 moved {p50['moved']:.1f} ms, closed {p50['closed']:.1f} ms")
    details = {"files": n, "quiet_seconds": 5, "p50_ms": {k: round(v, 2) for k, v in p50.items()},
               "max_ms": {k: round(max(v), 2) for k, v in lat.items()},
               "latencies_ms": {k: [round(x, 2) for x in sorted(v)] for k, v in lat.items()}}
    return [Result("pickup_moved_p50_vs_closed", p50["moved"] / p50["closed"], 1.5, "<=",
                   details)]


# -- 5. burst -----------------------------------------------------------------------------


def burst(quick: bool) -> list[Result]:
    root = fresh("burst")
    n = 2000 if quick else 10_000
    _log(f"burst: {n} small images dropped at once, instant engine")
    images = [png_bytes(i) for i in range(n)]
    with DaemonProcess(root, daemon_config(root, INSTANT)).start() as d:
        with TreeRss(d.pid, interval=0.1) as rss:
            t0 = time.time()
            for i, data in enumerate(images):
                drop_file(d.inbox / f"r{i:05d}.png", data)
            written = time.time() - t0
            done = d.wait_markdown(n, timeout=60 + n / 10, every=0.25)
            # anything still arriving (a duplicate) would show up shortly after
            time.sleep(1.0)
        seconds = done[-1] - t0
        names = sorted(e.name for e in markdown_files(d.outbox))
        expected = sorted(f"r{i:05d}.md" for i in range(n))
        failed = len(list(d.failed.rglob("*"))) if d.failed.exists() else 0
        archived = len(os.listdir(root / "archive")) if (root / "archive").exists() else 0
        converted = len(d.events("file_converted"))
    exactly_once = names == expected and converted == n and failed == 0 and archived == n
    files_per_s = n / seconds
    _log(f"  {files_per_s:.1f} files/s, peak RSS {rss.peak / 2**20:.0f} MB, "
         f"exactly once: {exactly_once}")
    details = {"files": n, "seconds": round(seconds, 2), "files_per_s": round(files_per_s, 1),
               "write_seconds": round(written, 2), "peak_rss_mb": round(rss.peak / 2**20, 1),
               "markdown_files": len(names), "converted_events": converted,
               "failed_entries": failed, "archived": archived,
               "unexpected_names": sorted(set(names) - set(expected))[:20],
               "exactly_once": exactly_once}
    result = Result("burst_files_per_s_vs_100", files_per_s / 100, 1.0, ">=", details)
    if not exactly_once:
        result.error = "not every file was converted exactly once"
    return [result]


# -- 6. small behind large ----------------------------------------------------------------


def small_behind_large(quick: bool) -> list[Result]:
    root = fresh("small-behind-large")
    big, small = pdf_bytes(300), pdf_bytes(1, 5)
    _log("small-behind-large: a 1-page file dropped while a 300-page one converts")
    with DaemonProcess(root, daemon_config(root, SIMULATED)).start() as d:
        t_big = drop_file(d.inbox / "manual.pdf", big)
        wait_for(lambda: d.events("file_claimed"), 30, "the big file's claim")
        time.sleep(2.0)  # well into the big document
        t_small = drop_file(d.inbox / "receipt.pdf", small)
        d.wait_markdown(2, timeout=300)
        md = {e.name: e.stat().st_mtime for e in markdown_files(d.outbox)}
    small_s, big_s = md["receipt.md"] - t_small, md["manual.md"] - t_big
    _log(f"  small {small_s:.2f} s after its drop, big {big_s:.2f} s")
    return [Result("small_vs_large_time", small_s / big_s, 0.2, "<=",
                   {"small_seconds": round(small_s, 3), "big_seconds": round(big_s, 3),
                    "small_done_before_big": md["receipt.md"] < md["manual.md"]})]


# The real vLLM engine (CPU build) on the tiny DeepSeek-OCR-2 the tests build: the same
# model code, processor and scheduler as on a GPU, random weights, 2 cores shared with
# the daemon's own work (hence the lower target).
VLLM_ENV = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "DSOCR2_TINY_VISION": "1",
    "DSOCR2_SCALED_DUMMY": "1",
}
VLLM_DOCS = [1, 4, 3, 2, 5, 1, 3, 1]  # 20 pages


def vllm_saturation(quick: bool) -> list[Result]:
    import importlib.util

    if importlib.util.find_spec("vllm") is None or \
            importlib.util.find_spec("vllm.v1") is None:
        _log("saturation[vllm]: vLLM is not installed (scripts/setup-vllm-cpu.sh): skipped")
        return []
    tests = ROOT / "tests" / "vllm_engine"
    plugin = tests / "plugin"
    os.environ.update(VLLM_ENV)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(plugin), os.environ.get("PYTHONPATH", "")) if p)
    for p in (str(plugin), str(tests)):
        if p not in sys.path:
            sys.path.insert(0, p)
    from tiny_model import build

    model = build(fresh("tiny-dsocr2"))
    cfg = {"kind": "vllm", "model": str(model), "max_tokens": 16, "loop_retries": 0,
           "vllm": {"dtype": "bfloat16", "max_model_len": 2048, "max_num_seqs": 4,
                    "engine_args": {"load_format": "dummy", "enforce_eager": True,
                                    "seed": 0, "distributed_executor_backend": "uni",
                                    "kv_cache_memory_bytes": 128 * 2**20}}}
    docs = [Doc(f"v{i:02d}.pdf", pdf_bytes(n, 100 + i * 5), n, 100 + i * 5)
            for i, n in enumerate(VLLM_DOCS if quick else VLLM_DOCS * 2)]
    return engine_saturation(cfg, quick, "vllm", concurrencies=[4, 8], target=0.85,
                             docs=docs)


def remote_saturation(quick: bool) -> list[Result]:
    """Issue 14.7: the remote engine against a continuous-batching server (bench/
    sim_server.py: the simulated engine behind vLLM's routes, a subprocess) whose batch
    is `concurrency_per_url`. The daemon with no queue on the server (queue_per_url 0,
    the old behaviour: every finished page leaves a batch place empty until the next
    request arrives) and with the default queue, interleaved, ÷ the same server fed
    directly by the remote client at its best concurrency."""
    from ocrd.engines.base import PageRequest

    batch = 16
    proc = subprocess.Popen([sys.executable, "-m", "bench.sim_server", "--max-batch",
                             str(batch)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline().split()[1])
        url = f"http://127.0.0.1:{port}/v1"
        def engine(**transport: Any) -> dict:
            return {"kind": "remote", "loop_retries": 0, "remote": {
                "urls": [url], "concurrency_per_url": batch, **transport}}

        wait_for(lambda: _answers(url), 30, "the simulated server")
        docs = saturation_docs(quick)
        images = design_images()
        requests = [PageRequest(image=images[design], page_no=k + 1, doc_id=doc.doc_id)
                    for doc in docs for k, design in enumerate(doc.designs())]
        _log(f"remote saturation: {len(requests)} pages, server batch {batch}")
        direct = []
        for c in (batch, batch + 2, 2 * batch):
            cfg = engine(concurrency_per_url=2 * batch, queue_per_url=0)
            direct.append(asyncio.run(_drive(cfg, requests, c)))
            _log(f"  server fed directly, {c} at once: {direct[-1]['pages_per_s']:.2f} pages/s")
        best = max(direct, key=lambda r: r["pages_per_s"])
        runs: dict[str, list[dict]] = {"no_queue": [], "queue": []}
        for i in range(2):
            for label, extra in (("no_queue", {"queue_per_url": 0}), ("queue", {})):
                root = fresh(f"remote-{label}-{i}")
                runs[label].append(_run_daemon_on(root, engine(**extra), docs,
                                                  timeout=60 + 4 * best["seconds"]))
                _log(f"  daemon, {label}: {runs[label][-1]['pages_per_s']:.2f} pages/s")
    finally:
        proc.terminate()
        proc.wait(10)
    rate = {k: max(r["pages_per_s"] for r in v) for k, v in runs.items()}
    facts = {"daemon": runs, "direct": direct, "best": best["concurrency"], "batch": batch}
    return [Result("remote_saturation", rate["queue"] / best["pages_per_s"], 0.95, ">=",
                   facts),
            Result("remote_queue_vs_no_queue", rate["queue"] / rate["no_queue"], 1.0, ">=",
                   facts)]


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/models", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


CASES = {
    "saturation": lambda quick: engine_saturation(SIMULATED, quick),
    "remote_saturation": remote_saturation,
    "saturation_vllm": vllm_saturation,
    "rendering": rendering,
    "memory": memory,
    "memory_pdf": memory_pdf,
    "pickup": pickup,
    "pickup_moved": pickup_moved,
    "burst": burst,
    "small_behind_large": small_behind_large,
}
