"""The remote engine's HTTP client (aiohttp, ocrd/engines/http.py) against the
hand-written HTTP/1.1 client it replaced, side by side: the same RemoteEngine code around
each, the same fake `vllm serve` (tests/fake_vllm.py's, in a process of its own),
the same pages, alternating rounds. The old client is read from git history
(OLD_CLIENT_COMMIT) into a temporary module for this comparison only; ocrd itself no
longer has it. The details also hold the bare clients (old, aiohttp, httpx) posting the
same body, which is why ocrd uses aiohttp.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.cases import Result, _log
from bench.harness import ROOT

# The last commit whose ocrd/engines/remote.py had the hand-written client.
OLD_CLIENT_COMMIT = "15e15a16d11d20cced7e0a4b71dd4a18befdcc91"
MODEL = "deepseek-ai/DeepSeek-OCR-2"
CONCURRENCY = 16  # engine.concurrency_per_url (and queue_per_url 0): pages in flight

SERVER = """\
import asyncio, sys
from fake_vllm import FakeVllm

async def main():
    server = await FakeVllm(latency=float(sys.argv[1])).start()
    print(server.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def old_remote_module(folder: Path) -> ModuleType:
    """ocrd/engines/remote.py as of OLD_CLIENT_COMMIT, imported as a module of its own."""
    source = subprocess.run(["git", "show", f"{OLD_CLIENT_COMMIT}:ocrd/engines/remote.py"],
                            cwd=ROOT, check=True, capture_output=True).stdout
    path = folder / "ocrd_old_remote.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("ocrd_old_remote", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(latency)], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/v1"


def pages(n: int) -> list[tuple[Any, str]]:
    """Pages with their images already as PNG data URLs (encoding a page takes the same
    time with either client, and would drown the difference on a busy machine): about
    320 KB each, noise that does not compress, a realistic request size."""
    from PIL import Image

    from ocrd.engines.base import PageRequest
    from ocrd.engines.remote import image_data_url

    rnd = random.Random(7)
    images = [Image.frombytes("L", (400, 400), rnd.randbytes(400 * 400)) for _ in range(4)]
    urls = [image_data_url(im) for im in images]
    return [(PageRequest(image=images[i % 4], page_no=i + 1, doc_id="bench"), urls[i % 4])
            for i in range(n)]


Measure = tuple[float, float]  # pages (or requests) per second, client CPU ms per page


async def _timed(coros: list[Any]) -> Measure:
    """Runs the coroutines at once: their rate (wall clock) and this process's CPU time
    per coroutine (the client's own cost: the server is another process, and other
    processes' load hardly moves it)."""
    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*coros)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return len(coros) / seconds, 1000 * cpu / len(coros)


async def _round(engine_cls: type, url: str, reqs: list[tuple[Any, str]]) -> Measure:
    """Pages through the engine's `_attempt` (request body, balancing across slots, the
    HTTP exchange, the answer parsed): `ocr()` but for the PNG encoding."""
    from ocrd.config.settings import EngineConfig
    from ocrd.engines.repetition import attempt_settings

    cfg = EngineConfig.model_validate({"kind": "remote", "model": MODEL, "urls": [url],
                                       "concurrency_per_url": CONCURRENCY,
                                       "queue_per_url": 0})
    settings = attempt_settings(cfg.ngram, 1)
    engine = engine_cls(cfg)
    await engine.start()
    try:
        return await _timed([engine._attempt(page, data_url, settings)
                             for page, data_url in reqs])
    finally:
        await engine.close()


def _summary(runs: dict[str, list[Measure]]) -> dict[str, Any]:
    """Best rate and median CPU per page of each side, and new ÷ old for both."""
    rate = {k: max(r for r, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    new = next(k for k in runs if k != "old")
    return {"runs": {k: [(round(r, 1), round(c, 3)) for r, c in v] for k, v in runs.items()},
            "best_per_s": {k: round(v, 1) for k, v in rate.items()},
            "median_cpu_ms": {k: round(v, 3) for k, v in cpu.items()},
            "rate_ratio": rate[new] / rate["old"], "cpu_ratio": cpu[new] / cpu["old"]}


def compare(latency: float, n: int, rounds: int, old: ModuleType) -> dict[str, Any]:
    from ocrd.engines.remote import RemoteEngine

    proc, url = start_server(latency)
    try:
        reqs = pages(n)
        runs: dict[str, list[Measure]] = {"old": [], "aiohttp": []}
        for _ in range(rounds):
            for name, cls in (("old", old.RemoteEngine), ("aiohttp", RemoteEngine)):
                runs[name].append(asyncio.run(_round(cls, url, reqs)))
    finally:
        proc.terminate()
        proc.wait()
    out = {"latency_s": latency, "pages": n, "concurrency": CONCURRENCY, **_summary(runs)}
    _log(f"remote engine, server {latency:g} s a page: pages/s {out['best_per_s']}, "
         f"client CPU ms a page {out['median_cpu_ms']}")
    return out


async def _bare(kind: str, url: str, body: bytes, n: int, old: ModuleType) -> Measure:
    """One bare client posting `body` n times, CONCURRENCY at once."""
    import aiohttp
    import httpx

    sem = asyncio.Semaphore(CONCURRENCY)
    headers = {"Content-Type": "application/json"}
    session = aiohttp.ClientSession() if kind == "aiohttp" else None
    client = httpx.AsyncClient() if kind == "httpx" else None

    async def one() -> None:
        async with sem:
            if session is not None:
                async with session.post(url, data=body, headers=headers) as r:
                    status = r.status
                    await r.read()
            elif client is not None:
                status = (await client.post(url, content=body, headers=headers)).status_code
            else:
                status = (await old.http_request(url, "POST", body, headers)).status
            assert status == 200, status

    try:
        return await _timed([one() for _ in range(n)])
    finally:
        if session is not None:
            await session.close()
        if client is not None:
            await client.aclose()


def bare_clients(n: int, rounds: int, old: ModuleType) -> dict[str, Any]:
    """The clients alone against an instant server: what each costs per request."""
    proc, url = start_server(0.0)
    try:
        page, data_url = pages(1)[0]
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url}},
            {"type": "text", "text": "Free OCR."}]}]}).encode()
        runs: dict[str, list[Measure]] = {"old": [], "aiohttp": [], "httpx": []}
        for _ in range(rounds):
            for kind in runs:
                runs[kind].append(asyncio.run(_bare(kind, url + "/chat/completions", body,
                                                    n, old)))
    finally:
        proc.terminate()
        proc.wait()
    out = {"requests": n, "concurrency": CONCURRENCY}
    for kind in ("aiohttp", "httpx"):
        out[kind] = _summary({"old": runs["old"], kind: runs[kind]})
    _log(f"bare clients, client CPU ms a request: old {out['httpx']['median_cpu_ms']['old']}, "
         f"aiohttp {out['aiohttp']['median_cpu_ms']['aiohttp']}, "
         f"httpx {out['httpx']['median_cpu_ms']['httpx']}")
    return out


def remote_client(quick: bool) -> list[Result]:
    n, rounds = (150, 5) if quick else (500, 7)
    with tempfile.TemporaryDirectory() as tmp:
        old = old_remote_module(Path(tmp))
        busy = compare(0.05, n, rounds, old)  # the server takes its time, as vLLM does
        bare = compare(0.0, n, rounds, old)  # instant answers: the client's own cost
        bare["bare_clients"] = bare_clients(n, rounds, old)
    return [Result("remote_client_pages_per_s_vs_old", busy["rate_ratio"], 0.95, ">=", busy),
            Result("remote_client_cpu_per_page_vs_old", bare["cpu_ratio"], 1.1, "<=", bare)]


REMOTE_CASES = {"remote_client": remote_client}
