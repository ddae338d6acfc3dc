"""The HTTP client that the remote engine (and the managed local server) talk through.

httpx, not a client of ocrd's own: it does HTTP/1.1 framing, TLS and proxies (CONNECT
for https, NO_PROXY) the way every other tool on the machine does, and httpx is already
installed wherever vLLM is (the `openai` package vLLM depends on is built on it). It is
asyncio-native, so cancelling a request closes its connection, and vLLM aborts a request
whose client hung up. aiohttp would do as well; httpx's proxy rules from the environment
(`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`) are urllib's and curl's, which
is what `systemd/ocrd.default` documents.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import httpx

from ocrd import __version__
from ocrd.config import ConfigError, EngineConfig

# A server that does not accept a connection within this time counts as down.
CONNECT_TIMEOUT_SECONDS = 5.0
# Idle connections are dropped before the server would (uvicorn, under `vllm serve`,
# closes them after 5 s): a reused connection that the server has just closed would count
# as a failed request.
KEEPALIVE_SECONDS = 2.0


class ServerUnreachable(Exception):
    """No HTTP answer from a server: refused, reset, closed mid-answer, TLS or proxy."""


def tls_context(cfg: EngineConfig) -> ssl.SSLContext:
    """The TLS settings for https servers: the system's CA store, or only
    `engine.tls_ca_file` when it is set, and the client certificate when one is set.
    ConfigError when a file is missing or not what it should be."""
    try:
        ctx = ssl.create_default_context(
            cafile=str(cfg.tls_ca_file) if cfg.tls_ca_file is not None else None)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"engine.tls_ca_file = {str(cfg.tls_ca_file)!r}: "
                          f"{_file_problem(e, 'no CA certificate (PEM) in it')}") from None
    if cfg.tls_cert_file is not None:
        key = str(cfg.tls_key_file) if cfg.tls_key_file is not None else None
        try:
            ctx.load_cert_chain(str(cfg.tls_cert_file), key)
        except (OSError, ssl.SSLError) as e:
            files = f"engine.tls_cert_file = {str(cfg.tls_cert_file)!r}" + (
                f", engine.tls_key_file = {key!r}" if key else "")
            problem = _file_problem(e, "not a PEM certificate and its matching private key")
            raise ConfigError(f"{files}: {problem}") from None
    return ctx


def _file_problem(e: OSError | ssl.SSLError, bad_content: str) -> str:
    if isinstance(e, ssl.SSLError) or not e.strerror:
        return bad_content
    return f"cannot be read ({e.strerror})"


def make_client(cfg: EngineConfig, *, connections: int, use_proxy: bool = True
                ) -> httpx.AsyncClient:
    """A client for cfg's servers. With `use_proxy` it takes the proxy settings from the
    environment; without, it connects directly (a server on this machine)."""
    return httpx.AsyncClient(
        verify=tls_context(cfg),
        trust_env=use_proxy,
        # requests end by ocrd's own deadline (send()); only connecting has its own
        timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_SECONDS),
        # ocrd limits pages in flight per server itself; the pool must never queue them
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=connections,
                            keepalive_expiry=KEEPALIVE_SECONDS),
        headers={"User-Agent": f"ocrd/{__version__}", "Accept": "application/json"},
        follow_redirects=False,
    )


async def send(client: httpx.AsyncClient, method: str, url: str, *,
               body: bytes | None = None, headers: dict[str, str] | None = None,
               timeout: float) -> httpx.Response:
    """One request and its whole answer within `timeout` seconds.

    Raises ServerUnreachable when there is no complete answer and TimeoutError when it
    takes longer. Cancelled (or timed out), the request's connection is closed, not
    returned to the pool: the server sees the client hang up.
    """
    try:
        async with asyncio.timeout(timeout):
            return await client.request(method, url, content=body, headers=headers)
    except httpx.TransportError as e:
        raise ServerUnreachable(describe_error(e)) from e


def describe_error(e: httpx.TransportError) -> str:
    """A short reason for a failed exchange, for logs and EngineUnavailable messages."""
    cause: BaseException | None = e
    while cause is not None:  # the OSError / SSLError underneath httpx's error
        if isinstance(cause, ConnectionRefusedError):
            return "cannot connect: connection refused"
        if isinstance(cause, ssl.SSLCertVerificationError):
            return (f"TLS: server certificate not trusted ({cause.verify_message}); "
                    "see engine.tls_ca_file")
        if isinstance(cause, ssl.SSLError):
            return f"TLS: {cause.reason or cause}"
        cause = cause.__cause__ or cause.__context__
    what = str(e) or type(e).__name__
    if isinstance(e, httpx.ProxyError):
        return f"proxy: {what}"
    if isinstance(e, httpx.TimeoutException):
        return "cannot connect: timed out"
    if isinstance(e, httpx.ConnectError):
        return f"cannot connect: {what}"
    return f"no complete answer: {what}"


def answer_json(resp: httpx.Response) -> Any:
    return json.loads(resp.content.decode("utf-8"))


def error_text(resp: httpx.Response) -> str:
    """vLLM's error message when there is one, else the start of the body."""
    try:
        data = answer_json(resp)
        err = data.get("error", data) if isinstance(data, dict) else data
        msg = err.get("message") if isinstance(err, dict) else None
        return str(msg or data)[:300]
    except (ValueError, UnicodeDecodeError, AttributeError):
        return resp.content[:300].decode("utf-8", "replace")
