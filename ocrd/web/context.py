"""What every console request needs, built once when the console starts."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ocrd.config.settings import Config
from ocrd.live import Live
from ocrd.web.store import Store


@dataclass
class Context:
    cfg: Config
    store: Store
    live: Callable[[], Live | None]  # the daemon's state now (LiveStatus.get)
    token: str | None  # required when set
    secret: bytes  # CSRF key
    # one retry at a time: two clicks on the same file must not both move it
    retry_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def token_required(self) -> bool:
        return self.token is not None
