"""The HTTP client that the remote engine (and the managed local server) talk through.

aiohttp, not a client of ocrd's own: it does HTTP/1.1 framing, TLS and proxies (CONNECT
for https, NO_PROXY) the way other tools on the machine do, and vLLM itself depends on
it, so it is there wherever vLLM is. It is asyncio-native: cancelling a request closes
its connection, and vLLM aborts a request whose client hung up. httpx would do the same
things at several times the CPU per request; aiohttp costs no more than a minimal
hand-written client.
Proxies come from `HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY` (either case), with urllib's
rules, as `systemd/ocrd.default` documents. An answer is read up to a limit the caller
gives, never further: whatever a server sends, memory stays bounded.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import aiohttp

from ocrd import __version__
from ocrd.config.engine import RemoteConfig
from ocrd.config.settings import ConfigError

# A server that does not accept a connection within this time counts as down.
CONNECT_TIMEOUT_SECONDS = 5.0
# Idle connections are dropped before the server would (uvicorn, under `vllm serve`,
# closes them after 5 s): a reused connection that the server has just closed would count
# as a failed request.
KEEPALIVE_SECONDS = 2.0
# The most bytes of an answer read when the caller names no limit (/models, /health).
SMALL_ANSWER_BYTES = 1 << 20
# Bytes read from the socket at a time.
READ_CHUNK_BYTES = 1 << 16
# An error answer longer than this is shown by its start, not read as JSON.
ERROR_JSON_BYTES = 1 << 16


class ServerTrouble(Exception):
    """The server, not the page: no usable answer came back."""


class ServerUnreachable(ServerTrouble):
    """No HTTP answer from a server: refused, reset, closed mid-answer, TLS or proxy."""


class BadAnswer(ServerTrouble):
    """An HTTP answer that is not what the API promises: larger than the limit, or not
    the JSON of a chat completion."""


def tls_context(cfg: RemoteConfig) -> ssl.SSLContext:
    """The TLS settings for https servers: the system's CA store, or only
    `engine.remote.tls_ca_file` when it is set, and the client certificate when one is set.
    ConfigError when a file is missing or not what it should be."""
    try:
        ctx = ssl.create_default_context(
            cafile=str(cfg.tls_ca_file) if cfg.tls_ca_file is not None else None)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"engine.remote.tls_ca_file = {str(cfg.tls_ca_file)!r}: "
                          f"{_file_problem(e, 'no CA certificate (PEM) in it')}") from None
    if cfg.tls_cert_file is not None:
        key = str(cfg.tls_key_file) if cfg.tls_key_file is not None else None
        try:
            # an encrypted key would make OpenSSL ask for its password on the terminal
            ctx.load_cert_chain(str(cfg.tls_cert_file), key, password=lambda: b"")
        except (OSError, ssl.SSLError) as e:
            files = f"engine.remote.tls_cert_file = {str(cfg.tls_cert_file)!r}" + (
                f", engine.remote.tls_key_file = {key!r}" if key else "")
            problem = _file_problem(e, "not a PEM certificate and its matching private key "
                                       "(unencrypted)")
            raise ConfigError(f"{files}: {problem}") from None
    return ctx


def _file_problem(e: OSError | ssl.SSLError, bad_content: str) -> str:
    if isinstance(e, ssl.SSLError) or not e.strerror:
        return bad_content
    return f"cannot be read ({e.strerror})"


@dataclass
class Answer:
    """A server's whole answer to one request."""

    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))

    def error_text(self) -> str:
        """vLLM's error message when there is one, else the start of the body."""
        if len(self.body) > ERROR_JSON_BYTES:  # not an error message: not parsed
            return self.body[:300].decode("utf-8", "replace")
        try:
            data = self.json()
            err = data.get("error", data) if isinstance(data, dict) else data
            msg = err.get("message") if isinstance(err, dict) else None
            return str(msg or data)[:300]
        except (ValueError, UnicodeDecodeError, AttributeError):
            return self.body[:300].decode("utf-8", "replace")


Route = tuple[str | None, str | None]  # the proxy's URL (None: direct), its credentials


def proxy_route(url: str, proxies: dict[str, str]) -> Route:
    """The proxy for `url` under urllib's rules (`proxies` as from
    urllib.request.getproxies_environment()); user:password in the proxy's URL becomes
    the value of a Proxy-Authorization header."""
    parts = urllib.parse.urlsplit(url)
    proxy = proxies.get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass_environment(parts.hostname or "", proxies):
        return None, None
    if "://" not in proxy:
        proxy = "http://" + proxy
    p = urllib.parse.urlsplit(proxy)
    if p.username is None:
        return proxy, None
    user = f"{urllib.parse.unquote(p.username)}:{urllib.parse.unquote(p.password or '')}"
    bare = p._replace(netloc=p.netloc.rpartition("@")[2]).geturl()
    return bare, "Basic " + base64.b64encode(user.encode("utf-8")).decode("ascii")


class Client:
    """Requests to cfg's servers over kept-alive connections. With `use_proxy`, through
    the proxies that HTTPS_PROXY/HTTP_PROXY/NO_PROXY name (read once, here); without,
    directly (a server on this machine). The aiohttp session is made on first use, in the
    event loop that uses it. (aiohttp's own trust_env would also read ~/.netrc and the
    environment again, in a thread, for every request.)"""

    def __init__(self, cfg: RemoteConfig, *, use_proxy: bool = True) -> None:
        self.tls = tls_context(cfg)  # a bad file is a ConfigError now, not at the first page
        self._proxies = urllib.request.getproxies_environment() if use_proxy else {}
        self._routes: dict[str, Route] = {}  # per scheme://host:port
        self._session: aiohttp.ClientSession | None = None
        self.closed = False

    def route(self, url: str) -> Route:
        """Through which proxy `url` goes (worked out once per server)."""
        key = "/".join(url.split("/", 3)[:3])  # scheme://host:port
        if key not in self._routes:
            self._routes[key] = proxy_route(url, self._proxies)
        return self._routes[key]

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # ocrd limits pages in flight per server itself: no limit in the pool
                connector=aiohttp.TCPConnector(limit=0, ssl=self.tls,
                                               keepalive_timeout=KEEPALIVE_SECONDS),
                # requests end by ocrd's own deadline (send()); only connecting has its own
                timeout=aiohttp.ClientTimeout(total=None,
                                              sock_connect=CONNECT_TIMEOUT_SECONDS),
                headers={"User-Agent": f"ocrd/{__version__}", "Accept": "application/json",
                         "Accept-Encoding": "identity"},
                # bytes as they come: a compressed answer could unpack to any size in
                # one step (vLLM does not compress; a body that is, is not JSON here)
                auto_decompress=False,
                trust_env=False)
        return self._session

    async def send(self, method: str, url: str, *, body: bytes | None = None,
                   headers: dict[str, str] | None = None, timeout: float,
                   max_bytes: int = SMALL_ANSWER_BYTES) -> Answer:
        """One request and its whole answer within `timeout` seconds.

        Raises ServerUnreachable when there is no complete answer, BadAnswer when the
        answer's body is longer than `max_bytes` (the connection is closed as soon as it
        is) and TimeoutError when it takes longer. Cancelled (or timed out), the
        request's connection is closed, not returned to the pool: the server sees the
        client hang up.
        """
        if self.closed:
            raise ServerUnreachable("the client is closed")
        proxy, credentials = self.route(url)
        proxy_headers = None
        if credentials is not None:
            if url.startswith("https:"):  # for the CONNECT, never into the tunnel
                proxy_headers = {"Proxy-Authorization": credentials}
            else:  # http: the request itself goes to the proxy
                headers = {**(headers or {}), "Proxy-Authorization": credentials}
        try:
            async with asyncio.timeout(timeout):
                async with self._open().request(
                        method, url, data=body, headers=headers, allow_redirects=False,
                        proxy=proxy, proxy_headers=proxy_headers) as resp:
                    return Answer(resp.status, await read_body(resp, max_bytes))
        except aiohttp.ClientError as e:  # before TimeoutError: a connect timeout is one
            raise ServerUnreachable(describe_error(e)) from e

    async def close(self) -> None:
        self.closed = True
        if self._session is not None:
            await self._session.close()


async def read_body(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The answer's body, in chunks, up to `max_bytes`; BadAnswer past that (a declared
    length is believed at once)."""
    if resp.content_length is not None and resp.content_length > max_bytes:
        resp.close()
        raise BadAnswer(f"answer of {resp.content_length} bytes, more than the "
                        f"{max_bytes} allowed")
    body = bytearray()
    async for chunk in resp.content.iter_chunked(READ_CHUNK_BYTES):
        body += chunk
        if len(body) > max_bytes:
            resp.close()  # not back to the pool: the rest of it is never read
            raise BadAnswer(f"answer longer than the {max_bytes} bytes allowed")
    return bytes(body)


def describe_error(e: aiohttp.ClientError) -> str:
    """A short reason for a failed exchange, for logs and EngineUnavailable messages."""
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        cert = e.certificate_error
        why = getattr(cert, "verify_message", None) or str(cert)
        return f"TLS: server certificate not trusted ({why}); see engine.remote.tls_ca_file"
    if isinstance(e, aiohttp.ClientHttpProxyError):
        return f"proxy: answered HTTP {e.status} {e.message}"
    if isinstance(e, aiohttp.ClientProxyConnectionError):
        return f"proxy: cannot connect ({_os_reason(e.os_error)})"
    if isinstance(e, aiohttp.ClientConnectorSSLError):
        return f"TLS: {e.os_error}"
    if isinstance(e, aiohttp.ConnectionTimeoutError):
        return "cannot connect: timed out"
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"cannot connect: {_os_reason(e.os_error)}"
    if isinstance(e, aiohttp.ClientOSError) and isinstance(e.__cause__, ssl.SSLError):
        return f"TLS: {e.__cause__.reason or e.__cause__}"
    return f"no complete answer: {e or type(e).__name__}"


def _os_reason(e: OSError) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    return e.strerror or str(e) or type(e).__name__
