"""A model on one or more `vllm serve` instances, through their OpenAI-compatible API: the
transport. What the model is asked and how its answer is read is its recipe
(recipe.py; DeepSeek-OCR-2's by default, `engine.recipe`); everything here works alike
for any recipe.

Pages go to the server with the fewest pages in flight, at most `concurrency_per_url` (the
server's batch) + `queue_per_url` (waiting in its queue) per server. Who a failed request
is held against — the server or the page — is decided in one place,
`RemoteEngine.sick_server_or_hard_page`: trouble of the server is retried with
exponential backoff on any server, and when none can take the page, `ocr()` raises
EngineUnavailable (the daemon re-queues the page and pauses intake) instead of failing
the page. A server whose request timed out and that cannot complete even a one-token page
(a canary) is sick: it gets no pages until a canary comes back. Answers are read up to a
limit and parsed in a thread. The requests go through aiohttp (ocrd/engines/http.py: TLS
settings, proxies from the environment); cancelling `ocr()` closes the request's
connection, which makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import struct
import time
import urllib.parse
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

import structlog
from PIL import Image

from ocrd.config.settings import ConfigError, EngineConfig
from ocrd.engines.base import Engine, PageRequest
from ocrd.engines.http import Answer, BadAnswer, Client, ServerTrouble, ServerUnreachable
from ocrd.engines.recipe import Recipe
from ocrd.engines.repetition import Attempt, convert_with_retries
from ocrd.engines.table import recipe_class
from ocrd.errors import EngineUnavailable
from ocrd.outputs.page import PageOutput

log = structlog.get_logger(__name__)

# health() and start() probes of /models
PROBE_TIMEOUT_SECONDS = 5.0
# Backoff after a failed request: per try of one request (0.5, 1, 2, ... s) and per
# server, for how long other requests avoid it (doubling per failure in a row, capped).
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 8.0
# Tries of one request before EngineUnavailable: this many plus one per extra server.
# With one server that is ~3.5 s of backoff (plus connect time), then the page goes back.
MIN_TRIES = 4
# Answers that say "this server, not this page": try again, elsewhere or later.
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# Answers that say the configuration is wrong (API key, model name, URL): every page would
# fail the same way, so they are not held against the page.
CONFIG_STATUS = frozenset({401, 403, 404})
# A chat completion's answer may be this many bytes, plus this many per token of
# engine.max_tokens: far above any page's text (a token is a few characters; JSON
# escapes take six bytes a character at most). A longer answer is the server's error.
ANSWER_BASE_BYTES = 64 * 1024
ANSWER_BYTES_PER_TOKEN = 256
# An answer up to this long is parsed at once (a fraction of a millisecond), a longer
# one in a thread.
INLINE_PARSE_BYTES = 64 * 1024
# A server whose request timed out is asked for a one-token page (the canary) within
# this long (or engine.remote.request_timeout_seconds, if shorter): the answer tells a sick
# server from a page that takes too long.
CANARY_TIMEOUT_SECONDS = 60.0
# A sick server is asked again after this long, doubling up to the maximum.
RECOVERY_FIRST_SECONDS = 1.0
RECOVERY_MAX_SECONDS = 30.0
# finish_reason as OpenAI-compatible servers write it ("stop", "length", ...).
_FINISH_REASON = re.compile(r"[a-z_]{1,32}")

# A recipe read that the page lies turned: the attempt's fact that asks for another read.
TURN_ASKED = "turn_asked"
_CLOCKWISE = {90: Image.Transpose.ROTATE_270, 180: Image.Transpose.ROTATE_180,
              270: Image.Transpose.ROTATE_90}

Blame = Literal["server", "page", "settings"]
T = TypeVar("T")


def _url_problem(url: str) -> str | None:
    """Why `url` is not a server's base URL (None: it is)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # ValueError when it is not a number from 0 to 65535
    except ValueError as e:
        return f"not a URL ({e})"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "has no host name (http://HOST:PORT/v1)"
    if port == 0:
        return "port 0 is not a server's port"
    if parts.query or parts.fragment:
        return "the base URL takes no ?query or #fragment"
    return None


class RemoteRequestError(RuntimeError):
    """This page's request failed for a reason of the page's own (see
    RemoteEngine.sick_server_or_hard_page)."""


class _Refused(Exception):
    """An HTTP answer other than 200."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(f"HTTP {answer.status}: {answer.error_text()}")
        self.status = answer.status


@dataclass(frozen=True)
class Completion:
    """What a chat completion's answer says, checked."""

    text: str
    finish_reason: str
    tokens: int | None
    prompt_tokens: int | None


def parse_completion(body: bytes) -> Completion:
    """An OpenAI chat completion's JSON; BadAnswer for anything else. The message's
    content may be a string, null (no text) or a list of parts (their text joined)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise BadAnswer(f"not JSON: {e}") from None
    try:
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content")
        reason = choice.get("finish_reason") or "stop"
        usage = data.get("usage") or {}
        counts = usage.get("completion_tokens"), usage.get("prompt_tokens")
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise BadAnswer(f"not a chat completion: {e!r}") from None
    if not isinstance(reason, str) or not _FINISH_REASON.fullmatch(reason):
        raise BadAnswer(f"not a chat completion: finish_reason {str(reason)[:40]!r}")
    return Completion(_content_text(content), reason, *map(_count, counts))


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        texts = [p.get("text") for p in content if p.get("type") == "text"]
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)
    raise BadAnswer(f"not a chat completion: message content {str(content)[:40]!r}")


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and \
        value >= 0 else None


def backoff(failures: int) -> float:
    """Seconds to wait after this many failures in a row: 0.5, 1, 2, ... up to the
    maximum, whatever the count."""
    return min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2.0 ** min(failures - 1, 32))


def image_data_url(image: Image.Image) -> str:
    """The page as a PNG data URL: lossless, so the server sees the pixels a local engine
    would."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode("ascii")


def png_bytes(image: Image.Image) -> bytes:
    """The image as an RGB PNG whose rows are left unfiltered, deflated at level 1.

    Pillow's PNG writer tries five filters on every row and keeps the best: on a page
    rendered at 144 dpi that search is most of its time, and the daemon pays it for
    every page it sends (hundreds in flight on a GPU host). Unfiltered rows deflate in
    about half the time to a PNG of about the same size; zlib lets
    go of the GIL meanwhile, so pages encode side by side in the daemon's threads."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    width, height = rgb.size
    stride = 3 * width
    pixels = memoryview(rgb.tobytes())
    rows = bytearray((stride + 1) * height)  # each row: filter type 0 (None), its pixels
    for y in range(height):
        start = y * (stride + 1) + 1
        rows[start:start + stride] = pixels[y * stride:(y + 1) * stride]
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header)
            + _png_chunk(b"IDAT", zlib.compress(rows, 1)) + _png_chunk(b"IEND", b""))


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(data, zlib.crc32(kind))
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


@dataclass
class _Server:
    """One `vllm serve` instance and what this engine knows about it."""

    url: str  # base URL, e.g. http://gpu1:8000/v1
    limit: int
    in_flight: int = 0
    failures: int = 0  # in a row
    down_until: float = 0.0  # time.monotonic(); avoided until then
    last_error: str | None = None
    pages: int = 0
    models: list[str] = field(default_factory=list)
    # why it is sick (a request timed out, and a canary did not come back): no pages
    # go to it until a canary does
    sick: str | None = None
    requests: set[asyncio.Task] = field(default_factory=set)  # in flight on it
    canary: asyncio.Future | None = None  # the canary in flight, shared
    recovery: asyncio.Task | None = None  # canaries while sick
    # not started yet (a managed server still loading): no pages until server_up()
    starting: bool = False

    def is_down(self, now: float) -> bool:
        return self.failures > 0 and now < self.down_until

    def failed(self, reason: str) -> None:
        self.failures += 1
        self.last_error = reason
        self.down_until = time.monotonic() + backoff(self.failures)

    def answered(self) -> None:
        self.failures = 0
        self.last_error = None


class RemoteEngine(Engine):
    """Pages sent to OpenAI-compatible `vllm serve` servers, asked as the recipe says."""

    kind = "remote"

    def __init__(self, cfg: EngineConfig, *, recipe: Recipe | None = None,
                 use_proxy: bool = True, send_priority: bool = False) -> None:
        """`recipe`: the model's (default: the one `engine.recipe` names).
        `use_proxy=False`: connect directly, whatever HTTP(S)_PROXY says (for a server on
        this machine). `send_priority`: each request carries its page's
        PageRequest.priority as vLLM's `priority` (servers started with
        `--scheduling-policy priority`, which refuse one otherwise)."""
        remote = cfg.remote
        if not remote.urls:
            raise ConfigError("engine.remote.urls is empty: the remote engine needs a "
                              "server URL")
        self.cfg = cfg
        self.remote = remote
        self.model = cfg.model
        self.recipe = recipe if recipe is not None else recipe_class(cfg.recipe)(cfg)
        self.output_format = self.recipe.output_format
        self.send_priority = send_priority
        per_server = remote.concurrency_per_url + remote.queue_per_url
        self.servers = [_Server(u.rstrip("/"), per_server) for u in remote.urls]
        self.max_concurrency = per_server * len(self.servers)
        # set whenever a slot frees up; waiters re-check (asyncio: no lost wake-ups
        # between the check and the wait, as nothing awaits in between)
        self._slot_freed = asyncio.Event()
        self._turn = 0  # rotates the choice among equally busy servers
        self._closing = False
        self._client = Client(remote, use_proxy=use_proxy)
        self._requests: set[asyncio.Task] = set()  # in flight, for close() to cut
        self.answer_limit = ANSWER_BASE_BYTES + cfg.max_tokens * ANSWER_BYTES_PER_TOKEN
        self.canary_timeout = min(CANARY_TIMEOUT_SECONDS, remote.request_timeout_seconds)
        self._canary_payload: bytes | None = None

    # ---- lifecycle ------------------------------------------------------------------

    @classmethod
    def preflight(cls, cfg: EngineConfig) -> list[str]:
        """The engine's own checks, and every server URL parses: http(s), a host, a port
        that is one."""
        out = super().preflight(cfg)
        for i, url in enumerate(cfg.remote.urls):
            why = _url_problem(url)
            if why:
                out.append(f"engine.remote.urls[{i}] = {url!r}: {why}")
        return out

    async def start(self) -> None:
        """Probe the servers. Unreachable servers are not an error here (pages wait for
        them); a server that answers without serving `model` is a configuration error."""
        await self._probe_all()
        answering = [s for s in self.servers if s.failures == 0]
        if answering and not any(self.model in s.models for s in answering):
            await self._client.close()  # this engine is not going to be used
            served = sorted({m for s in answering for m in s.models})
            raise ConfigError(f"engine.model = {self.model!r}: not served by "
                              f"{', '.join(s.url for s in answering)} (they serve {served}); "
                              "use the server's --served-model-name")
        for s in self.servers:
            log.info("remote_server", url=s.url, up=s.failures == 0, models=s.models,
                     error=s.last_error)

    async def health(self) -> bool:
        """Whether a server takes pages: one that is not sick answers /models (a sick
        one is back when its canary is: see _recover)."""
        if self._closing:
            return False
        await self._probe_all()
        return any(s.failures == 0 and s.sick is None for s in self.servers)

    async def close(self) -> None:
        """Stop taking pages and cut the connections in flight: the servers abort those
        requests, and their `ocr()` calls raise EngineUnavailable (the pages stay queued)."""
        self._closing = True
        recoveries = [s.recovery for s in self.servers if s.recovery is not None]
        for task in [*recoveries, *self._requests]:
            task.cancel()
        self._slot_freed.set()
        await asyncio.gather(*recoveries, *self._requests, return_exceptions=True)
        await self._client.close()

    @property
    def follows_prompt(self) -> bool:
        return self.recipe.follows_prompt

    def describe(self) -> dict:
        info = super().describe()
        info["urls"] = [s.url for s in self.servers]
        info.update(self.recipe.describe())
        return info

    def in_flight(self) -> dict[str, int]:
        """Pages in flight per server URL."""
        return {s.url: s.in_flight for s in self.servers}

    async def _probe_all(self) -> None:
        await asyncio.gather(*(self._probe(s) for s in self.servers if s.sick is None))

    async def _probe(self, server: _Server) -> None:
        try:
            resp = await self._client.send("GET", server.url + "/models",
                                           headers=self._headers(),
                                           timeout=PROBE_TIMEOUT_SECONDS)
        except (ServerUnreachable, TimeoutError) as e:
            server.failed(str(e) or "timed out")
            return
        if resp.status != 200:
            server.failed(f"HTTP {resp.status}: {resp.error_text()}")
            return
        try:
            server.models = [m["id"] for m in resp.json().get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            server.models = []
        server.answered()

    # ---- pages ----------------------------------------------------------------------

    async def ocr(self, page: PageRequest) -> PageOutput:
        if self._closing:
            raise EngineUnavailable("the remote engine is shutting down")
        # PNG encoding takes tens of milliseconds per page: off the event loop.
        url = await asyncio.to_thread(image_data_url, page.image)
        # the page's pixels are in the URL now: not kept while the server reads it (up to
        # hundreds of pages in flight), and the pipeline keeps the URL for the page's
        # figures instead of its own packed copy
        if page.on_encoded is not None:
            page.on_encoded(url)
        page = replace(page, image=None, on_encoded=None)
        out = await self._read(page, url)
        turn = out.extra.pop(TURN_ASKED, None)
        if turn is not None:
            # the model says the page lies turned: once more, turned as it says
            turned = await asyncio.to_thread(_turned_data_url, url, turn)
            out = await self._read(page, turned)
            out.extra.pop(TURN_ASKED, None)
            out.rotation = turn
        return out

    async def _read(self, page: PageRequest, image_url: str) -> PageOutput:
        return await convert_with_retries(lambda n: self._attempt(page, image_url, n),
                                          self.cfg.loop_retries)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.remote.api_key:
            headers["Authorization"] = f"Bearer {self.remote.api_key}"
        return headers

    def _payload(self, page: PageRequest, image_url: str, attempt: int) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": self.recipe.messages(page, image_url),
            **self.recipe.sampling(attempt),
            "max_tokens": self.cfg.max_tokens,
        }
        if self.send_priority:  # lower first; vLLM breaks ties by arrival
            payload["priority"] = page.priority
        return payload

    async def _attempt(self, page: PageRequest, image_url: str, attempt: int) -> Attempt:
        body = json.dumps(self._payload(page, image_url, attempt)).encode("utf-8")
        done, server = await self._post("/chat/completions", body, parse_completion)
        read = self.recipe.read(done.text)
        extra = {"engine": self.kind, "server": server.url, **read.extra}
        if read.turn is not None:
            extra[TURN_ASKED] = read.turn
        return Attempt(text=read.text, finish_reason=done.finish_reason,
                       tokens=done.tokens, prompt_tokens=done.prompt_tokens, extra=extra)

    async def probe_status(self, url: str, timeout: float = PROBE_TIMEOUT_SECONDS
                           ) -> int | None:
        """The HTTP status of a GET of `url` through this engine's client (e.g. a
        server's /health), or None when there is no answer within `timeout`."""
        try:
            resp = await self._client.send("GET", url, timeout=timeout)
        except (ServerTrouble, TimeoutError):
            return None
        return resp.status

    # ---- who is to blame ---------------------------------------------------------------

    async def sick_server_or_hard_page(self, server: _Server, failure: Exception) -> Blame:
        """THE rule for a failed request: is it held against the server, the settings
        or the page? Only "page" counts towards failing the page's file.

        - no answer (refused, reset, cut off), an answer larger than the limit or not a
          chat completion, HTTP 408, 429 or 5xx: the server's — the page goes to another
          server, or waits until one can take it;
        - HTTP 401, 403, 404: the settings' (key, model, URL) — every page waits;
        - any other HTTP 4xx: the page's — the server read this request and refused it;
        - no answer within engine.remote.request_timeout_seconds: ambiguous, so the server is
          asked for a one-token page (the canary). Back in time: the server works and
          this page is what takes too long — the page's. Not back: the server is sick
          (hung, or too slow for any page) — the server's; it gets no pages, and its
          other requests are cut, until a canary comes back.
        """
        if isinstance(failure, _Refused):
            if failure.status in CONFIG_STATUS:
                return "settings"
            return "server" if failure.status in RETRY_STATUS else "page"
        if not isinstance(failure, TimeoutError):
            return "server"
        if server.sick is None and await self._canary(server):
            return "page"
        self._set_sick(server, f"no answer within engine.remote.request_timeout_seconds = "
                               f"{self.remote.request_timeout_seconds:g}, nor to a canary "
                               f"within {self.canary_timeout:g} s")
        return "server"

    async def _canary(self, server: _Server) -> bool:
        """Whether the server completes a one-token page within the canary's timeout
        (one canary at a time per server; its waiters share the answer)."""
        if server.canary is None or server.canary.done():
            server.canary = asyncio.ensure_future(self._send_canary(server))
        return await asyncio.shield(server.canary)

    async def _send_canary(self, server: _Server) -> bool:
        try:
            resp = await self._send(server, "/chat/completions", self._canary_body(),
                                    self.canary_timeout)
            if resp.status == 200:
                await asyncio.to_thread(parse_completion, resp.body)
                return True
        except (ServerTrouble, TimeoutError):
            pass
        return False

    def _canary_body(self) -> bytes:
        """A blank 64 × 64 page, read as plain text, one token at most."""
        if self._canary_payload is None:
            canary = PageRequest(image=None, page_no=0, doc_id="canary", prompt_mode="text")
            payload = self._payload(canary, image_data_url(Image.new("RGB", (64, 64),
                                                                     "white")), 1)
            payload["max_tokens"] = 1
            self._canary_payload = json.dumps(payload).encode("utf-8")
        return self._canary_payload

    def _set_sick(self, server: _Server, why: str) -> None:
        """No more pages to the server until a canary comes back; its requests in
        flight are cut (they go to another server, or wait)."""
        if server.sick is not None:
            return
        server.sick = why
        server.failed(f"{server.url}: {why}")
        log.warning("remote_server_sick", url=server.url, why=why,
                    pages_cut=len(server.requests))
        for request in list(server.requests):
            request.cancel()
        server.recovery = asyncio.create_task(self._recover(server),
                                              name=f"recover {server.url}")
        self._slot_freed.set()

    async def _recover(self, server: _Server) -> None:
        """Canaries to a sick server, further and further apart, until one comes back."""
        delay = RECOVERY_FIRST_SECONDS
        while not self._closing:
            await asyncio.sleep(delay)
            if await self._canary(server):
                server.sick = None
                server.answered()
                log.info("remote_server_recovered", url=server.url)
                self._slot_freed.set()
                return
            delay = min(delay * 2, RECOVERY_MAX_SECONDS)

    # ---- requests ----------------------------------------------------------------------

    async def _send(self, server: _Server, path: str, body: bytes,
                    timeout: float | None = None) -> Answer:
        """POST in a task of its own, which close() (or the server falling sick) cancels:
        then ServerUnreachable (a cancel of the caller itself stays a cancel)."""
        request = asyncio.ensure_future(self._client.send(
            "POST", server.url + path, body=body, headers=self._headers(),
            timeout=timeout or self.remote.request_timeout_seconds,
            max_bytes=self.answer_limit))
        self._requests.add(request)
        server.requests.add(request)
        try:
            return await request
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and not task.cancelling():
                if self._closing:
                    raise ServerUnreachable("cut: the engine is shutting down") from None
                if server.sick is not None:
                    raise ServerUnreachable(f"cut: the server is sick ({server.sick})") \
                        from None
            raise
        finally:
            self._requests.discard(request)
            server.requests.discard(request)

    async def _exchange(self, server: _Server, path: str, body: bytes,
                        parse: Callable[[bytes], T]) -> T:
        """One request to `server` and its answer, parsed (a long one in a thread).
        Raises what went wrong: ServerTrouble, TimeoutError, _Refused."""
        try:
            resp = await self._send(server, path, body)
        finally:
            # synchronous, so that a cancelled request still gives its slot back
            server.in_flight -= 1
            self._slot_freed.set()
        if resp.status != 200:
            raise _Refused(resp)
        if len(resp.body) <= INLINE_PARSE_BYTES:
            return parse(resp.body)
        return await asyncio.to_thread(parse, resp.body)

    async def _post(self, path: str, body: bytes,
                    parse: Callable[[bytes], T]) -> tuple[T, _Server]:
        """POST to the least busy server and parse its answer; another server or a
        later try when the server is to blame; RemoteRequestError when the page is."""
        errors: list[str] = []
        tries = MIN_TRIES + len(self.servers) - 1
        for n in range(tries):
            server = await self._acquire()
            try:
                result = await self._exchange(server, path, body, parse)
            except (ServerTrouble, TimeoutError, _Refused) as e:
                if self._closing:
                    raise EngineUnavailable("the remote engine is shutting down") from None
                problem = f"{server.url}: {_describe(e, self.remote.request_timeout_seconds)}"
                blame = await self.sick_server_or_hard_page(server, e)
            else:
                server.answered()
                server.pages += 1
                return result, server
            if blame == "page":
                server.answered()  # it works; this page is what fails
                raise RemoteRequestError(problem)
            server.failed(problem)
            if blame == "settings":
                raise EngineUnavailable(
                    f"{problem} (check engine.model, engine.remote.urls and engine.remote.api_key)")
            errors.append(problem)
            log.warning("remote_request_failed", url=server.url, error=problem, attempt=n + 1)
            if n + 1 < tries and not self._any_up():
                await asyncio.sleep(backoff(n + 1))
        raise EngineUnavailable("no OCR server took the page after "
                                f"{tries} tries: " + "; ".join(errors[-len(self.servers):]))

    def server_starting(self, url: str) -> None:
        """The server at `url` is still starting: no page goes to it (to be refused)
        until server_up()."""
        for s in self.servers:
            if s.url == url:
                s.starting = True

    def server_up(self, url: str) -> None:
        """The server at `url` answers now (it started, or started again): pages go to
        it at once, not only once its back-off from the refusals meanwhile ends."""
        for s in self.servers:
            if s.url == url:
                s.starting = False
                if s.sick is None:
                    s.answered()
                    s.down_until = 0.0
        self._slot_freed.set()  # pages waiting for a slot may take one of its

    def has_well_server(self) -> bool:
        """Whether a server is not sick (down for a moment or not)."""
        return any(s.sick is None for s in self.servers)

    def _any_up(self) -> bool:
        now = time.monotonic()
        return any(not s.is_down(now) and s.sick is None for s in self.servers)

    async def _acquire(self) -> _Server:
        """A slot on the least busy server that is up (or on any server that is not
        sick, when all are down: a try that fails fast beats waiting blind). Waits while
        all are full; EngineUnavailable when every server is sick."""
        while True:
            if self._closing:
                raise EngineUnavailable("the remote engine is shutting down")
            well = [s for s in self.servers if s.sick is None and not s.starting]
            if not well and all(s.starting for s in self.servers if s.sick is None):
                raise EngineUnavailable("no OCR server is up yet")
            if not well:
                raise EngineUnavailable("every OCR server is sick: " + "; ".join(
                    f"{s.url}: {s.sick}" for s in self.servers))
            now = time.monotonic()
            up = [s for s in well if not s.is_down(now)] or well
            free = [s for s in up if s.in_flight < s.limit]
            if free:
                n = len(self.servers)
                server = min(free, key=lambda s: (
                    s.in_flight, (self.servers.index(s) - self._turn) % n))
                self._turn = (self._turn + 1) % n
                server.in_flight += 1
                return server
            self._slot_freed.clear()
            await self._slot_freed.wait()


def _turned_data_url(url: str, turn: int) -> str:
    """The page in the PNG data URL `url`, turned `turn` degrees clockwise, as another."""
    png = base64.b64decode(url.partition(",")[2])
    with Image.open(io.BytesIO(png)) as image:
        turned = image.transpose(_CLOCKWISE[turn])
    return image_data_url(turned)


def _describe(failure: Exception, timeout: float) -> str:
    if isinstance(failure, TimeoutError):
        return f"no answer within engine.remote.request_timeout_seconds = {timeout:g}"
    if isinstance(failure, BadAnswer):
        return f"unusable answer: {failure}"
    return str(failure) or type(failure).__name__
