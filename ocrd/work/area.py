"""The work area: where a daemon keeps what it has claimed, `.ocrd-work/<instance>/` in
each inbox (`<instance>/<job>/<relpath>`), who it belongs to, and what the ledger's
modules need of an inbox (`InboxView`: intake/inboxes.py's `Inbox` is one).

The ledger (journal, outcomes, recovery, retry, kept marks) sits below the intake that
finds and claims files: it reaches an inbox's folders only through this view."""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ocrd.outputs import destinations

if TYPE_CHECKING:
    from ocrd.config.roots import Roots
    from ocrd.config.settings import InboxConfig
    from ocrd.safefs import Dir

WORK_DIR_NAME = ".ocrd-work"
OWNER_FILE = ".owner"


class InboxView(Protocol):
    """What the ledger needs of an inbox: its settings and folders (each one the pinned
    one: config/roots.py), and the originals it has put back (on_success: keep)."""

    cfg: InboxConfig
    instance: str  # this daemon's work area in the inbox
    perms: destinations.Perms
    roots: Roots
    paused_until: float  # a destination failed: no new claims until then (monotonic)
    # originals put back after conversion: (relpath, size, mtime_ns)
    kept: set[tuple[str, int, int]]
    # (size, mtime_ns) of originals being put back right now, from a worker thread
    putting_back: list[tuple[int, int]]

    @property
    def path(self) -> Path: ...

    def open_root(self) -> Dir: ...

    def open_destination(self, path: Path) -> Dir: ...

    def open_work(self, create: bool = False) -> Dir: ...


class SeenFile(Protocol):
    """A file a scan saw in an inbox (intake/watch.py's `Entry` is one)."""

    relpath: str
    size: int
    mtime_ns: int


def host_id() -> str:
    """This machine: its machine-id where there is one, else its host name."""
    with contextlib.suppress(OSError):
        ident = Path("/etc/machine-id").read_text().strip()
        if ident:
            return ident
    return socket.gethostname()


def mark_owner(inbox: InboxView, state_dir: Path) -> None:
    """Say in the inbox's work area whose it is, so that a later instance on this host
    can adopt it if this one's state is lost (work/recovery.py)."""
    body = json.dumps({"host": host_id(), "state_dir": str(state_dir),
                       "instance": inbox.instance}).encode()
    with inbox.open_work(create=True) as work:
        destinations.write_atomic(work, OWNER_FILE, body,
                                  destinations.Perms(0o600, tag="owner"))
