"""The parts that work while the daemon runs, made once, in one place (`Parts.build`),
wired to each other there, and given a reloaded configuration in one place (`apply`).
service/daemon.py owns their life; each part lives in its own module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ocrd import errors
from ocrd.config.roots import Roots
from ocrd.config.settings import Config
from ocrd.engines.base import Engine
from ocrd.intake.claims import Claims
from ocrd.intake.inboxes import Inboxes
from ocrd.intake.loop import Intake
from ocrd.outputs import destinations
from ocrd.pipeline.document import Converter
from ocrd.pipeline.jobs import Jobs
from ocrd.pipeline.schedule import FairSlots, Scheduler
from ocrd.render.pool import RenderPool
from ocrd.service.systemd import Liveness
from ocrd.work.item import Item
from ocrd.work.outcomes import Outcomes
from ocrd.work.state import StateFolder


@dataclass
class Parts:
    """Everything that works while the daemon runs, made once, in one place."""

    state_folder: StateFolder
    engine: Engine
    slots: FairSlots
    converter: Converter
    scheduler: Scheduler
    outcomes: Outcomes
    jobs: Jobs
    inboxes: Inboxes
    intake: Intake

    @classmethod
    def build(cls, cfg: Config, state_folder: StateFolder, engine: Engine,
              pools: tuple[RenderPool, RenderPool], *, metrics: Any, liveness: Liveness,
              roots: Roots, engine_dead: Callable[[errors.EngineDead], None]) -> Parts:
        """The parts, wired; `metrics`, `liveness`, `roots` and `engine_dead` are the
        daemon's (service/daemon.py), which owns their life."""
        # output names reserved on the share too, under this daemon's tag (outputs/destinations.py)
        reservations = destinations.Reservations(state_folder.instance[:8])
        converter = Converter(cfg, engine, pools[0], reservations=reservations,
                              metrics=metrics, liveness=liveness)
        slots = converter.slots
        in_flight = slots.n
        parts: Parts

        def submit(item: Item) -> None:  # late-bound: the scheduler needs the jobs first
            parts.submit(item)

        outcomes = Outcomes(state_folder.journal, metrics, resubmit=submit)
        jobs = Jobs(cfg, state_folder.journal, converter, outcomes, engine_dead=engine_dead)
        # Beyond max_active_documents, documents start while the engine has room (see
        # pipeline/schedule.py), at most one per page slot more.
        scheduler = Scheduler(jobs.run, cfg.schedule.max_active_documents,
                              cfg.schedule.batch_window_seconds, room=converter.has_room,
                              room_limit=cfg.schedule.max_active_documents + in_flight)
        converter.on_progress = scheduler.poke
        inboxes = Inboxes(state_folder.instance, is_kept=outcomes.is_kept, roots=roots,
                          kept_among=outcomes.kept_among)
        intake = Intake(cfg, inboxes, Claims(state_folder.journal, metrics), pools[1],
                        submit, converter.gate.open, metrics,
                        liveness.loop_turned)
        parts = cls(state_folder, engine, slots, converter, scheduler, outcomes, jobs, inboxes,
                    intake)
        return parts

    def submit(self, item: Item, exclusive: bool = False) -> None:
        """Queue a claimed file (exclusive: converted alone, a crash suspect)."""
        self.scheduler.submit(item, item.info.pixels if item.info else 0, exclusive)
        item.order = self.scheduler.order_of(item)

    def apply(self, cfg: Config) -> None:
        """A reloaded configuration (its engine and render settings kept: those need a
        restart). The one place where settings reach the running parts."""
        self.converter.cfg = self.jobs.cfg = self.intake.cfg = cfg
        in_flight = cfg.schedule.pages_in_flight or self.slots.n
        self.slots.resize(in_flight)
        self.converter.set_memory(cfg.limits.memory_bytes)  # sized to the slots
        self.scheduler.max_active = cfg.schedule.max_active_documents
        self.scheduler.room_limit = cfg.schedule.max_active_documents + self.slots.n
        self.scheduler.poke()  # a larger max_active may let queued documents start now

    def status_line(self, rate: float) -> str:
        return (f"queue {self.scheduler.queued}, converting {len(self.scheduler.active)} "
                f"file(s), {self.slots.used} page(s) in flight, {rate:.2f} pages/s")
