"""DeepSeek-OCR-2 on one or more `vllm serve` instances, through their OpenAI-compatible API.

Pages go to the server with the fewest pages in flight, at most `concurrency_per_url` (the
server's batch) + `queue_per_url` (waiting in its queue) per server. Connection errors and
5xx answers are retried with exponential backoff on any server; when none answers, `ocr()`
raises EngineUnavailable (the daemon re-queues the page and pauses intake) instead of
failing the page. The requests go through aiohttp (ocrd/engines/http.py: TLS settings,
proxies from the environment); cancelling `ocr()` closes the request's connection, which
makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from PIL import Image

from ocrd.config import ConfigError, EngineConfig
from ocrd.engines import deepseek_ocr2
from ocrd.engines._loops import Attempt, convert_with_retries
from ocrd.engines.base import Engine, PageOutput, PageRequest
from ocrd.engines.deepseek_ocr2 import AttemptSettings
from ocrd.engines.http import Answer, Client, ServerUnreachable
from ocrd.errors import EngineUnavailable

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


class RemoteRequestError(RuntimeError):
    """The server refused this page's request (HTTP 4xx other than auth/not found)."""


def image_data_url(image: Image.Image) -> str:
    """The page as a PNG data URL: lossless, so the server sees the pixels a local engine
    would."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode("ascii")


def png_bytes(image: Image.Image) -> bytes:
    """The image as an RGB PNG whose rows are left unfiltered, deflated at level 1.

    Pillow's PNG writer tries five filters on every row and keeps the best: on a page
    rendered at 144 dpi that search is most of its 74 ms, and the daemon pays it for
    every page it sends (hundreds in flight on a GPU host). Unfiltered rows deflate in
    about half the time to a PNG of about the same size (bench/png_micro.py); zlib lets
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


def chat_text(prompt: str) -> str:
    """The prompt without its `<image>` placeholder.

    vLLM's chat path puts one `<image>\\n` before the text of a message whose text has no
    placeholder, and DeepSeek-OCR(-2)'s fallback chat template adds nothing but the BOS
    token, so the model sees exactly the recipe's plain prompt.
    """
    return prompt.removeprefix("<image>").removeprefix("\n")


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

    def is_down(self, now: float) -> bool:
        return self.failures > 0 and now < self.down_until

    def failed(self, reason: str) -> None:
        self.failures += 1
        self.last_error = reason
        backoff = min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (self.failures - 1))
        self.down_until = time.monotonic() + backoff

    def answered(self) -> None:
        self.failures = 0
        self.last_error = None


class RemoteEngine(Engine):
    """Pages sent to OpenAI-compatible `vllm serve` servers running DeepSeek-OCR-2."""

    kind = "remote"
    output_format = deepseek_ocr2.OUTPUT_FORMAT

    def __init__(self, cfg: EngineConfig, *, use_proxy: bool = True,
                 send_priority: bool = False) -> None:
        """`use_proxy=False`: connect directly, whatever HTTP(S)_PROXY says (for a
        server on this machine). `send_priority`: each request carries its page's
        PageRequest.priority as vLLM's `priority` (servers started with
        `--scheduling-policy priority`, which refuse one otherwise)."""
        if not cfg.urls:
            raise ConfigError("engine.urls is empty: the remote engine needs a server URL")
        self.cfg = cfg
        self.model = cfg.model
        self.send_priority = send_priority
        per_server = cfg.concurrency_per_url + cfg.queue_per_url
        self.servers = [_Server(u.rstrip("/"), per_server) for u in cfg.urls]
        self.max_concurrency = per_server * len(self.servers)
        # set whenever a slot frees up; waiters re-check (asyncio: no lost wake-ups
        # between the check and the wait, as nothing awaits in between)
        self._slot_freed = asyncio.Event()
        self._turn = 0  # rotates the choice among equally busy servers
        self._closing = False
        self._client = Client(cfg, use_proxy=use_proxy)
        self._requests: set[asyncio.Task] = set()  # in flight, for close() to cut

    # ---- lifecycle ------------------------------------------------------------------

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
        if self._closing:
            return False
        await self._probe_all()
        return any(s.failures == 0 for s in self.servers)

    async def close(self) -> None:
        """Stop taking pages and cut the connections in flight: the servers abort those
        requests, and their `ocr()` calls raise EngineUnavailable (the pages stay queued)."""
        self._closing = True
        for request in list(self._requests):
            request.cancel()
        self._slot_freed.set()
        await asyncio.gather(*self._requests, return_exceptions=True)
        await self._client.close()

    def describe(self) -> dict:
        info = super().describe()
        info["urls"] = [s.url for s in self.servers]
        return info

    def in_flight(self) -> dict[str, int]:
        """Pages in flight per server URL."""
        return {s.url: s.in_flight for s in self.servers}

    async def _probe_all(self) -> None:
        await asyncio.gather(*(self._probe(s) for s in self.servers))

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
        return await convert_with_retries(lambda s: self._attempt(page, url, s), self.cfg)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.cfg.api_key:
            headers["Authorization"] = f"Bearer {self.cfg.api_key}"
        return headers

    def _payload(self, page: PageRequest, image_url: str,
                 settings: AttemptSettings) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": image_url}},
                {"type": "text", "text": chat_text(deepseek_ocr2.prompt(page))},
            ]}],
            **deepseek_ocr2.SAMPLING,
            "max_tokens": self.cfg.max_tokens,
            # per-request arguments of the server's NGramPerReqLogitsProcessor
            "vllm_xargs": settings.extra_args(),
        }
        if self.send_priority:  # lower first; vLLM breaks ties by arrival
            payload["priority"] = page.priority
        rep = settings.repetition_params()
        if rep is not None:
            # vLLM >= 0.19 stops a looping request early; older servers ignore the field.
            payload["repetition_detection"] = rep
        return payload

    async def _attempt(self, page: PageRequest, image_url: str,
                       settings: AttemptSettings) -> Attempt:
        body = json.dumps(self._payload(page, image_url, settings)).encode("utf-8")
        resp, server = await self._post("/chat/completions", body)
        try:
            data = resp.json()
            choice = data["choices"][0]
            usage = data.get("usage") or {}
            text = (choice.get("message") or {}).get("content") or ""
            reason = choice.get("finish_reason") or "stop"
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise RemoteRequestError(f"{server.url}: unexpected answer: {e!r}") from e
        return Attempt(text=text, finish_reason=reason,
                       tokens=usage.get("completion_tokens"),
                       prompt_tokens=usage.get("prompt_tokens"),
                       extra={"engine": self.kind, "server": server.url})

    async def probe_status(self, url: str, timeout: float = PROBE_TIMEOUT_SECONDS
                           ) -> int | None:
        """The HTTP status of a GET of `url` through this engine's client (e.g. a
        server's /health), or None when there is no answer within `timeout`."""
        try:
            resp = await self._client.send("GET", url, timeout=timeout)
        except (ServerUnreachable, TimeoutError):
            return None
        return resp.status

    async def _send(self, url: str, body: bytes) -> Answer:
        """POST in a task of its own, which close() cancels: then EngineUnavailable
        (a cancel of the caller itself stays a cancel)."""
        request = asyncio.ensure_future(self._client.send(
            "POST", url, body=body, headers=self._headers(),
            timeout=self.cfg.request_timeout_seconds))
        self._requests.add(request)
        try:
            return await request
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closing and task is not None and not task.cancelling():
                raise ServerUnreachable("cut: the engine is shutting down") from None
            raise
        finally:
            self._requests.discard(request)

    async def _post(self, path: str, body: bytes) -> tuple[Answer, _Server]:
        """POST to the least busy server; retry elsewhere/later on server trouble."""
        errors: list[str] = []
        tries = MIN_TRIES + len(self.servers) - 1
        for n in range(tries):
            if self._closing:
                raise EngineUnavailable("the remote engine is shutting down")
            server = await self._acquire()
            try:
                resp = await self._send(server.url + path, body)
            except ServerUnreachable as e:
                if self._closing:
                    raise EngineUnavailable("the remote engine is shutting down") from None
                problem = f"{server.url}: {e}"
                server.failed(problem)
            except TimeoutError:
                server.answered()  # it accepted the page; the page is what takes so long
                raise RemoteRequestError(
                    f"{server.url}: no answer within engine.request_timeout_seconds = "
                    f"{self.cfg.request_timeout_seconds:g}") from None
            else:
                if resp.status == 200:
                    server.answered()
                    server.pages += 1
                    return resp, server
                problem = f"{server.url}: HTTP {resp.status}: {resp.error_text()}"
                if resp.status in CONFIG_STATUS:
                    server.failed(problem)
                    raise EngineUnavailable(
                        f"{problem} (check engine.model, engine.urls and engine.api_key)")
                if resp.status not in RETRY_STATUS:
                    server.answered()
                    raise RemoteRequestError(problem)
                server.failed(problem)
            finally:
                # synchronous, so that a cancelled request still gives its slot back
                server.in_flight -= 1
                self._slot_freed.set()
            errors.append(problem)
            log.warning("remote_request_failed", url=server.url, error=problem, attempt=n + 1)
            if n + 1 < tries and not self._any_up():
                await asyncio.sleep(min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** n))
        raise EngineUnavailable("no OCR server took the page after "
                                f"{tries} tries: " + "; ".join(errors[-len(self.servers):]))

    def _any_up(self) -> bool:
        now = time.monotonic()
        return any(not s.is_down(now) for s in self.servers)

    async def _acquire(self) -> _Server:
        """A slot on the least busy server that is up (or on any server, when all are
        down: a try that fails fast beats waiting blind). Waits while all are full."""
        while True:
            if self._closing:
                raise EngineUnavailable("the remote engine is shutting down")
            now = time.monotonic()
            up = [s for s in self.servers if not s.is_down(now)] or self.servers
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
