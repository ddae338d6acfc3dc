"""ManagedServerEngine (engine.vllm.api_servers > 1) with the CPU build of vLLM and the tiny
DeepSeek-OCR-2: ocrd starts `vllm serve --api-server-count 2` itself, converts pages
through it, starts it again after it is killed (pages wait meanwhile, as the daemon makes
them wait), and leaves no process behind when closed or when ocrd itself is killed.

The CPU build runs two front-end processes and one engine core on two cores: these tests
use api_servers 2, the setting a GPU machine would use with more.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from ocrd.config.settings import EngineConfig
from ocrd.engines import create_engine
from ocrd.engines.base import PageRequest
from ocrd.engines.deepseek_ocr2 import NGRAM_PROCESSOR, PROMPTS
from ocrd.engines.vllm import supervised
from ocrd.engines.vllm.inprocess import VllmEngine
from ocrd.engines.vllm.managed import (
    ManagedServerEngine,
    cli_args,
    group_alive,
    head_dim_overrides,
    server_args,
)
from ocrd.errors import EngineUnavailable
from ocrd.outputs.page import PageOutput
from ocrd.pipeline.pages import EngineGate
from ocrd.vllm_model.plugin import START_LOCK_ENV
from ocrd.vllm_model.start_gate import RELEASED_MARK, TAKEN_MARK, WAITING_MARK

API_SERVERS = 2


def managed_config(tiny_config: Callable[..., EngineConfig], **fields: Any) -> EngineConfig:
    cfg = tiny_config(**{"max_tokens": 24, "loop_retries": 0, **fields})
    return cfg.model_copy(update={"vllm": cfg.vllm.model_copy(
        update={"mode": "managed", "api_servers": API_SERVERS})})


def noise(seed: int, w: int = 640, h: int = 480) -> PageRequest:
    img = Image.frombytes("RGB", (w, h), random.Random(seed).randbytes(w * h * 3))
    return PageRequest(image=img, page_no=seed, doc_id=f"doc{seed}")


def session_members(sessions: list[int]) -> list[str]:
    """Live processes (zombies aside) in these sessions: the servers' whole families."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if stat[0] != "Z" and int(stat[3]) in sessions:
            found.append(entry.name)
    return found


async def convert_waiting(engine: ManagedServerEngine,
                          page: PageRequest) -> tuple[PageOutput, int]:
    """Convert a page the way the daemon does: on EngineUnavailable the page waits at the
    engine gate (which polls health()) and is sent again. Returns the output and how
    often the page had to wait."""
    gate = EngineGate(engine)
    waits = 0
    while True:
        await gate.open.wait()
        try:
            return await engine.ocr(page), waits
        except EngineUnavailable as e:
            waits += 1
            await gate.wait(e)


# ---- without a server -------------------------------------------------------------------

def test_flags_from_engine_args() -> None:
    assert cli_args({"enforce_eager": True, "enable_prefix_caching": False, "seed": 0,
                     "limit_mm_per_prompt": {"image": 1}, "logits_processors": ["a:B", "c:D"],
                     "hf_overrides": {"text_config": {"head_dim": 128}}, "quantization": None}) == [
        "--enforce-eager", "--no-enable-prefix-caching", "--seed", "0",
        "--limit-mm-per-prompt", '{"image": 1}', "--logits-processors", "a:B", "c:D",
        "--hf-overrides", '{"text_config": {"head_dim": 128}}']


def test_head_dim_guard_for_the_server() -> None:
    """DeepSeek-OCR-2's language model has no head_dim (transformers 5 then says 0, which
    crashes vLLM 0.24 on a GPU): the server gets hidden_size // heads through
    --hf-overrides. A model with its own head_dim, or with MLA, gets nothing."""
    ocr2 = {"language_config": {"hidden_size": 1280, "num_attention_heads": 10,
                                "qk_rope_head_dim": 0, "kv_lora_rank": None}}
    assert head_dim_overrides(ocr2) == {"text_config": {"head_dim": 128}}
    assert head_dim_overrides({"text_config": {"hidden_size": 1280, "num_attention_heads": 10,
                                               "head_dim": 64}}) == {}
    assert head_dim_overrides({"language_config": {"hidden_size": 1280,
                                                   "num_attention_heads": 10,
                                                   "kv_lora_rank": 512}}) == {}
    assert head_dim_overrides(None) == {}


def test_server_arguments_follow_the_recipe_and_the_config() -> None:
    cfg = EngineConfig.model_validate({
        "kind": "vllm", "model": "deepseek-ai/DeepSeek-OCR-2",
        "vllm": {"api_servers": 4, "max_num_seqs": 256, "gpu_memory_utilization": 0.8,
                 "engine_args": {"enforce_eager": True,
                                 "hf_overrides": {"text_config": {"rope_theta": 1.0}}}}})
    args = server_args(cfg, 8123, 4, {"text_config": {"head_dim": 128}})
    assert args[:2] == ["serve", "deepseek-ai/DeepSeek-OCR-2"]
    flags = {a: args[i + 1] for i, a in enumerate(args[:-1])
             if a.startswith("--") and not args[i + 1].startswith("--")}
    assert flags["--api-server-count"] == "4" and flags["--port"] == "8123"
    assert flags["--host"] == "127.0.0.1"
    assert flags["--served-model-name"] == "deepseek-ai/DeepSeek-OCR-2"
    assert flags["--max-num-seqs"] == "256" and flags["--gpu-memory-utilization"] == "0.8"
    assert flags["--mm-processor-cache-gb"] == "0"
    assert flags["--max-num-batched-tokens"] == "16384"
    assert args[args.index("--logits-processors") + 1] == NGRAM_PROCESSOR
    assert "--no-enable-prefix-caching" in args and "--enforce-eager" in args
    # the guard and the user's own overrides, merged
    assert json.loads(args[args.index("--hf-overrides") + 1]) == {
        "text_config": {"head_dim": 128, "rope_theta": 1.0}}


def test_create_engine_picks_the_engine_the_mode_names() -> None:
    one = EngineConfig.model_validate({"kind": "vllm", "vllm": {"mode": "inprocess"}})
    several = EngineConfig.model_validate({"kind": "vllm", "vllm": {
        "mode": "managed", "api_servers": 3, "max_num_seqs": 100}})
    assert isinstance(create_engine(one), VllmEngine)
    engine = create_engine(several)
    assert isinstance(engine, ManagedServerEngine)
    assert engine.kind == "vllm" and engine.api_servers == 3
    # the scheduler keeps the batch full plus a few pages per front end in preparation
    assert engine.max_concurrency > 100


# ---- with a real `vllm serve` -------------------------------------------------------------

@pytest.mark.vllm
def test_managed_server_converts_restarts_and_closes(
        tiny_config: Callable[..., EngineConfig], vllm_env: dict[str, str],
        model_dir: Path) -> None:
    cfg = managed_config(tiny_config, max_tokens=16)

    async def run() -> tuple[ManagedServerEngine, dict[str, Any]]:
        engine = ManagedServerEngine(cfg)
        facts: dict[str, Any] = {}
        t0 = time.monotonic()
        await engine.start()
        facts["start_s"] = time.monotonic() - t0
        try:
            facts["healthy"] = await engine.health()
            facts["fast_encoder"] = engine.describe()["fast_encoder"]
            facts["first"] = await asyncio.gather(*(engine.ocr(noise(i)) for i in range(4)))
            first_server = engine.pgids[-1]
            facts["first_family"] = session_members([first_server])
            # the server dies (all of it, as when the OOM killer strikes) ...
            os.killpg(first_server, signal.SIGKILL)
            t0 = time.monotonic()
            # ... and a page sent now waits until the supervisor has it running again
            facts["after"], facts["waits"] = await convert_waiting(engine, noise(10))
            facts["outage_s"] = time.monotonic() - t0
            facts["healthy_again"] = await engine.health()
            facts["more"] = await asyncio.gather(*(engine.ocr(noise(20 + i)) for i in range(2)))
        finally:
            await engine.close()
        facts["health_closed"] = await engine.health()
        return engine, facts

    engine, facts = asyncio.run(run())
    # the server's engine core built ocrd's fast-encoder model (the plugin, via pip)
    assert facts["fast_encoder"] is True
    print(f"\nvllm serve x{API_SERVERS}: ready after {facts['start_s']:.1f} s; killed, "
          f"a page waited {facts['outage_s']:.1f} s ({facts['waits']} x unavailable); "
          f"server starts: {[round(s, 1) for s in engine.start_seconds]} s")
    from transformers import AutoTokenizer

    text_tokens = len(AutoTokenizer.from_pretrained(str(model_dir))(
        PROMPTS["markdown"]).input_ids) - 1
    assert facts["healthy"] is True
    pages = facts["first"] + [facts["after"]] + facts["more"]
    assert all(p.tokens and p.prompt_tokens == text_tokens + 257 for p in pages)
    assert all(p.extra["engine"] == "vllm" and p.extra["api_servers"] == API_SERVERS
               for p in pages)
    # two front ends (plus the engine core and the process that started them)
    assert len(facts["first_family"]) >= API_SERVERS + 2
    # the page waited (was not failed) and went through once the server was back
    assert facts["waits"] >= 1 and facts["after"].tokens
    assert engine.restarts == 1 and len(engine.pgids) == 2
    assert facts["healthy_again"] is True and facts["health_closed"] is False
    # close(): nothing left of either server
    assert session_members(engine.pgids) == []
    assert not any(group_alive(pgid) for pgid in engine.pgids)


class ServerLines:
    """Stands in for the supervisor's logger (ocrd/engines/vllm/supervised.py): keeps every
    line the servers printed, as ocrd relays them (event vllm_server)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, event: str, **fields: Any) -> None:
        if event == "vllm_server":
            self.lines.append(fields["line"])

    def warning(self, event: str, **fields: Any) -> None:
        pass

    error = warning

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)


def post(url: str) -> dict[str, Any]:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


async def until(condition: Callable[[], bool], what: str, lines: ServerLines,
                seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what}:\n" + "\n".join(lines.lines[-20:])
        await asyncio.sleep(0.05)


ADDED = "Added request"  # vLLM's front end, with --enable-log-requests


async def receipt_behind_a_manual(engine: ManagedServerEngine, lines: ServerLines,
                                  n: int) -> list[str]:
    """n pages of one document (priority n: none done yet, as the daemon numbers them)
    reach the server's queue while it schedules nothing (dev mode's POST /pause?mode=keep);
    then a one-page document (priority 1). The server resumes once it holds all of
    them. Returns the order in which they finished.

    Deterministic: the server has one front end, which logs ADDED after it handed a
    request to the engine core, and /resume reaches the engine core through that front
    end's connection behind them (vLLM's engine core takes a front end's messages in
    order): so every page is in the engine core's queue before it schedules any."""
    base = engine.url.removesuffix("/v1")
    assert (await asyncio.to_thread(post, f"{base}/pause?mode=keep&clear_cache=false")
            == {"status": "paused"})
    done: list[str] = []

    async def page(req: PageRequest, name: str) -> PageOutput:
        out = await engine.ocr(req)
        done.append(name)
        return out

    tasks = [asyncio.create_task(page(replace(noise(100 + i), doc_id="manual", priority=n),
                                      f"manual{i}")) for i in range(n)]
    await until(lambda: lines.count(ADDED) == n, f"{n} pages at the server", lines)
    with urllib.request.urlopen(f"{base}/is_paused", timeout=30) as resp:
        assert json.loads(resp.read()) == {"is_paused": True}
    tasks.append(asyncio.create_task(page(replace(noise(99), doc_id="receipt", priority=1),
                                          "receipt")))
    await until(lambda: lines.count(ADDED) == n + 1, "receipt at the server", lines)
    assert (await asyncio.to_thread(post, f"{base}/resume")) == {"status": "resumed"}
    outs = await asyncio.gather(*tasks)
    assert {o.finish_reason for o in outs} == {"length"}
    assert {o.tokens for o in outs} == {engine.cfg.max_tokens}
    return done


@pytest.mark.vllm
@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_a_receipt_is_not_queued_behind_a_manual(
        tiny_config: Callable[..., EngineConfig], vllm_env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    """ocrd's default: managed servers run --scheduling-policy priority and each page
    carries its document's pages not yet done. 16 pages of a manual queue at a real
    `vllm serve` (batch of 4), a one-page receipt arrives behind them: it goes into the
    first batch and the manual's other 12 pages finish after it. With engine_args
    scheduling_policy: fcfs (ocrd then sends no priority) the receipt waits for all 16:
    the same check fails, which shows that the order is the priority's doing."""
    n = 16
    args = {"enable_log_requests": True}
    if policy == "fcfs":
        args["scheduling_policy"] = "fcfs"
    cfg = tiny_config(engine_args=args, max_tokens=16, loop_retries=0)
    # the server takes the whole manual and the receipt (not held back in ocrd)
    cfg = cfg.model_copy(update={"vllm": cfg.vllm.model_copy(
        update={"api_servers": 1, "queue_per_server": n + 1 - cfg.vllm.max_num_seqs})})
    lines = ServerLines()
    monkeypatch.setattr(supervised, "log", lines)

    async def run() -> list[str]:
        engine = ManagedServerEngine(cfg, env={"VLLM_SERVER_DEV_MODE": "1"})
        await engine.start()
        try:
            assert engine.api_servers == 1 and engine.max_concurrency >= n + 1
            return await receipt_behind_a_manual(engine, lines, n)
        finally:
            await engine.close()

    done = asyncio.run(run())
    print(f"\n{policy}: finished in the order {done}")
    assert sorted(done) == sorted(["receipt"] + [f"manual{i}" for i in range(n)])
    after = len(done) - 1 - done.index("receipt")
    if policy == "priority":  # in the first batch of 4: the other 12 finish after it
        assert after >= n - cfg.vllm.max_num_seqs
    else:  # first come, first served: in the last batch
        assert after < cfg.vllm.max_num_seqs


KILLED_PARENT = """
import asyncio, json, os, sys
from ocrd.config.settings import EngineConfig
from ocrd.engines.vllm.managed import ManagedServerEngine

async def main():
    engine = ManagedServerEngine(EngineConfig.model_validate_json(sys.argv[1]))
    await engine.start()
    print("SERVER", json.dumps({"server": engine.pgids[-1]}), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.vllm
def test_server_stops_when_ocrd_is_killed(
        tiny_config: Callable[..., EngineConfig], vllm_env: dict[str, str],
        tmp_path: Path) -> None:
    """SIGKILL gives ocrd no chance to close(): the server must go by itself (it is told
    when its parent dies) instead of holding the GPU as an orphan."""
    cfg = managed_config(tiny_config)
    log = tmp_path / "ocrd.service.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", KILLED_PARENT, cfg.model_dump_json()],
                                stdout=out, stderr=subprocess.STDOUT, env=vllm_env,
                                start_new_session=True)
    server = None
    try:
        deadline = time.monotonic() + 240
        while server is None and proc.poll() is None and time.monotonic() < deadline:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("SERVER "):
                    server = json.loads(line.removeprefix("SERVER "))["server"]
            time.sleep(0.2)
        assert server is not None, log.read_text(errors="replace")[-3000:]
        assert session_members([server]), "the server is running"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 60
        while session_members([server]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert session_members([server]) == [], "the server outlived ocrd"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if server is not None:  # never leave it running, whatever the test found
            for pid in session_members([server]):
                os.kill(int(pid), signal.SIGKILL)


@pytest.mark.vllm
def test_a_real_engine_core_sizes_its_memory_inside_the_start_gate(
        model_dir: Path, vllm_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ocrd's plugin in a real `vllm serve` (CPU build) told of a start gate
    (ocrd/vllm_model/start_gate.py) that another engine holds (here: the test): its
    engine core waits before it sets up its device, takes the gate once it is free, and
    gives it back only after its KV cache is allocated and the model warmed up; then it
    serves, and the gate is free for the next."""
    from serve import VllmServer

    lock = tmp_path / "gpus-0.lock"
    monkeypatch.setenv(START_LOCK_ENV, str(lock))
    # the server's INFO lines, as the managed engine asks for them (a test before this one
    # may have run ocrd's logging set-up, which turns vLLM's off for its own process)
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "1")
    server = VllmServer(model_dir, tmp_path / "server.log")
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # another engine on this GPU is sizing its memory
    server.start()
    try:
        deadline = time.monotonic() + 240
        while WAITING_MARK not in server.log_path.read_text(errors="replace"):
            assert server.proc is not None and server.proc.poll() is None, server.log_tail()
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.2)
        time.sleep(2.0)  # whatever it does now, it does while the gate is held
        waiting = server.log_path.read_text(errors="replace")
        assert TAKEN_MARK not in waiting and "KV cache size" not in waiting
        assert "init engine" not in waiting, server.log_tail()
        with pytest.raises(OSError):  # no answer while its engine core waits
            urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=2)
        os.close(held)  # the other engine is through
        held = -1
        server.wait_ready()
        lines = server.log_path.read_text(errors="replace").splitlines()

        def first(text: str) -> int:
            return next(i for i, line in enumerate(lines) if text in line)

        assert (first(WAITING_MARK) < first(TAKEN_MARK) < first("KV cache size")
                < first("init engine") < first(RELEASED_MARK)), server.log_tail()
        # free again while the server runs
        probe = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(probe)
        with urllib.request.urlopen(server.url + "/models", timeout=10) as r:
            assert r.status == 200
    finally:
        server.stop()
        if held >= 0:
            os.close(held)
