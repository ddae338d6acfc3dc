"""The daemon's parts, built as the daemon builds them (`Parts.build`) but without a
daemon around them: wired to each other, sized from the configuration, and given a
reloaded configuration in the one place settings reach them (`Parts.apply`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from simulated_engines import SIMULATED

from ocrd import errors
from ocrd.config.load import parse_config
from ocrd.config.roots import Roots
from ocrd.config.settings import Config
from ocrd.engines import create_engine
from ocrd.render.pool import RenderPool
from ocrd.service.metrics import Metrics
from ocrd.service.systemd import Liveness
from ocrd.service.wiring import Parts
from ocrd.work.state import StateFolder


def config(tmp_path: Path, **schedule: object) -> Config:
    for name in ("inbox", "outbox", "failed"):
        (tmp_path / name).mkdir(exist_ok=True)
    return parse_config({
        "state_dir": str(tmp_path / "state"),
        "engine": {"kind": SIMULATED, "options": {"max_batch": 6}},
        "schedule": schedule,
        "inboxes": [{"path": str(tmp_path / "inbox"), "outbox": str(tmp_path / "outbox"),
                     "failed": str(tmp_path / "failed")}],
    }, tmp_path)


def test_the_parts_are_built_wired_and_given_a_reload(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    dead: list[errors.EngineDead] = []

    async def run() -> None:
        engine = create_engine(cfg.engine)
        await engine.start()
        pools = (RenderPool(1), RenderPool(1))
        state = StateFolder.open(cfg.state_dir)
        roots = Roots()
        try:
            parts = Parts.build(cfg, state, engine, pools, metrics=Metrics(),
                                liveness=Liveness(cfg.schedule.page_timeout_seconds),
                                roots=roots, engine_dead=dead.append)
            # pages in flight: the engine's own concurrency when the config leaves it out
            assert parts.slots.n == engine.max_concurrency == 8
            assert parts.converter.on_progress == parts.scheduler.poke
            assert parts.converter.slots is parts.slots
            assert parts.jobs.converter is parts.converter
            assert parts.scheduler.room_limit == cfg.schedule.max_active_documents + 8
            assert parts.converter.cfg is parts.jobs.cfg is parts.intake.cfg is cfg

            reloaded = config(tmp_path, pages_in_flight=3, max_active_documents=2)
            parts.apply(reloaded)
            assert parts.converter.cfg is parts.jobs.cfg is parts.intake.cfg is reloaded
            assert parts.slots.n == 3
            assert parts.scheduler.max_active == 2
            assert parts.scheduler.room_limit == 2 + 3
            assert "0 page(s) in flight" in parts.status_line(0.0)
        finally:
            for pool in pools:
                await pool.close()
            state.journal.close()
            roots.close()
            await engine.close()

    asyncio.run(run())
    assert dead == []
