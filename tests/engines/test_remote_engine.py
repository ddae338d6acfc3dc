"""RemoteEngine against fake OpenAI-compatible servers that behave like `vllm serve`
(tests/fake_vllm.py: a real vLLM server needs the vLLM venv;
tests/vllm_engine/test_vllm_remote.py runs the same engine against a real one). Also
covers the shared loop-retry logic in ocrd/engines/repetition.py.
"""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import time
from dataclasses import replace
from typing import Any

import pytest
from fake_vllm import LOOP_TEXT, MODEL, FakeVllm, closed_port, config, page
from PIL import Image

from ocrd.config.settings import ConfigError
from ocrd.engines import deepseek_ocr2, remote
from ocrd.engines import repetition as _loops
from ocrd.engines.base import PageRequest
from ocrd.engines.deepseek_ocr2 import chat_text
from ocrd.engines.remote import RemoteEngine, RemoteRequestError
from ocrd.errors import EngineUnavailable


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
    writer, bench/probes/png_micro.py): a valid PNG (chunk CRCs checked by Pillow) that
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


# ---- the shared loop logic (ocrd/engines/repetition.py) ---------------------------------


def test_trim_loop_cuts_repeated_tails_only() -> None:
    assert _loops.trim_loop("Title\n" + "row | x |\n" * 50) == "Title\nrow | x |\n"
    assert _loops.trim_loop("abc" * 2) == "abcabc"  # two copies is not a loop
    assert _loops.trim_loop("Total ......") == "Total ......"  # too short to be a loop
    assert _loops.trim_loop("") == ""
    prose = "The quick brown fox jumps over the lazy dog. " * 1 + "The end."
    assert _loops.trim_loop(prose) == prose


def test_retry_settings_tighten() -> None:
    from ocrd.config.engine import NGramConfig

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


# ---- faults of the server, not the page (issue: no engine fault may cost a file) -------


def test_backoff_stays_finite_after_thousands_of_failures() -> None:
    """A server that drops a thousand pages at once has a thousand failures in a row;
    its backoff stays within the maximum (it overflowed a float past 1,024)."""
    server = remote._Server("http://x/v1", limit=1)
    for _ in range(3000):
        server.failed("refused")
    assert server.failures == 3000
    assert server.down_until - time.monotonic() <= remote.BACKOFF_MAX_SECONDS
    assert remote.backoff(10**6) == remote.BACKOFF_MAX_SECONDS


def test_a_fake_server_dropping_1100_pages_then_refusing_fails_none_of_them(
        fast_backoff: None) -> None:
    """1,100 pages in flight to one server that drops them all and refuses connections
    for a while: every page's call ends as EngineUnavailable (the page waits) or
    converts once the server is back — never with an error that would count against
    the page."""
    pages_n = 1100

    async def page_until_done(engine: RemoteEngine, request: PageRequest) -> Any:
        while True:  # as the pipeline does: wait for the engine, then send the page again
            try:
                return await engine.ocr(request)
            except EngineUnavailable:
                while not await engine.health():
                    await asyncio.sleep(0.2)

    async def run() -> tuple[list[Any], FakeVllm]:
        server = await FakeVllm(latency=3600, limit=5000).start()
        engine = RemoteEngine(config(server.url, concurrency_per_url=pages_n + 100,
                                     queue_per_url=0))
        requests = [page(i, size=(8, 8)) for i in range(pages_n)]
        tasks = [asyncio.create_task(page_until_done(engine, r)) for r in requests]
        deadline = time.monotonic() + 120
        while server.in_flight < pages_n and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert server.in_flight == pages_n
        await server.stop()  # every page dropped; connections refused from now on
        await asyncio.sleep(3)
        server.latency = 0.01
        await server.start()  # same port: back
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True),
                                         300)
        await engine.close()
        await server.stop()
        return results, server

    results, server = asyncio.run(run())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == []
    assert len(results) == pages_n and all(r.text.endswith("Hello") for r in results)
    assert server.disconnects >= pages_n - 10  # they were in flight when it went down


@pytest.fixture
def quick_canary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "RECOVERY_FIRST_SECONDS", 0.1, raising=False)
    monkeypatch.setattr(remote, "RECOVERY_MAX_SECONDS", 0.2, raising=False)


def test_a_hung_server_s_pages_go_to_another_server(fast_backoff: None,
                                                    quick_canary: None) -> None:
    """One of two servers hangs (its /v1/models answers, its completions never come
    back): its pages time out, the canary does not come back either, so the server is
    sick: its pages go to the other server, none is held against its page."""
    async def run() -> tuple[FakeVllm, FakeVllm, RemoteEngine, list[Any]]:
        hung, good = await FakeVllm(hang=True).start(), await FakeVllm().start()
        engine = RemoteEngine(config(hung.url, good.url, request_timeout_seconds=1.0,
                                     concurrency_per_url=4, queue_per_url=0))
        outs = await asyncio.gather(*(engine.ocr(page(i)) for i in range(12)),
                                    return_exceptions=True)
        assert await engine.health()  # the good server takes pages
        await engine.close()
        await hung.stop()
        await good.stop()
        return hung, good, engine, outs

    hung, good, engine, outs = asyncio.run(run())
    assert [o for o in outs if isinstance(o, BaseException)] == []
    assert {o.extra["server"] for o in outs} == {good.url}
    assert good.served == 12 and hung.served == 0
    assert engine.servers[0].sick and "canary" in engine.servers[0].sick
    assert engine.servers[1].sick is None


def test_a_hung_server_alone_makes_pages_wait_until_a_canary_comes_back(
        fast_backoff: None, quick_canary: None) -> None:
    """The only server hangs: its pages are not failed but wait (EngineUnavailable),
    its health is false although /v1/models answers, and once it completes pages again
    a canary brings it back."""
    async def run() -> tuple[list[Any], bool, Any, FakeVllm]:
        server = await FakeVllm(hang=True).start()
        engine = RemoteEngine(config(server.url, request_timeout_seconds=1.0))
        outs = await asyncio.gather(*(engine.ocr(page(i)) for i in range(3)),
                                    return_exceptions=True)
        healthy_while_hung = await engine.health()
        server.hang = False
        deadline = time.monotonic() + 30
        while not await engine.health() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        out = await engine.ocr(page())
        await engine.close()
        await server.stop()
        return outs, healthy_while_hung, out, server

    outs, healthy_while_hung, out, server = asyncio.run(run())
    assert all(isinstance(o, EngineUnavailable) for o in outs), outs
    assert healthy_while_hung is False
    assert out.text.endswith("Hello")


def test_a_page_that_times_out_alone_is_the_page_s_fault(fast_backoff: None) -> None:
    """The server completes other pages and the canary: a page that times out there is
    what takes too long, and its own failure (RemoteRequestError); the server stays."""
    hard = page(7, size=(30, 30))
    hard_url = remote.image_data_url(hard.image)

    def is_hard(payload: dict) -> bool:
        return payload["messages"][0]["content"][0]["image_url"]["url"] == hard_url

    async def run() -> tuple[BaseException | None, list[Any], RemoteEngine]:
        server = await FakeVllm(hang=is_hard).start()
        engine = RemoteEngine(config(server.url, request_timeout_seconds=1.0))
        error = None
        try:
            await engine.ocr(hard)
        except Exception as e:
            error = e
        outs = await asyncio.gather(*(engine.ocr(page(i)) for i in range(3)))
        await engine.close()
        await server.stop()
        return error, outs, engine

    error, outs, engine = asyncio.run(run())
    assert isinstance(error, RemoteRequestError), error
    assert "request_timeout_seconds" in str(error)
    assert engine.servers[0].sick is None and len(outs) == 3


def test_an_endless_answer_is_a_server_error_and_memory_stays_flat(
        fast_backoff: None) -> None:
    """A 200 answer whose body never ends: read up to the answer limit, then the server
    is to blame (the page waits); the client holds no more than about that limit."""
    import tracemalloc

    async def run() -> tuple[BaseException | None, int, RemoteEngine, FakeVllm]:
        server = await FakeVllm(endless=True).start()
        engine = RemoteEngine(config(server.url, request_timeout_seconds=3.0))
        tracemalloc.start()
        try:
            await engine.ocr(page())
            error = None
        except Exception as e:
            error = e
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        await engine.close()
        await server.stop()
        return error, peak, engine, server

    error, peak, engine, server = asyncio.run(run())
    assert isinstance(error, EngineUnavailable), error
    assert "longer than" in str(error)
    assert peak < 3 * engine.answer_limit + (8 << 20), peak
    assert engine.answer_limit >= 8192 * 200  # far above a page of 8,192 tokens


def test_an_answer_that_says_it_is_too_long_is_not_read() -> None:
    async def run() -> BaseException:
        server = await FakeVllm(text="x" * 100_000).start()
        engine = RemoteEngine(config(server.url, max_tokens=16))  # limit: 64 KiB + 4 KiB
        try:
            with pytest.raises(EngineUnavailable) as caught:
                await engine.ocr(page())
        finally:
            await engine.close()
            await server.stop()
        return caught.value

    assert "more than the" in str(asyncio.run(run()))


def test_content_as_a_list_of_parts_is_its_text_joined() -> None:
    """OpenAI's list-of-parts form, which some compatible servers send."""
    parts = [{"type": "text", "text": "Hello "}, {"type": "image_url", "image_url": {}},
             {"type": "text", "text": "world"}]

    async def run() -> Any:
        server = await FakeVllm(text=parts).start()
        engine = RemoteEngine(config(server.url))
        out = await engine.ocr(page())
        await engine.close()
        await server.stop()
        return out

    out = asyncio.run(run())
    assert out.text == "Hello world" and out.finish_reason == "stop"


@pytest.mark.parametrize("broken", [
    {"text": 42}, {"text": {"a": 1}}, {"text": [{"type": "text", "text": 5}]},
    {"finish_reason": "--> <script>alert(1)</script>"}, {"finish_reason": 7},
    {"raw_answer": b"<html>502 Bad Gateway</html>"}, {"raw_answer": b'{"choices": []}'},
    {"raw_answer": b'{"choices": [{"message": "hi"}]}'}, {"raw_answer": b"\xff\xfe"},
])
def test_a_200_answer_of_another_shape_is_the_server_s_error(
        fast_backoff: None, broken: dict) -> None:
    """Not a chat completion: the server's fault, like a 5xx — the page goes to another
    server (and waits when none answers properly), never a failure of its own."""
    async def run() -> tuple[list[Any], BaseException | None, FakeVllm, FakeVllm]:
        bad, good = await FakeVllm(**broken).start(), await FakeVllm().start()
        engine = RemoteEngine(config(bad.url, good.url))
        outs = [await engine.ocr(page(i)) for i in range(4)]
        await engine.close()
        alone = RemoteEngine(config(bad.url))
        try:
            await alone.ocr(page())
            error = None
        except Exception as e:
            error = e
        await alone.close()
        await bad.stop()
        await good.stop()
        return outs, error, bad, good

    outs, error, bad, good = asyncio.run(run())
    assert all(o.extra["server"] == good.url and isinstance(o.text, str) for o in outs)
    assert len(bad.requests) >= 1
    assert isinstance(error, EngineUnavailable), error
    assert "unusable answer" in str(error)


def _loop_start_by_definition(text: str) -> int | None:
    """loop_start's contract, checked character by character: for each period p, the
    longest tail with that period; the longest qualifying tail wins (ties: the shortest
    period); the cut is after its first copy, moved to the next line break in the copy
    after that."""
    n, best_len, best_p = len(text), 0, 0
    for p in range(1, min(_loops.MAX_LOOP_PERIOD_CHARS, n // _loops.MIN_LOOP_COPIES) + 1):
        tail = p
        while tail < n and text[n - 1 - tail] == text[n - 1 - tail + p]:
            tail += 1
        if (tail >= _loops.MIN_LOOP_COPIES * p and tail - p >= _loops.MIN_LOOP_CHARS
                and tail > best_len):
            best_len, best_p = tail, p
    if not best_p:
        return None
    cut = n - best_len + best_p
    newline = text.find("\n", cut, cut + best_p)
    return newline + 1 if newline >= 0 else cut


def test_loop_start_keeps_its_definition_on_random_texts() -> None:
    import random

    rnd = random.Random(5)
    for _ in range(3000):
        alphabet = rnd.choice(["ab", "abc", ".", "ab\n|", "xyz \n"])
        head = "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(60)))
        unit = "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(1, 12)))
        tail = "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(4)))
        text = head + unit * rnd.randrange(30) + tail
        assert _loops.loop_start(text) == _loop_start_by_definition(text), repr(text)
    dots = "Total " + "." * 130_000
    assert _loops.trim_loop(dots) == "Total ."  # one copy of the repeated block kept


def test_looking_for_loops_is_done_off_the_event_loop(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """A page that never ends normally has its tries' loops looked for in a thread: a
    long text must not hold up the event loop."""
    import threading

    threads: list[threading.Thread] = []
    real = _loops.trim_loop

    def trim(text: str) -> str:
        threads.append(threading.current_thread())
        return real(text)

    monkeypatch.setattr(_loops, "trim_loop", trim)

    async def attempt(settings: Any) -> _loops.Attempt:
        return _loops.Attempt("Intro\n" + "." * 50_000, "length")

    out = asyncio.run(_loops.convert_with_retries(attempt, 1))
    assert out.text == "Intro\n." and out.attempts == 2
    assert threads and all(t is not threading.main_thread() for t in threads)
