"""Listen addresses (`metrics.listen`): what counts as one, and whether this host can
bind it — checked when the config is read, and again by check-config, so that a daemon
never starts with health endpoints nobody can reach."""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import NamedTuple

from ocrd.names import number

EXAMPLES = "e.g. 127.0.0.1:9464, [::1]:9464, 0.0.0.0:9464 or localhost:9464"


class Address(NamedTuple):
    host: str  # an IP address literal, without brackets
    port: int
    family: socket.AddressFamily

    def __str__(self) -> str:
        host = f"[{self.host}]" if self.family == socket.AF_INET6 else self.host
        return f"{host}:{self.port}"


def parse(text: str) -> Address:
    """`HOST:PORT` with HOST an IPv4 address, an IPv6 address in brackets, or
    `localhost`. Raises ValueError with a sentence that says what is wrong."""
    host, sep, digits = text.rpartition(":")
    port = number(digits)
    if not sep or port is None or not 0 <= port <= 65535:
        raise ValueError(f"must be HOST:PORT with a port from 0 to 65535 ({EXAMPLES}), "
                         f"got {text!r}")
    bracketed = host.startswith("[") and host.endswith("]")
    bare = host[1:-1] if bracketed else host
    if bare == "localhost":
        return Address("127.0.0.1", port, socket.AF_INET)
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        raise ValueError(f"{host!r} is not an IP address ({EXAMPLES})") from None
    if ip.version == 6 and not bracketed:
        raise ValueError(f"an IPv6 address needs brackets: [{bare}]:{port}")
    if ip.version == 4 and bracketed:
        raise ValueError(f"brackets are for IPv6 addresses: {bare}:{port}")
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return Address(str(ip), port, family)


def bind_problem(addr: Address) -> str | None:
    """Why this host cannot listen on `addr` (address not on this host, no IPv6, a port
    below 1024 without the right), or None. A port already in use is not a problem here:
    check-config is often run while the daemon holds it."""
    try:
        with socket.socket(addr.family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr.host, addr.port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return None
        return f"cannot listen on {addr}: {e.strerror}"
    return None
