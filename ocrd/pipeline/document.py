"""One document through the pipeline: probe → render pages (ahead, bounded) → engine →
Markdown → results written atomically. Used by the daemon and by `ocrd convert`.

Memory stays flat with page count: at most `render.lookahead` rendered pages wait per
document, pages in the engine are bounded by the shared slots, and figure crops go to a
staging folder as they appear instead of piling up in memory.

The converter also tells the scheduler whether the engine has room: pages in it plus
pages on their way (rendering, or rendered and waiting for a slot) below the slots.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from ocrd import __version__, names, safefs
from ocrd.config.settings import Config
from ocrd.engines.base import Engine
from ocrd.outputs import destinations, records
from ocrd.outputs.assets import Staging
from ocrd.outputs.writers import Document, Settings, Writer, writers_for
from ocrd.pipeline import budget
from ocrd.pipeline.pages import DocumentPages, EngineGate, EngineTraffic
from ocrd.pipeline.schedule import FairSlots
from ocrd.pipeline.source import DocProgress, Source
from ocrd.render import pages, resolution
from ocrd.render.pool import DocumentWorkers, RenderPool

log = structlog.get_logger("ocrd.pipeline.document")


@dataclass
class Written:
    """What a finished conversion wrote (names in the output folder)."""

    folder: Path
    markdown: str
    sidecar: str
    assets: str | None
    meta: dict[str, Any]


class Clock:
    """When something started: the wall clock's time for timestamps, the monotonic
    clock's for its duration (a wall clock stepped back by NTP must not give negative
    seconds)."""

    def __init__(self) -> None:
        self.wall = time.time()
        self.mono = time.monotonic()

    def seconds(self) -> float:
        return time.monotonic() - self.mono


def sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def pages_in_flight(cfg: Config, engine: Engine) -> int:
    """The page slots: schedule.pages_in_flight, else what the engine usefully takes."""
    return cfg.schedule.pages_in_flight or max(2, engine.max_concurrency)


class Converter:
    """Documents into Markdown (and the outputs asked for) through one engine; the daemon
    (service/wiring.py) and `ocrd convert` (cli.py) build it alike."""

    def __init__(self, cfg: Config, engine: Engine, pool: RenderPool,
                 slots: FairSlots | None = None,
                 reservations: destinations.Reservations | None = None,
                 metrics: Any = None, liveness: EngineTraffic | None = None) -> None:
        """`slots`: the page slots (default: pages_in_flight of them)."""
        self.cfg = cfg
        self.liveness = liveness
        self.engine = engine
        self.pool = pool
        self.slots = slots if slots is not None else FairSlots(pages_in_flight(cfg, engine))
        self.reservations = reservations or destinations.Reservations()
        self.metrics = metrics
        self.gate = EngineGate(engine)
        self.resolution = resolution.choose(cfg.render, engine)
        # page images in flight, all documents together (ocrd/pipeline/budget.py)
        self.memory = budget.MemoryBudget(budget.AUTO_FLOOR)
        self.set_memory(cfg.limits.memory_bytes)
        # Pages on their way to the engine (rendering or waiting for a slot), plus one
        # for each document still preparing (hash, folders) that will render soon.
        self.pending = 0
        # Called when a page moves on or a document finishes (the scheduler's poke).
        self.on_progress: Callable[[], None] | None = None
        # documents converting now (the console's "page k of n")
        self.documents: dict[int, DocProgress] = {}

    def set_memory(self, memory_bytes: int | None) -> None:
        """The memory budget (`limits.memory_bytes`, None: sized to the page slots), also
        when reloaded: for pages rendered from now on."""
        a4 = self.resolution.cost("L" if self.resolution.grey else "RGB",
                                  self.resolution.a4_pixels())
        total, per_page = budget.sizes(memory_bytes, self.slots.n, a4)
        self.memory.resize(total)
        self.resolution = replace(self.resolution, page_budget=per_page)

    def has_room(self) -> bool:
        """The engine could take more pages than are in it and on their way."""
        return self.slots.used + self.pending < self.slots.n

    def progressed(self) -> None:
        """A page moved on or a document finished: tell the scheduler."""
        if self.on_progress is not None:
            self.on_progress()

    async def probe(self, path: str, workers: DocumentWorkers) -> pages.DocInfo:
        lim = self.cfg.limits
        # a file being converted is finished: a PDF cut off is repaired if it can be
        return await workers.call(pages.probe, path, self.resolution.dpi,
                                  lim.max_pages, lim.max_file_bytes, lim.max_pixels, True)

    async def convert(self, src: Source, out_dir: safefs.Dir, perms: destinations.Perms) -> Written:
        """Convert one document and write NAME.md, NAME.json (and NAME.assets/) into
        out_dir. Raises OcrdError subclasses for the file's own problems, EngineDead when
        the engine is gone, OSError when the destination cannot be written."""
        # This file's own render workers: nothing of another file's reaches them. (Entering
        # does not suspend: _convert counts the file as pending before the first await.)
        async with self.pool.document() as workers:
            return await self._convert(src, out_dir, perms, workers)

    async def _convert(self, src: Source, out_dir: safefs.Dir, perms: destinations.Perms,
                       workers: DocumentWorkers) -> Written:
        t0 = Clock()
        blog = log.bind(file=src.name)
        self.pending += 1  # counted before the first await: see Scheduler.run
        try:
            info = src.info or await self.probe(src.path, workers)
            src.info = info
            if src.sha256 is None:
                src.sha256 = await asyncio.to_thread(sha256_fd, src.fd)
            if src.turns is None and src.turns_for is not None:
                src.turns = src.turns_for(src.sha256)
        finally:
            self.pending -= 1
            self.progressed()
        stem = src.stem or destinations.split_ext(PurePosixPath(src.name).name)[0]
        outputs = writers_for(src.outputs, src.output_settings or Settings(), info.pages,
                              self.engine.output_format)
        base = self.reservations.choose(out_dir, stem, src.sha256, src.name,
                                        src.same_path_replaces,
                                        tuple(w.suffix for w in outputs))
        staging = Staging(out_dir, base, perms)
        try:
            self.documents[id(src)] = DocProgress(src, info.pages, time.time())
            results = await DocumentPages(self, workers, src, info, staging, staging.final,
                                          blog, outputs).run()
            doc = Document(src.path, info.kind, src.name, info.pages, info)
            for writer in outputs:  # before the sidecar, which lists them, and the Markdown
                await writer.write(doc, out_dir, base, perms, workers, self.metrics, blog)
            meta = self._sidecar(src, info, results, base, staging, t0, outputs)
            text = assemble(results)
            await asyncio.to_thread(self._write, out_dir, base, text, meta, staging, perms)
        except BaseException:
            await asyncio.to_thread(staging.discard)
            for writer in outputs:
                await asyncio.to_thread(writer.discard, out_dir)
            raise
        finally:
            self.reservations.release(out_dir, base)
            self.documents.pop(id(src), None)
        blog.info("file_converted", pages=info.pages, seconds=round(t0.seconds(), 3),
                  output=str(out_dir.path / (base + ".md")), degraded=meta["degraded_pages"])
        return Written(out_dir.path, base + ".md", base + ".json",
                       staging.final if staging.used else None, meta)

    # -- results ----------------------------------------------------------------------

    def _sidecar(self, src: Source, info: pages.DocInfo, results: list[dict], base: str,
                 staging: Staging, t0: Clock,
                 outputs: list[Writer]) -> dict:
        page_meta = [records.page(r) for r in results]
        for writer in outputs:
            for i, page in enumerate(page_meta):
                page.update(writer.page_meta(i))
        degraded = [r["page"] for r in results if r["status"] == "degraded"]
        return {
            "schema_version": records.SIDECAR_SCHEMA_VERSION,
            "ocrd_version": __version__,
            "source": records.source(src.name, src.inbox, os.fstat(src.fd).st_size,
                                     src.sha256, info),
            "engine": self.engine.describe(),
            "prompt": src.prompt_mode if self.engine.follows_prompt else None,
            "page_count": info.pages,
            "status": "degraded" if degraded else "ok",
            "degraded_pages": degraded,
            "warnings": list(info.warnings),
            "repaired": info.repaired,
            "outputs": {
                "markdown": base + ".md",
                "assets": staging.final if staging.used else None,
                **{k: v for writer in outputs for k, v in writer.outputs().items()},
            },
            "timings": {
                "claimed_at": records.iso(src.claimed_at),
                "started_at": records.iso(t0.wall),
                "finished_at": records.iso(time.time()),
                "seconds": round(t0.seconds(), 4),
            },
            "pages": page_meta,
        }

    def _write(self, out_dir: safefs.Dir, base: str, text: str, meta: dict,
               staging: Staging, perms: destinations.Perms) -> None:
        # Order matters: assets, then the sidecar, then the Markdown last, so whoever
        # waits for NAME.md finds everything else in place. Both files are made before
        # either takes its name: an output that fails leaves neither. Replacing is right
        # here: Reservations.choose gave a name that is free or holds this document's
        # results.
        files = [(base + ".json", names.json_bytes(meta)),
                 (base + ".md", text.encode("utf-8"))]
        staging.commit()
        destinations.write_atomic_all(out_dir, files, perms)
        out_dir.fsync()


PAGE_MARK = "<!-- page {n}{note} -->"


def assemble(results: list[dict]) -> str:
    """The document's Markdown: every page, in order, each opened by an HTML comment
    (`<!-- page 3 -->`, or `<!-- page 3 (blank) -->` / `(degraded: length)`), invisible
    when rendered and easy to split on."""
    parts = []
    for r in results:
        note = ""
        if r["status"] == "blank":
            note = " (blank)"
        elif r["status"] == "degraded":
            note = f" (degraded: {r['degraded']})"
        parts.append(PAGE_MARK.format(n=r["page"], note=note))
        body = r["markdown"].strip()
        if body:
            parts.append(body)
    return "\n\n".join(parts) + "\n"
