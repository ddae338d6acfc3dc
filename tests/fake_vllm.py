"""A fake `vllm serve` for the tests: asyncio on 127.0.0.1, answering /health,
/v1/models and /v1/chat/completions with vLLM's JSON shapes. It keeps connections open
between requests unless asked to close them (as uvicorn does), takes time per page,
answers 503 above its concurrency limit (as vLLM's admission control does), notices
clients that hang up, speaks TLS when given a context, and can loop or refuse on demand
— or misbehave as a broken server does: hang (its /v1/models still answering, as a hung
vLLM engine core behind a live front end does), send an endless body, or answer with
something else than a chat completion. `FakeVllmThread` serves one to a daemon that runs
as a subprocess. tests/vllm_engine/test_vllm_remote.py runs the same engine against a
real server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from ocrd.config.settings import EngineConfig
from ocrd.engines.base import PageRequest

MODEL = "deepseek-ai/DeepSeek-OCR-2"
LOOP_TEXT = "Intro line.\n" + "| a | b |\n" * 200


@dataclass
class FakeVllm:
    """A fake `vllm serve` on 127.0.0.1 (OpenAI-compatible chat completions)."""

    latency: float = 0.05
    limit: int = 1000  # more pages at once than this: HTTP 503
    fail_next: int = 0  # answer this many chat requests with 503 first
    status: int = 200  # answer every chat request with this status (when not 200)
    loop_above_ngram: int | None = None  # loop ("length") while ngram_size > this
    # the message's content: a string, or anything else a broken server might send; or
    # a function of the request's payload that answers as a model would: (content,
    # finish_reason)
    text: Any = "<|ref|>text<|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>\nHello"
    finish_reason: Any = "stop"
    # chat requests this says yes to are never answered (a hung engine core); True: all
    hang: Callable[[dict], bool] | bool = False
    raw_answer: bytes | None = None  # this body (status 200) instead of a completion
    endless: bool = False  # a chunked 200 answer that never ends
    sent_bytes: int = 0  # of endless answers
    port: int = 0
    model: str = MODEL
    tls: ssl.SSLContext | None = None  # https with this server context
    in_flight: int = 0
    max_in_flight: int = 0
    served: int = 0
    rejected: int = 0
    disconnects: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    connections: int = 0  # accepted (TLS handshakes that failed included)
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _life: int = 0  # counts start()s and stop()s: a connection belongs to one life

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1"

    async def start(self) -> FakeVllm:
        self._life += 1
        life = self._life
        self._server = await asyncio.start_server(
            lambda r, w: self._handle(r, w, life), "127.0.0.1", self.port, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Stop, as a server that exits does: new connections are refused from now on,
        and open ones are closed — those the event loop accepted and has not handed to
        _handle yet too (each is closed as soon as it is)."""
        self._life += 1
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      life: int) -> None:
        self.connections += 1
        if life != self._life:  # accepted before a stop(): that server is gone
            writer.close()
            return
        self._writers.add(writer)
        try:
            while await self._exchange(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, ValueError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> bool:
        """One request and its answer; whether the connection stays open for the next."""
        request_line = (await reader.readline()).decode()
        if not request_line:
            return False  # the client closed an idle connection
        method, path, _ = request_line.split(" ", 2)
        headers = {}
        while (line := (await reader.readline()).decode().strip()):
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        status, answer = await self._answer(method, path, body, reader)
        if status is None:
            return False  # the client hung up
        if status == 200 and path.endswith("/completions") and self.endless:
            await self._endless(writer)
            return False
        keep = headers.get("connection", "").lower() != "close"
        data = json.dumps(answer).encode()
        if status == 200 and path.endswith("/completions") and self.raw_answer is not None:
            data = self.raw_answer
        writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                     f"content-length: {len(data)}\r\n"
                     f"connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
                     .encode() + data)
        await writer.drain()
        return keep

    async def _answer(self, method: str, path: str, body: bytes,
                      reader: asyncio.StreamReader) -> tuple[int | None, dict]:
        if method == "GET" and path == "/health":
            return 200, {}
        if method == "GET" and path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        if method != "POST" or path != "/v1/chat/completions":
            return 404, {"error": {"message": f"no route {path}"}}
        payload = json.loads(body)
        self.requests.append(payload)
        if self.fail_next > 0:
            self.fail_next -= 1
            return 503, {"error": {"message": "overloaded", "code": 503}}
        if self.status != 200:
            return self.status, {"error": {"message": f"refused ({self.status})"}}
        if self.in_flight >= self.limit:
            self.rejected += 1
            return 503, {"error": {"message": "too many requests in flight"}}
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        hung = self.hang(payload) if callable(self.hang) else self.hang
        try:
            # like vLLM: work for `latency`, but stop as soon as the client hangs up
            hangup = asyncio.ensure_future(reader.read(1))
            done, _ = await asyncio.wait({hangup}, timeout=None if hung else self.latency)
            if done:
                self.disconnects += 1
                return None, {}
            hangup.cancel()  # and wait for it: the next request is read on this stream
            with contextlib.suppress(asyncio.CancelledError):
                await hangup
        finally:
            self.in_flight -= 1
        self.served += 1
        xargs = payload.get("vllm_xargs") or {}
        looping = (self.loop_above_ngram is not None
                   and xargs.get("ngram_size", 0) > self.loop_above_ngram)
        text, reason = (LOOP_TEXT, "length") if looping else (self.text, self.finish_reason)
        if callable(text):
            text, reason = text(payload)
        return 200, {
            "id": f"chatcmpl-{self.served}", "object": "chat.completion", "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": reason}],
            "usage": {"prompt_tokens": 1146, "completion_tokens": 42 if not looping else 8192,
                      "total_tokens": 1188},
        }


    async def _endless(self, writer: asyncio.StreamWriter) -> None:
        """A 200 answer whose chunked body goes on until the client hangs up: 64 KiB
        chunks, about 100 MB/s at most."""
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        chunk = b"10000\r\n" + b'{"choices": [' * (65536 // 13) + b"{" * (65536 % 13) + b"\r\n"
        while True:
            writer.write(chunk)
            await writer.drain()
            self.sent_bytes += 65536
            await asyncio.sleep(0.0006)


class FakeVllmThread:
    """A FakeVllm served by an event loop in a thread of the test process, for a daemon
    that runs as a subprocess. `call(fn)` runs `fn(server)` (which may return a
    coroutine) in that loop and returns its result."""

    def __init__(self, server: FakeVllm) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FakeVllmThread:
        self._thread.start()
        self.call(lambda s: s.start())
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.call(lambda s: s.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def call(self, fn: Callable[[FakeVllm], Any], timeout: float = 30) -> Any:
        async def run() -> Any:
            result = fn(self.server)
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)


# the transport's keys (engine.remote); the rest are the engine section's own
REMOTE_KEYS = frozenset(EngineConfig.model_fields["remote"].annotation.model_fields)


def engine_section(*urls: str, **fields: Any) -> dict[str, Any]:
    """An engine section for remote servers at `urls`; `fields` of the transport go to
    engine.remote, the others stay in the section."""
    remote = {"urls": list(urls), **{k: v for k, v in fields.items() if k in REMOTE_KEYS}}
    return {"kind": "remote", "model": MODEL, "remote": remote,
            **{k: v for k, v in fields.items() if k not in REMOTE_KEYS}}


def config(*urls: str, **fields: Any) -> EngineConfig:
    return EngineConfig.model_validate(engine_section(*urls, **fields))


def page(n: int = 1, size: tuple[int, int] = (200, 300)) -> PageRequest:
    return PageRequest(image=Image.new("RGB", size, (255, 255 - n % 50, 255)), page_no=n,
                       doc_id="doc")


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
