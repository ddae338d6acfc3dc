"""What every console request needs, built once when the console starts; and the one kind
of number a console URL holds (`{id:int}`, `{page:int}`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.convertors import Convertor, register_url_convertor

from ocrd.config.settings import Config
from ocrd.live import Live
from ocrd.names import MAX_DIGITS
from ocrd.web.store import Store


class _Number(Convertor[int]):
    """A journal row's id or a page number in a URL: ASCII digits, at most
    names.MAX_DIGITS of them. A longer run matches no route (404) instead of reaching
    int()'s limit on digits (Starlette's `int` convertor takes any number of them); a
    number past what the journal holds names no row, as any unknown one."""

    regex = f"[0-9]{{1,{MAX_DIGITS}}}"

    def convert(self, value: str) -> int:
        return int(value)

    def to_string(self, value: int) -> str:
        return str(int(value))


register_url_convertor("id", _Number())


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
