"""Conditions that last (no descriptor to spare, a folder that cannot be scanned, a
configured folder swapped): one log line when a condition begins, one when it ends, and
in between at most one line every `every` seconds saying how often it was met — never a
line per occurrence, which under a flood would fill the journal and cost the daemon its
own time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

REMIND_SECONDS = 300.0


@dataclass
class _Open:
    since: float
    last_logged: float
    count: int = 1
    unlogged: int = 0


class Conditions:
    """The open conditions of one part of the daemon, each under a key of its own.
    Thread-safe: the console's thread reports through it too."""

    def __init__(self, log: Any, every: float = REMIND_SECONDS,
                 clock: Any = time.monotonic) -> None:
        self.log = log
        self.every = every
        self.clock = clock
        self._open: dict[Hashable, _Open] = {}
        self._lock = threading.Lock()

    def met(self, key: Hashable, event: str, level: str = "warning", **fields: Any) -> bool:
        """The condition `key` holds now. Logs `event` when it begins (True), and again
        at most every `every` seconds with `repeated`: the occurrences not logged."""
        now = self.clock()
        with self._lock:
            cond = self._open.get(key)
            if cond is None:
                self._open[key] = _Open(now, now)
                repeated = None
            else:
                cond.count += 1
                cond.unlogged += 1
                if now - cond.last_logged < self.every:
                    return False
                repeated, cond.unlogged, cond.last_logged = cond.unlogged, 0, now
        if repeated is None:
            getattr(self.log, level)(event, **fields)
        else:
            getattr(self.log, level)(event, repeated=repeated, still=True, **fields)
        return repeated is None

    def cleared(self, key: Hashable, event: str | None = None, **fields: Any) -> bool:
        """The condition `key` no longer holds: logs `event` (with how long it lasted and
        how often it was met) if it was open. True when it was."""
        with self._lock:
            cond = self._open.pop(key, None)
        if cond is None:
            return False
        if event is not None:
            self.log.info(event, seconds=round(self.clock() - cond.since, 1),
                          occurrences=cond.count, **fields)
        return True

    def open_keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._open)
