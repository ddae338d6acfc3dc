"""The worst model text a server can send, against the event loop: how long one page's
handling holds up the daemon's loop (target: 50 ms at most, whatever the page).

Each case is one page converted through ocrd's pipeline in this process (`Converter`:
render, the remote engine with its retries and loop trimming, the page's Markdown made
safe, the outputs written) against the fake `vllm serve` of tests/fake_vllm.py
in a process of its own, which answers every request with the case's answer (built once).
Meanwhile a ticker on the loop wakes every 2 ms; the longest it was late is the longest
the loop was blocked. The ratio is that ÷ 50 ms; the details hold the same ticker's worst
lateness over the same time with the loop idle (the machine's noise), the page's outcome
and how long it took.

    PYTHONPATH=$PWD .venv/bin/python -m bench.worst_text [--only NAME,...]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cases import Result, _log
from bench.harness import ROOT

MODEL = "deepseek-ai/DeepSeek-OCR-2"
TARGET_MS = 50.0
TICK_S = 0.002
# How long a page that cannot finish (its answer refused) is watched.
WATCH_SECONDS = 12.0
MAX_TOKENS = 8192  # engine.max_tokens: the answer limit follows from it


def answer_limit() -> int:
    from ocrd.engines.remote import ANSWER_BASE_BYTES, ANSWER_BYTES_PER_TOKEN

    return ANSWER_BASE_BYTES + MAX_TOKENS * ANSWER_BYTES_PER_TOKEN


def dot_leaders() -> str:
    """A table of contents that ran out of its 8,192 tokens in a leader: 40 lines of
    dot leaders, then dots to 130,000 in all."""
    lines = [f"{k}. Section {k} {'.' * 120} {k * 3}" for k in range(1, 41)]
    return "Contents\n" + "\n".join(lines) + "\n41. Index " + "." * (130_000 - 40 * 120)


def case_answer(name: str) -> tuple[Any, str] | None:
    """The message content and finish_reason of each case (the JSON of the *_at_limit
    ones fills the answer limit but for 1 KiB); None: a chunked answer without end."""
    if name == "endless_chunked_answer":
        return None
    room = answer_limit() - 1024
    cases: dict[str, tuple[Any, str]] = {
        "dot_leaders_8192_tokens": (dot_leaders(), "length"),
        "dots_1_5mb_length": ("Total " + "." * 1_500_000, "length"),
        "one_char_run_at_limit": ("a" * room, "length"),
        "line_breaks_at_limit": ("\n" * (room // 2), "length"),  # JSON: "\n" is 2 bytes
        "tags_at_limit": ("<a" * (room // 2), "length"),
        "lone_surrogates_at_limit": ("\ud800" * (room // 6), "length"),  # 6 bytes each
        "answer_60mb": ("x" * 60_000_000, "stop"),  # its length declared
    }
    return cases[name]


CASE_NAMES = ["dot_leaders_8192_tokens", "dots_1_5mb_length", "one_char_run_at_limit",
              "line_breaks_at_limit", "tags_at_limit", "lone_surrogates_at_limit",
              "answer_60mb", "endless_chunked_answer"]

SERVER = """\
import asyncio, json, sys
from bench.worst_text import case_answer
from fake_vllm import FakeVllm

async def main():
    answer = case_answer(sys.argv[1])
    if answer is None:
        server = await FakeVllm(latency=0.0, endless=True).start()
        print(server.port, flush=True)
        await asyncio.Event().wait()
    text, reason = answer
    body = json.dumps({"id": "x", "object": "chat.completion", "model": sys.argv[2],
                       "choices": [{"index": 0, "finish_reason": reason,
                                    "message": {"role": "assistant", "content": text}}],
                       "usage": {"prompt_tokens": 1146, "completion_tokens": 8192}})
    server = await FakeVllm(latency=0.0, raw_answer=body.encode()).start()
    print(server.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def start_server(name: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, name, MODEL], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/v1"


class Ticker:
    """Wakes every TICK_S on the loop and keeps the worst lateness."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(TICK_S)
            now = time.perf_counter()
            self.worst = max(self.worst, now - last - TICK_S)
            last = now

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def convert_one(url: str, folder: Path) -> dict[str, Any]:
    """One PNG page through the pipeline; the loop's worst block meanwhile."""
    from PIL import Image

    from ocrd import safefs
    from ocrd.config.settings import Config
    from ocrd.engines import create_engine
    from ocrd.outputs import destinations
    from ocrd.pipeline.document import Converter
    from ocrd.pipeline.schedule import FairSlots
    from ocrd.pipeline.source import Source
    from ocrd.render.pool import RenderPool

    image = folder / "page.png"
    Image.new("RGB", (300, 400), "white").save(image)
    cfg = Config.model_validate({
        "state_dir": str(folder / "state"), "render": {"workers": 1},
        "engine": {"kind": "remote", "model": MODEL, "remote": {"urls": [url]},
                   "max_tokens": MAX_TOKENS}})
    engine = create_engine(cfg.engine)
    await engine.start()
    pool = RenderPool(1)
    await pool.start()
    converter = Converter(cfg, engine, pool, FairSlots(4))
    gc.collect()  # as the daemon does once started (service/daemon.py)
    gc.freeze()
    fd = os.open(image, os.O_RDONLY)
    t0 = time.perf_counter()
    outcome = "converted"
    try:
        with Ticker() as ticker, safefs.Dir.open_root(folder / "out", create=True) as out:
            try:
                async with asyncio.timeout(WATCH_SECONDS):
                    written = await converter.convert(Source(fd, "page.png"), out,
                                                      destinations.Perms())
                outcome += f" ({(out.path / written.markdown).stat().st_size} bytes of .md)"
            except TimeoutError:
                outcome = "waiting (the answer is refused: the server's error)"
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
        await engine.close()
        await pool.close()
    with Ticker() as idle:  # the same ticker with nothing else to do: the noise
        await asyncio.sleep(min(seconds, 3.0))
    return {"blocked_ms": round(ticker.worst * 1000, 2),
            "idle_noise_ms": round(idle.worst * 1000, 2), "seconds": round(seconds, 2),
            "outcome": outcome}


def measure(name: str, rounds: int) -> dict[str, Any]:
    """The case `rounds` times (a busy machine's noise only adds); the least blocked
    round counts."""
    proc, url = start_server(name)
    runs = []
    try:
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(asyncio.run(convert_one(url, Path(tmp))))
    finally:
        proc.terminate()
        proc.wait()
    row = dict(min(runs, key=lambda r: r["blocked_ms"]))
    text, reason = case_answer(name) or ("", "none: endless")
    row.update(case=name, answer_chars=len(text), finish_reason=reason,
               rounds_blocked_ms=[r["blocked_ms"] for r in runs],
               rounds_idle_noise_ms=[r["idle_noise_ms"] for r in runs])
    _log(f"{name}: loop blocked {row['blocked_ms']} ms at most (rounds "
         f"{row['rounds_blocked_ms']} ms, idle noise {row['rounds_idle_noise_ms']} ms), "
         f"{row['outcome']}, {row['seconds']} s")
    return row


def worst_text(quick: bool, names: list[str] | None = None) -> list[Result]:
    from ocrd.service import log

    log.setup("error", "console")  # the 60 MB case logs every refused try otherwise
    results = []
    for name in names or CASE_NAMES:
        row = measure(name, 2 if quick else 3)
        results.append(Result(f"worst_text_{name}", row["blocked_ms"] / TARGET_MS, 1.0,
                              "<=", row))
    return results


WORST_TEXT_CASES = {"worst_text": worst_text}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help=f"comma-separated: {', '.join(CASE_NAMES)}")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or None
    rows = worst_text(False, names)
    print(f"\n{'case':<34} {'blocked ÷ 50 ms':>16}  {'blocked ms':>10}  {'idle ms':>8}")
    for r in rows:
        d = r.details
        print(f"{d['case']:<34} {r.value:>16.3f}  {d['blocked_ms']:>10}  "
              f"{d['idle_noise_ms']:>8}  {d['outcome']}")


if __name__ == "__main__":
    main()
