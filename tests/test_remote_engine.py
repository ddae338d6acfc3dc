"""RemoteEngine against fake OpenAI-compatible servers that behave like `vllm serve`.

The servers are faked (asyncio on 127.0.0.1) because a real vLLM server needs the vLLM
venv; tests/vllm_engine/test_vllm_remote.py runs the same engine against a real one. The fake
answers /health, /v1/models and /v1/chat/completions with vLLM's JSON shapes, keeps
connections open between requests unless asked to close them (as uvicorn does), takes
time per page, answers 503 above its concurrency limit (as vLLM's admission control
does), notices clients that hang up, speaks TLS when given a context, and can loop or
refuse on demand. Also covers the shared loop-retry
logic in ocrd/engines/_loops.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import socket
import ssl
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from PIL import Image

from ocrd.config import ConfigError, EngineConfig
from ocrd.engines import _loops, deepseek_ocr2, remote
from ocrd.engines.base import PageRequest
from ocrd.engines.remote import RemoteEngine, RemoteRequestError, chat_text
from ocrd.errors import EngineUnavailable

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
    text: str = "<|ref|>text<|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>\nHello"
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

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1"

    async def start(self) -> FakeVllm:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port,
                                                  ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Stop, as a server that exits does: new connections are refused from now on,
        and open ones are closed."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
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
        keep = headers.get("connection", "").lower() != "close"
        data = json.dumps(answer).encode()
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
        try:
            # like vLLM: work for `latency`, but stop as soon as the client hangs up
            hangup = asyncio.ensure_future(reader.read(1))
            done, _ = await asyncio.wait({hangup}, timeout=self.latency)
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
        text, reason = (LOOP_TEXT, "length") if looping else (self.text, "stop")
        return 200, {
            "id": f"chatcmpl-{self.served}", "object": "chat.completion", "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": reason}],
            "usage": {"prompt_tokens": 1146, "completion_tokens": 42 if not looping else 8192,
                      "total_tokens": 1188},
        }


def config(*urls: str, **fields: Any) -> EngineConfig:
    return EngineConfig.model_validate({"kind": "remote", "model": MODEL, "urls": list(urls),
                                        **fields})


def page(n: int = 1, size: tuple[int, int] = (200, 300)) -> PageRequest:
    return PageRequest(image=Image.new("RGB", size, (255, 255 - n % 50, 255)), page_no=n,
                       doc_id="doc")


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "BACKOFF_BASE_SECONDS", 0.05)
    monkeypatch.setattr(remote, "BACKOFF_MAX_SECONDS", 0.4)


def test_request_is_vllms_chat_format() -> None:
    async def run() -> tuple[Any, dict]:
        server = await FakeVllm().start()
        engine = RemoteEngine(config(server.url, max_tokens=1234))
        await engine.start()
        out = await engine.ocr(page(size=(640, 480)))
        await engine.close()
        await server.stop()
        return out, server.requests[0]

    out, req = asyncio.run(run())
    assert req["model"] == MODEL
    image_part, text_part = req["messages"][0]["content"]
    # the image as a PNG data URL, the prompt's text without the <image> placeholder
    assert image_part["type"] == "image_url"
    url = image_part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).size == (640, 480)
    assert text_part == {"type": "text", "text": "<|grounding|>Convert the document to markdown. "}
    assert req["temperature"] == 0 and req["max_tokens"] == 1234
    assert req["skip_special_tokens"] is False
    assert req["vllm_xargs"] == {"ngram_size": 30, "window_size": 90,
                                 "whitelist_token_ids": [128821, 128822]}
    assert "repetition_detection" not in req  # first try: the recipe's settings only
    assert "priority" not in req  # a server of the user's refuses one without its policy
    assert out.text.endswith("Hello") and out.finish_reason == "stop"
    assert (out.tokens, out.prompt_tokens, out.attempts, out.degraded) == (42, 1146, 1, None)
    assert out.finished_at >= out.started_at > 0


def test_a_page_carries_its_priority_to_vllm_when_asked() -> None:
    async def run() -> list[dict]:
        server = await FakeVllm().start()
        engine = RemoteEngine(config(server.url), send_priority=True)
        await engine.start()
        for priority in (7, 1):
            await engine.ocr(replace(page(), priority=priority))
        await engine.close()
        await server.stop()
        return server.requests

    assert [r["priority"] for r in asyncio.run(run())] == [7, 1]


@pytest.mark.parametrize("mode,size", [
    ("RGB", (1190, 1684)), ("RGB", (1, 1)), ("RGB", (3, 1000)), ("L", (333, 77)),
    ("RGBA", (64, 65)), ("P", (50, 40)), ("1", (17, 9)), ("I;16", (20, 30))])
def test_the_page_png_decodes_to_the_pixels_pillows_png_gave(mode: str, size: tuple) -> None:
    """ocrd writes the page's PNG itself (rows unfiltered: half the CPU of Pillow's
    writer, bench/png_micro.py): a valid PNG (chunk CRCs checked by Pillow) that
    decodes to exactly the RGB pixels Pillow's own PNG of the page decoded to."""
    import random

    rnd = random.Random(f"{mode}{size}")
    rgb = Image.frombytes("RGB", size, rnd.randbytes(size[0] * size[1] * 3))
    image = rgb if mode == "RGB" else rgb.convert(mode)
    data = remote.png_bytes(image)
    Image.open(io.BytesIO(data)).verify()  # structure and CRCs
    ours = Image.open(io.BytesIO(data))
    ours.load()
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG", compress_level=1)
    pillows = Image.open(io.BytesIO(buf.getvalue()))
    assert ours.mode == "RGB" and ours.size == size
    assert ours.tobytes() == pillows.convert("RGB").tobytes()
    assert remote.image_data_url(image) == (
        "data:image/png;base64," + base64.b64encode(data).decode("ascii"))


def test_chat_text_strips_only_the_placeholder() -> None:
    assert chat_text("<image>\nFree OCR. ") == "Free OCR. "
    assert chat_text("<image>Free OCR.") == "Free OCR."
    assert chat_text("no image here") == "no image here"


def test_pages_spread_across_two_servers_within_their_limits() -> None:
    async def run() -> tuple[FakeVllm, FakeVllm, RemoteEngine, list[Any]]:
        a, b = await FakeVllm(latency=0.2).start(), await FakeVllm(latency=0.2).start()
        engine = RemoteEngine(config(a.url, b.url, concurrency_per_url=3, queue_per_url=0))
        outs = await asyncio.gather(*(engine.ocr(page(i)) for i in range(12)))
        await engine.close()
        await a.stop()
        await b.stop()
        return a, b, engine, outs

    a, b, engine, outs = asyncio.run(run())
    assert engine.max_concurrency == 6
    assert a.served == b.served == 6  # least-in-flight first splits evenly
    assert a.max_in_flight == b.max_in_flight == 3  # used, and never exceeded
    assert {o.extra["server"] for o in outs} == {a.url, b.url}
    assert engine.in_flight() == {a.url: 0, b.url: 0}


def test_per_server_limit_is_respected() -> None:
    async def run() -> FakeVllm:
        server = await FakeVllm(latency=0.1, limit=2).start()  # 503 above 2
        engine = RemoteEngine(config(server.url, concurrency_per_url=2, queue_per_url=0))
        await asyncio.gather(*(engine.ocr(page(i)) for i in range(8)))
        await engine.close()
        await server.stop()
        return server

    server = asyncio.run(run())
    assert server.served == 8
    assert server.max_in_flight == 2 and server.rejected == 0


def test_each_server_gets_its_batch_and_a_small_queue_beyond_it() -> None:
    """Issue 14.7: with exactly the server's batch in flight, every page that finishes
    leaves a batch place empty until the next request arrives; ocrd keeps queue_per_url
    more pages waiting on the server (default 2)."""
    async def run() -> tuple[FakeVllm, RemoteEngine]:
        server = await FakeVllm(latency=0.1).start()
        engine = RemoteEngine(config(server.url, concurrency_per_url=3))
        await asyncio.gather(*(engine.ocr(page(i)) for i in range(15)))
        await server.stop()
        return server, engine

    server, engine = asyncio.run(run())
    assert engine.max_concurrency == 5
    assert server.served == 15 and server.max_in_flight == 5


def test_503_is_retried_with_backoff(fast_backoff: None) -> None:
    async def run() -> tuple[FakeVllm, Any, float]:
        server = await FakeVllm(fail_next=2).start()
        engine = RemoteEngine(config(server.url))
        t0 = time.monotonic()
        out = await engine.ocr(page())
        await engine.close()
        await server.stop()
        return server, out, time.monotonic() - t0

    server, out, seconds = asyncio.run(run())
    assert len(server.requests) == 3 and out.finish_reason == "stop"
    assert seconds >= 0.05 + 0.1  # it backed off before each retry


def test_every_server_unreachable_is_engine_unavailable(fast_backoff: None) -> None:
    async def run() -> tuple[BaseException | None, float, bool]:
        engine = RemoteEngine(config(f"http://127.0.0.1:{closed_port()}/v1",
                                     f"http://127.0.0.1:{closed_port()}/v1"))
        await engine.start()  # does not raise: pages wait for the servers
        t0 = time.monotonic()
        try:
            await engine.ocr(page())
            error = None
        except Exception as e:
            error = e
        seconds, healthy = time.monotonic() - t0, await engine.health()
        await engine.close()
        return error, seconds, healthy

    error, seconds, healthy = asyncio.run(run())
    assert isinstance(error, EngineUnavailable)  # not a page failure
    assert "connection refused" in str(error)
    assert 0.05 + 0.1 <= seconds < 5
    assert healthy is False


def test_default_backoff_gives_up_within_seconds() -> None:
    async def run() -> tuple[BaseException | None, float]:
        engine = RemoteEngine(config(f"http://127.0.0.1:{closed_port()}/v1"))
        t0 = time.monotonic()
        try:
            await engine.ocr(page())
        except EngineUnavailable as e:
            return e, time.monotonic() - t0
        finally:
            await engine.close()
        return None, time.monotonic() - t0

    error, seconds = asyncio.run(run())
    assert error is not None
    assert 3.0 <= seconds < 8  # 0.5 + 1 + 2 s of backoff over 4 tries


def test_a_dead_server_is_skipped_for_a_live_one(fast_backoff: None) -> None:
    async def run() -> tuple[FakeVllm, list[Any]]:
        live = await FakeVllm().start()
        engine = RemoteEngine(config(f"http://127.0.0.1:{closed_port()}/v1", live.url))
        outs = [await engine.ocr(page(i)) for i in range(4)]
        await engine.close()
        await live.stop()
        return live, outs

    live, outs = asyncio.run(run())
    assert live.served == 4 and all(o.extra["server"] == live.url for o in outs)


def test_server_comes_back_after_being_down(fast_backoff: None) -> None:
    async def run() -> tuple[type, str]:
        server = await FakeVllm().start()
        engine = RemoteEngine(config(server.url))
        await engine.ocr(page())
        await server.stop()
        try:
            await engine.ocr(page())
            first: type = type(None)
        except EngineUnavailable as e:
            first = type(e)
        server = await FakeVllm(port=server.port).start()  # same address, restarted
        out = await engine.ocr(page())
        await engine.close()
        await server.stop()
        return first, out.text

    first, text = asyncio.run(run())
    assert first is EngineUnavailable and text.endswith("Hello")


def test_bad_request_fails_the_page_and_bad_config_pauses() -> None:
    async def run(status: int) -> BaseException:
        server = await FakeVllm(status=status).start()
        engine = RemoteEngine(config(server.url))
        try:
            await engine.ocr(page())
        except Exception as e:
            return e
        finally:
            await engine.close()
            await server.stop()
        raise AssertionError("no error")

    assert isinstance(asyncio.run(run(400)), RemoteRequestError)  # this page's fault
    assert isinstance(asyncio.run(run(401)), EngineUnavailable)  # API key: not the page's


def test_start_refuses_a_model_the_servers_do_not_serve() -> None:
    async def run() -> None:
        server = await FakeVllm().start()
        try:
            with pytest.raises(ConfigError, match="not served"):
                await RemoteEngine(config(server.url).model_copy(
                    update={"model": "other-model"})).start()
            engine = RemoteEngine(config(server.url))
            assert await engine.health() is True
            await engine.close()
        finally:
            await server.stop()

    asyncio.run(run())


def test_loop_is_retried_with_tighter_settings() -> None:
    async def run() -> tuple[FakeVllm, Any]:
        server = await FakeVllm(loop_above_ngram=20).start()  # loops at ngram 30, not 15
        engine = RemoteEngine(config(server.url, loop_retries=2))
        out = await engine.ocr(page())
        await engine.close()
        await server.stop()
        return server, out

    server, out = asyncio.run(run())
    first, second = (r["vllm_xargs"] for r in server.requests)
    assert (first["ngram_size"], first["window_size"]) == (30, 90)
    assert (second["ngram_size"], second["window_size"]) == (15, 180)
    assert server.requests[1]["repetition_detection"]["min_count"] >= 2
    assert out.attempts == 2 and out.finish_reason == "stop" and out.degraded is None
    assert out.extra["attempt_finish_reasons"] == ["length", "stop"]


def test_a_page_that_always_loops_is_kept_degraded() -> None:
    async def run() -> Any:
        server = await FakeVllm(loop_above_ngram=0).start()  # loops whatever the settings
        engine = RemoteEngine(config(server.url, loop_retries=2))
        out = await engine.ocr(page())
        await engine.close()
        await server.stop()
        return out

    out = asyncio.run(run())
    assert out.attempts == 3 and out.finish_reason == "length"
    assert out.degraded and "length" in out.degraded
    assert out.text == "Intro line.\n| a | b |\n"  # the loop's repeats are cut
    assert out.extra["loop_trimmed_chars"] == len(LOOP_TEXT) - len(out.text)


def test_close_cuts_pages_in_flight() -> None:
    async def run() -> tuple[list[Any], float, FakeVllm]:
        server = await FakeVllm(latency=30).start()
        engine = RemoteEngine(config(server.url))
        tasks = [asyncio.create_task(engine.ocr(page(i))) for i in range(3)]
        while server.in_flight < 3:
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        await engine.close()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        seconds = time.monotonic() - t0
        while server.disconnects < 3 and time.monotonic() - t0 < 5:
            await asyncio.sleep(0.01)
        await server.stop()
        return results, seconds, server

    results, seconds, server = asyncio.run(run())
    assert all(isinstance(r, EngineUnavailable) for r in results)
    assert seconds < 2 and server.disconnects == 3  # the server saw the hang-ups


def test_cancelled_page_hangs_up_on_the_server() -> None:
    async def run() -> tuple[FakeVllm, RemoteEngine]:
        server = await FakeVllm(latency=30).start()
        engine = RemoteEngine(config(server.url))
        task = asyncio.create_task(engine.ocr(page()))
        while server.in_flight < 1:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 5
        while server.disconnects < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await engine.close()
        await server.stop()
        return server, engine

    server, engine = asyncio.run(run())
    assert server.disconnects == 1 and engine.in_flight() == {server.url: 0}


# ---- the shared loop logic (ocrd/engines/_loops.py) ---------------------------------


def test_trim_loop_cuts_repeated_tails_only() -> None:
    assert _loops.trim_loop("Title\n" + "row | x |\n" * 50) == "Title\nrow | x |\n"
    assert _loops.trim_loop("abc" * 2) == "abcabc"  # two copies is not a loop
    assert _loops.trim_loop("Total ......") == "Total ......"  # too short to be a loop
    assert _loops.trim_loop("") == ""
    prose = "The quick brown fox jumps over the lazy dog. " * 1 + "The end."
    assert _loops.trim_loop(prose) == prose


def test_retry_settings_tighten() -> None:
    from ocrd.engine_config import NGramConfig

    ngram = NGramConfig()
    settings = [deepseek_ocr2.attempt_settings(ngram, n) for n in (1, 2, 3, 4, 5)]
    assert [(s.ngram_size, s.window_size) for s in settings] == [
        (30, 90), (15, 180), (7, 360), (4, 720), (4, 1024)]
    assert not settings[0].repetition_detection
    assert all(s.repetition_detection for s in settings[1:])
    assert settings[1].extra_args()["whitelist_token_ids"] == [128821, 128822]


def test_pick_best_prefers_a_normal_end_then_the_most_text() -> None:
    looped = _loops.Attempt("A" + "xy" * 100, "length")
    longer = _loops.Attempt("Some real text here. " * 3, "repetition")
    stopped = _loops.Attempt("", "stop")  # a blank page: empty and fine
    assert _loops.pick_best([looped, longer, stopped]) is stopped
    assert _loops.pick_best([looped, longer]) is longer
