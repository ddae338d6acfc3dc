"""The state folder: this daemon's instance id (naming its work area in every inbox) and
its journal — set aside and started anew when damaged, so that a damaged journal costs a
rebuild from the work areas (work/recovery.py), never a daemon that cannot start.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import structlog

from ocrd import safefs
from ocrd.outputs import destinations
from ocrd.work.journal import Journal, JournalCorrupt, JournalUnwritable

log = structlog.get_logger("ocrd.work.state")

JOURNAL_NAME = "journal.sqlite3"


class StateError(Exception):
    """The state folder cannot be used at all: one line for the admin."""


@dataclass
class StateFolder:
    """The open state folder (`state_dir`): this daemon's instance id and journal."""

    path: Path
    instance: str
    journal: Journal
    fresh: bool  # the journal is new (first start, lost or damaged): adopt work areas

    @classmethod
    def open(cls, folder: Path) -> StateFolder:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            existed = (folder / JOURNAL_NAME).exists()
            instance = _instance_id(folder)
            journal, aside = Journal.open_or_set_aside(folder / JOURNAL_NAME)
        except (OSError, JournalUnwritable, JournalCorrupt) as e:
            raise StateError(
                f"the state folder {str(folder)!r} cannot be used: "
                f"{getattr(e, 'strerror', None) or e} (it must be writable by ocrd; "
                "state_dir in the config, StateDirectory= in the unit)") from None
        if aside is not None:
            log.error("journal_corrupt", set_aside=aside, folder=str(folder),
                      hint="the journal was damaged; a new one was started and the files "
                      "in the work areas are taken up again")
        return cls(folder, instance, journal, fresh=aside is not None or not existed)


def _instance_id(folder: Path) -> str:
    path = folder / "instance-id"
    try:
        ident = path.read_text().strip()
    except FileNotFoundError:
        ident = ""
    if len(ident) == 32 and all(c in "0123456789abcdef" for c in ident):
        return ident
    ident = uuid.uuid4().hex
    with safefs.Dir.open_root(folder) as d:
        destinations.write_atomic(d, "instance-id", (ident + "\n").encode(),
                                  destinations.Perms(0o644))
    return ident
