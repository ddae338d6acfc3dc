"""Several managed `vllm serve` processes (engine.vllm.servers_per_gpu, engine.vllm.gpus):
the plan (ports, devices, shares of memory and front ends), the configuration's checks,
and the supervision, with a fake `vllm serve` executable (tests/fake_vllm_serve.py: the
real CLI's flags, a start-up delay, a page's time, a concurrency limit, child processes
in its group that ignore SIGTERM) that the tests kill: the other server keeps converting,
the killed one is started again, no page fails, and nothing is left after close().
tests/vllm_engine/test_managed_server.py runs one real `vllm serve` (CPU build).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from PIL import Image

from ocrd.config.settings import ConfigError, EngineConfig
from ocrd.engines import create_engine
from ocrd.engines.base import PageRequest
from ocrd.engines.vllm import supervised
from ocrd.engines.vllm.managed import ManagedServerEngine, plan_servers, server_args
from ocrd.engines.vllm.supervised import group_alive
from ocrd.errors import EngineDead, EngineUnavailable
from ocrd.outputs.page import PageOutput
from ocrd.pipeline.pages import EngineGate
from ocrd.vllm_model import plugin, start_gate

FAKE = [sys.executable, str(Path(__file__).parents[1] / "fake_vllm_serve.py")]
MODEL = "deepseek-ai/DeepSeek-OCR-2"


def engine_config(model: str = MODEL, **vllm: Any) -> EngineConfig:
    return EngineConfig.model_validate({
        "kind": "vllm", "model": model, "max_tokens": 64, "loop_retries": 0,
        "vllm": {"max_num_seqs": 4, "mode": "managed", **vllm}})


def flags(args: list[str]) -> dict[str, str]:
    return {a: args[i + 1] for i, a in enumerate(args[:-1])
            if a.startswith("--") and not args[i + 1].startswith("--")}


def page(n: int) -> PageRequest:
    return PageRequest(image=Image.new("RGB", (64, 80), (n % 256, 255, 255)), page_no=n,
                       doc_id=f"doc{n}")


def alive(pids: list[int]) -> list[int]:
    """Those of pids that are still running (zombies aside)."""
    left = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.append(pid)
    return left


def recorded(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


async def all_up(engine: ManagedServerEngine) -> None:
    """Until every server answers (the engine is ready with the first; the others join)."""
    while not all(s.up for s in engine.servers):
        await asyncio.sleep(0.05)


async def convert_waiting(engine: ManagedServerEngine, p: PageRequest) -> PageOutput:
    """As the daemon does: a page that meets EngineUnavailable waits at the engine gate
    (which polls health()) and is sent again; any other error fails it."""
    gate = EngineGate(engine)
    while True:
        await gate.open.wait()
        try:
            return await engine.ocr(p)
        except EngineUnavailable as e:
            await gate.wait(e)


@pytest.fixture
def model(tmp_path: Path) -> str:
    """A local model folder with DeepSeek-OCR-2's language config (no head_dim)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"language_config": {
        "hidden_size": 1280, "num_attention_heads": 10, "qk_rope_head_dim": 0}}))
    return str(folder)


@pytest.fixture
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    # the fake's children ignore SIGTERM: SIGKILL comes after this long (30 s in service)
    monkeypatch.setattr(supervised, "STOP_TIMEOUT_SECONDS", 3.0)
    record = tmp_path / "servers"
    record.mkdir()
    return {"FAKE_VLLM_RECORD": str(record), "FAKE_VLLM_START_SECONDS": "0.5",
            "FAKE_VLLM_LATENCY": "0.2", "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
            "HF_HUB_OFFLINE": "1"}


# ---- the plan and the configuration -----------------------------------------------------

def test_servers_per_gpu_and_gpus_split_memory_front_ends_and_devices() -> None:
    cfg = engine_config(gpus=[0, 1], servers_per_gpu=2, api_servers=8,
                        gpu_memory_utilization=0.9, server_port=9100)
    specs = plan_servers(cfg)
    assert [s.devices for s in specs] == ["0", "0", "1", "1"]
    assert [s.port for s in specs] == [9100, 9101, 9102, 9103]
    assert {s.api_servers for s in specs} == {4}
    assert {s.gpu_memory_utilization for s in specs} == {0.45}
    args = flags(server_args(cfg, specs[3].port, specs[3].api_servers, None,
                             specs[3].gpu_memory_utilization))
    assert args["--port"] == "9103" and args["--api-server-count"] == "4"
    assert args["--gpu-memory-utilization"] == "0.45"
    # free ports when none is given, all different
    free = plan_servers(engine_config(servers_per_gpu=3))
    assert len({s.port for s in free}) == 3 and {s.devices for s in free} == {None}
    assert {s.api_servers for s in free} == {1}


def test_the_servers_queue_pages_by_their_priority() -> None:
    """Managed servers order their queues by priority, and ocrd sends each page's
    priority (its document's pages not yet done) (a receipt's page before a manual's queued ones:
    tests/vllm_engine/test_managed_server.py shows it with a real server); engine_args
    naming another policy turn both off."""
    cfg = engine_config(servers_per_gpu=2)
    [spec, _] = plan_servers(cfg)
    assert flags(server_args(cfg, spec.port, spec.api_servers))["--scheduling-policy"] == \
        "priority"
    assert ManagedServerEngine(cfg)._client.send_priority is True
    fcfs = engine_config(servers_per_gpu=2, engine_args={"scheduling_policy": "fcfs"})
    assert flags(server_args(fcfs, spec.port, spec.api_servers))["--scheduling-policy"] == \
        "fcfs"
    assert ManagedServerEngine(fcfs)._client.send_priority is False


def test_data_parallel_in_one_server_spans_its_gpus() -> None:
    """vLLM's own data parallelism: one server over both GPUs, --data-parallel-size 2."""
    cfg = engine_config(gpus=[0, 1], data_parallel_size=2, api_servers=8)
    [spec] = plan_servers(cfg)
    assert spec.devices == "0,1" and spec.api_servers == 8
    args = flags(server_args(cfg, spec.port, spec.api_servers))
    assert args["--data-parallel-size"] == "2" and args["--tensor-parallel-size"] == "1"


@pytest.mark.e2e
def test_config_checks_and_the_engine_chosen(tmp_path: Path) -> None:
    # the mode is a choice, never inferred from other keys
    assert isinstance(create_engine(engine_config()), ManagedServerEngine)
    for managed in ({"servers_per_gpu": 2}, {"gpus": [1]}, {"api_servers": 2}):
        with pytest.raises(ValueError, match=f"{next(iter(managed))} .* needs mode: managed"):
            engine_config(mode="inprocess", **managed)
        # no mode set: the profile's (no GPU here: in-process), which cannot take the key
        with pytest.raises(ConfigError, match="needs mode: managed"):
            create_engine(engine_config(mode=None, **managed))
    engine = create_engine(engine_config(servers_per_gpu=2, api_servers=8, max_num_seqs=100))
    # every server's batch full plus a few pages per front end, on each server
    assert engine.max_concurrency == 2 * (100 + 4 * 4)
    # or a queue of the config's size: a whole batch prepared ahead
    deep = create_engine(engine_config(servers_per_gpu=2, api_servers=8, max_num_seqs=100,
                                       queue_per_server=100))
    assert deep.max_concurrency == 2 * (100 + 100)
    for bad, words in (({"gpus": [0, 0]}, "each device once"),
                       ({"gpus": [0, 1, 2], "data_parallel_size": 2}, "do not split"),
                       ({"server_port": 65535, "servers_per_gpu": 2}, "pass 65535")):
        with pytest.raises(ValueError, match=words):
            engine_config(**bad)
    # and check-config says so
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"engine": {"kind": "vllm", "vllm": {"gpus": [0, 1, 2],
                                                                       "data_parallel_size": 2}},
                                    "inboxes": [{"path": str(tmp_path / "in"),
                                                 "outbox": str(tmp_path / "out")}]}))
    res = subprocess.run([sys.executable, "-m", "ocrd", "check-config", "-c", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "do not split" in res.stdout + res.stderr


# ---- supervision, with the fake server ------------------------------------------------

def test_a_killed_server_is_restarted_while_the_other_converts(
        fake_env: dict[str, str], model: str, tmp_path: Path) -> None:
    cfg = engine_config(model, servers_per_gpu=2, api_servers=4, gpus=[3])
    record = tmp_path / "servers"

    async def run() -> tuple[ManagedServerEngine, dict[str, Any]]:
        engine = ManagedServerEngine(cfg, env=fake_env, program=FAKE)
        facts: dict[str, Any] = {}
        await engine.start()
        try:
            facts["health"] = await engine.health()
            facts["servers_at_start"] = recorded(record)
            first, second = engine.servers
            done: list[tuple[float, str]] = []

            async def one(n: int) -> PageOutput:
                out = await convert_waiting(engine, page(n))
                done.append((time.monotonic(), out.extra["server"]))
                return out

            tasks = [asyncio.create_task(one(n)) for n in range(60)]
            while len(done) < 10:
                await asyncio.sleep(0.05)
            facts["killed_pgid"] = first.proc.pid
            facts["killed_at"] = time.monotonic()
            os.killpg(first.proc.pid, signal.SIGKILL)  # the whole server, as the OOM killer
            facts["pages"] = await asyncio.gather(*tasks)
            facts["done"] = done
            while first.restarts < 1 or not first.up:
                await asyncio.sleep(0.05)
            facts["back_at"] = time.monotonic()
            # pages go to the restarted server again (once the client stops avoiding it)
            later: list[PageOutput] = []
            while first.url not in {p.extra["server"] for p in later}:
                later += await asyncio.gather(*(convert_waiting(engine, page(100 + i))
                                                for i in range(8)))
            facts["later"] = later
            facts["second_pgids"] = list(second.pgids)
        finally:
            await engine.close()
        facts["health_closed"] = await engine.health()
        return engine, facts

    engine, facts = asyncio.run(asyncio.wait_for(run(), 120))
    first, second = engine.servers
    # both servers on device 3, half the memory and half the front ends each
    assert len(facts["servers_at_start"]) == 2 and facts["health"] is True
    for rec in facts["servers_at_start"]:
        assert rec["cuda"] == "3"
        f = flags(rec["argv"])
        assert rec["argv"][:2] == ["serve", model] and f["--served-model-name"] == model
        assert f["--api-server-count"] == "2" and f["--gpu-memory-utilization"] == "0.45"
        assert json.loads(f["--hf-overrides"]) == {"text_config": {"head_dim": 128}}
    # no page failed: all 60 came back with text, from both servers
    assert len(facts["pages"]) == 60 and all(p.text for p in facts["pages"])
    assert {s for _, s in facts["done"]} == {first.url, second.url}
    # while the killed one was down, the other kept converting
    assert any(facts["killed_at"] < t < facts["back_at"] and s == second.url
               for t, s in facts["done"])
    # the killed one (only it) was started again, in a new process group, and serves
    assert first.restarts == 1 and second.restarts == 0
    assert len(first.pgids) == 2 and facts["killed_pgid"] == first.pgids[0]
    assert facts["second_pgids"] == second.pgids and len(second.pgids) == 1
    assert first.url in {p.extra["server"] for p in facts["later"]}
    # close(): nothing left of any server, children that ignore SIGTERM included
    assert facts["health_closed"] is False
    assert not any(group_alive(pgid) for pgid in engine.pgids)
    children = [pid for rec in recorded(tmp_path / "servers") for pid in rec["children"]]
    assert len(children) == 3 * 3 and alive(children) == []


def test_every_server_gets_ocrds_vllm_environment(fake_env: dict[str, str], model: str,
                                                  tmp_path: Path) -> None:
    """Each server's environment says how ocrd's plugin builds the model: the fast
    encoder (batched on a GPU) with uint8 page views by default, vLLM's own code when
    fast_encoder is off; servers sharing a GPU get its start gate, a lone one none."""
    async def run(cfg: EngineConfig) -> list[dict[str, str]]:
        for f in (tmp_path / "servers").glob("*.json"):
            f.unlink()
        engine = ManagedServerEngine(cfg, env=fake_env, program=FAKE)
        await engine.start()
        await engine.close()
        return [rec["env"] for rec in recorded(tmp_path / "servers")]

    ours = asyncio.run(asyncio.wait_for(run(engine_config(model, servers_per_gpu=2)), 60))
    # the two share a GPU: one start gate for both
    locks = [env.pop(plugin.START_LOCK_ENV) for env in ours]
    assert locks[0] == locks[1] and Path(locks[0]).name == "gpus-all.lock"
    assert ours == [{plugin.ENV: "auto", plugin.PIXELS_ENV: "uint8"}] * 2
    off = asyncio.run(asyncio.wait_for(run(engine_config(model, fast_encoder=False)), 60))
    assert off == [{plugin.ENV: "0", plugin.PIXELS_ENV: "float"}]


def test_a_server_that_fails_before_any_answers_fails_the_start(
        fake_env: dict[str, str], model: str, tmp_path: Path) -> None:
    """One server per GPU; the one on device 1 cannot start, the one on device 0 is still
    loading: start() fails (EngineDead with its output) and the one on device 0 is
    stopped, nothing left running."""
    cfg = engine_config(model, gpus=[0, 1])
    env = {**fake_env, "FAKE_VLLM_EXIT_ON_DEVICE": "1",
           "FAKE_VLLM_HOLD_DEVICE": f"0={tmp_path / 'never'}"}

    async def run() -> ManagedServerEngine:
        engine = ManagedServerEngine(cfg, env=env, program=FAKE)
        with pytest.raises(EngineDead, match="gpu1.1.*exited with code 3"):
            await engine.start()
        return engine

    engine = asyncio.run(asyncio.wait_for(run(), 60))
    assert len(engine.pgids) == 2
    assert not any(group_alive(pgid) for pgid in engine.pgids)
    children = [pid for rec in recorded(tmp_path / "servers") for pid in rec["children"]]
    assert children and alive(children) == []


def test_ready_with_the_first_server_and_the_others_join(
        fake_env: dict[str, str], model: str, tmp_path: Path) -> None:
    """One server per GPU, the one on device 1 still loading: start() returns once the
    one on device 0 answers and pages convert on it; when the other answers, pages go to
    it at once (not after the back-off its refused probes earned), and close() stops both,
    the one still loading too."""
    cfg = engine_config(model, gpus=[0, 1])
    loaded = tmp_path / "loaded"
    env = {**fake_env, "FAKE_VLLM_HOLD_DEVICE": f"1={loaded}"}

    async def run() -> tuple[ManagedServerEngine, dict[str, Any]]:
        engine = ManagedServerEngine(cfg, env=env, program=FAKE)
        facts: dict[str, Any] = {}
        await engine.start()
        try:
            facts["up_at_start"] = [s.up for s in engine.servers]
            with structlog.testing.capture_logs() as logs:
                first = await asyncio.gather(*(engine.ocr(page(n)) for n in range(8)))
            # none was sent to the server still loading, to be refused and sent again
            facts["refused"] = [e for e in logs if e["event"] == "remote_request_failed"
                                and e["url"] == engine.specs[1].url]
            facts["first"] = ([len(first)], {s.url: s.pages for s in engine._client.servers})
            # the client has tried the loading server meanwhile: it is down for a while
            await engine.health()
            await engine.health()
            loaded.touch()
            while not engine.servers[1].up:
                await asyncio.sleep(0.05)
            facts["supervised"] = len(engine._supervisors)
            await asyncio.gather(*(engine.ocr(page(n)) for n in range(8, 16)))
            facts["after"] = {s.url: s.pages for s in engine._client.servers}
        finally:
            await engine.close()
        return engine, facts

    engine, facts = asyncio.run(asyncio.wait_for(run(), 90))
    zero, one = (s.url for s in engine.specs)
    assert facts["up_at_start"] == [True, False]
    assert facts["first"] == ([8], {zero: 8, one: 0}) and facts["refused"] == []
    assert facts["supervised"] == 2
    assert facts["after"][one] > 0 and sum(facts["after"].values()) == 16
    assert engine.restarts == 0
    assert not any(group_alive(pgid) for pgid in engine.pgids)


def test_a_server_that_fails_after_another_answers_is_started_again(
        fake_env: dict[str, str], model: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The server on device 1 fails its first start after the one on device 0 answers:
    the engine keeps converting on device 0, device 1's server is started again, as a
    server that died, and joins."""
    monkeypatch.setattr(supervised, "RESTART_BACKOFF_SECONDS", 0.2)
    cfg = engine_config(model, gpus=[0, 1])
    loaded = tmp_path / "loaded"
    env = {**fake_env, "FAKE_VLLM_HOLD_DEVICE": f"1={loaded}", "FAKE_VLLM_EXIT_ON_DEVICE": "1",
           "FAKE_VLLM_EXIT_ONCE_FILE": str(tmp_path / "failed-once")}

    async def run() -> tuple[ManagedServerEngine, dict[str, Any]]:
        engine = ManagedServerEngine(cfg, env=env, program=FAKE)
        facts: dict[str, Any] = {}
        await engine.start()
        try:
            # device 1's fake exits before its hold (the first time)
            while engine.restarts == 0:
                await asyncio.sleep(0.05)
            facts["converting"] = len(await asyncio.gather(
                *(engine.ocr(page(n)) for n in range(4))))
            loaded.touch()
            while not engine.servers[1].up:
                await asyncio.sleep(0.05)
            facts["health"] = await engine.health()
        finally:
            await engine.close()
        return engine, facts

    engine, facts = asyncio.run(asyncio.wait_for(run(), 90))
    assert facts == {"converting": 4, "health": True}
    assert engine.restarts == 1 and engine.servers[1].dead is None
    assert not any(group_alive(pgid) for pgid in engine.pgids)


def gate_lines(path: Path) -> dict[str, list[tuple[str, str]]]:
    """The fakes' gate log: (what, pid) per lock file, in the order they happened."""
    out: dict[str, list[tuple[str, str]]] = {}
    for line in path.read_text().splitlines():
        what, pid, lock = line.split(" ", 2)
        out.setdefault(lock, []).append((what, pid))
    return out


def test_servers_sharing_a_gpu_start_at_once_and_size_their_memory_in_turn(
        fake_env: dict[str, str], model: str, tmp_path: Path) -> None:
    """Two servers on each of two GPUs, through the start gate: all four start at once
    (each fake keeps the gate until the other of its GPU has arrived at it, which only
    a server started meanwhile does), the two of a GPU size their memory one after the
    other (never both inside the gate), the two GPUs' gates are separate files in a
    private folder, and close() removes that folder."""
    cfg = engine_config(model, servers_per_gpu=2, api_servers=2, gpus=[0, 1])
    gate_log = tmp_path / "gate.log"
    env = {**fake_env, "FAKE_VLLM_GATE_LOG": str(gate_log), "FAKE_VLLM_GATE_HOLD_FOR": "2",
           "FAKE_VLLM_SIZING_SECONDS": "0.2"}

    async def run() -> tuple[ManagedServerEngine, dict[str, Any]]:
        engine = ManagedServerEngine(cfg, env=env, program=FAKE, start_gate=True)
        facts: dict[str, Any] = {}
        await engine.start()
        try:
            await all_up(engine)
            facts["locks"] = [s.env.get("OCRD_VLLM_START_LOCK") for s in engine.servers]
            facts["ready_timeout"] = {s.env.get("VLLM_ENGINE_READY_TIMEOUT_S")
                                      for s in engine.servers}
            facts["taken"] = [s.gate_taken for s in engine.servers]
            facts["gate_dir_mode"] = os.stat(Path(facts["locks"][0]).parent).st_mode & 0o777
            facts["pages"] = await asyncio.gather(*(engine.ocr(page(n)) for n in range(8)))
        finally:
            await engine.close()
        return engine, facts

    engine, facts = asyncio.run(asyncio.wait_for(run(), 120))
    locks = facts["locks"]
    assert locks[0] == locks[1] and locks[2] == locks[3] and locks[0] != locks[2]
    assert Path(locks[0]).name == "gpus-0.lock" and Path(locks[2]).name == "gpus-1.lock"
    assert facts["gate_dir_mode"] == 0o700 and not Path(locks[0]).parent.exists()
    assert facts["ready_timeout"] == {"1800"}
    assert facts["taken"] == [True] * 4
    assert len(facts["pages"]) == 8 and all(p.text for p in facts["pages"])
    events = gate_lines(gate_log)
    assert sorted(events) == sorted({locks[0], locks[2]})
    for seq in events.values():
        whats = [w for w, _ in seq]
        # both arrived before the first was through (they started together) ...
        assert whats.count("arrived") == 2, seq
        assert max(i for i, w in enumerate(whats) if w == "arrived") < whats.index(
            "released"), seq
        # ... and passed one after the other, never both inside
        turns = [(w, pid) for w, pid in seq if w != "arrived"]
        assert [w for w, _ in turns] == ["taken", "released", "taken", "released"], seq
        assert turns[0][1] == turns[1][1] != turns[2][1] == turns[3][1], seq
    assert engine.restarts == 0


def test_without_the_gate_servers_sharing_a_gpu_start_one_after_another(
        fake_env: dict[str, str], model: str, tmp_path: Path) -> None:
    """Where vLLM may not find ocrd's plugin (start_gate False) the second server of a
    GPU starts only when the first is ready, and no server is told of a gate; vLLM's own
    data parallelism (engine cores that set up their devices together) never gates."""
    cfg = engine_config(model, servers_per_gpu=2, api_servers=2, gpus=[0])

    async def run() -> ManagedServerEngine:
        engine = ManagedServerEngine(cfg, env=fake_env, program=FAKE, start_gate=False)
        await engine.start()
        await all_up(engine)
        await engine.close()
        return engine

    engine = asyncio.run(asyncio.wait_for(run(), 60))
    assert all("OCRD_VLLM_START_LOCK" not in s.env for s in engine.servers)
    first, second = sorted(recorded(tmp_path / "servers"), key=lambda r: r["started"])
    # the second server's process began once the first was up: not before the first had
    # slept its start-up time (FAKE_VLLM_START_SECONDS)
    assert second["started"] >= first["started"] + 0.5
    dp = engine_config(model, gpus=[0, 1], data_parallel_size=2, api_servers=2)
    assert ManagedServerEngine(dp).start_gate is False


def test_a_start_gate_whose_holder_dies_opens_for_the_next(tmp_path: Path) -> None:
    """The gate is a lock the kernel drops with its holder: an engine core killed while
    sizing its memory never blocks the servers after it."""
    lock = tmp_path / "gpus-0.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from ocrd.vllm_model import start_gate; "
        f"start_gate.take({str(lock)!r}); print('held', flush=True); time.sleep(600)")],
        stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        blocked = os.open(lock, os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(blocked, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(blocked)
    finally:
        holder.kill()
        holder.wait()
    start_gate.take(str(lock))  # would wait forever if the dead holder still had it
    try:
        assert start_gate._held.get("fd") is not None
    finally:
        start_gate.release()
    assert "fd" not in start_gate._held
    # a link in the gate's place is not followed
    (tmp_path / "elsewhere").write_text("")
    os.symlink(tmp_path / "elsewhere", tmp_path / "link.lock")
    with pytest.raises(OSError):
        start_gate.take(str(tmp_path / "link.lock"))
    assert "fd" not in start_gate._held


def test_a_server_whose_children_outlive_it_is_noticed_and_cleared(
        fake_env: dict[str, str], model: str, tmp_path: Path) -> None:
    """Only the server's main process dies; its front ends and engine core live on,
    ignore SIGTERM and hold its output pipe (asyncio's wait() waits for that pipe's end):
    the supervisor sees the death by the exit status, ends the leftovers (SIGKILL) and
    starts the server again, which then converts."""
    cfg = engine_config(model, api_servers=2)

    async def run() -> tuple[ManagedServerEngine, list[int], list[PageOutput]]:
        engine = ManagedServerEngine(cfg, env=fake_env, program=FAKE)
        await engine.start()
        try:
            [server] = engine.servers
            [rec] = recorded(tmp_path / "servers")
            os.kill(server.proc.pid, signal.SIGKILL)  # the main process alone
            while server.restarts < 1 or not server.up:
                await asyncio.sleep(0.05)
            pages = await asyncio.gather(*(convert_waiting(engine, page(i)) for i in range(4)))
        finally:
            await engine.close()
        return engine, rec["children"], pages

    engine, first_children, pages = asyncio.run(asyncio.wait_for(run(), 60))
    assert engine.restarts == 1 and all(p.text for p in pages)
    assert alive(first_children) == []
    assert not any(group_alive(pgid) for pgid in engine.pgids)


# ---- CUDA MPS for the servers of a GPU (ocrd/engines/vllm/mps.py) ------------------------------

FAKE_MPS = [sys.executable, str(Path(__file__).parents[1] / "fake_mps_control.py")]


@pytest.fixture
def mps_env(fake_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    (tmp_path / "mps").mkdir()
    return {**fake_env, "FAKE_MPS_RECORD": str(tmp_path / "mps")}


def test_servers_sharing_a_gpu_run_under_one_mps_daemon_per_gpu(
        mps_env: dict[str, str], model: str, tmp_path: Path) -> None:
    """By default (mps null) two servers on each of two GPUs: one MPS control daemon per
    GPU, started with that GPU as its CUDA_VISIBLE_DEVICES and a private pipe folder;
    each server gets that folder and no CUDA_VISIBLE_DEVICES (MPS numbers a client's
    devices from the daemon's), and its engine core is a client of its own GPU's
    daemon. close() quits the daemons after the servers and removes their folders."""
    cfg = engine_config(model, servers_per_gpu=2, api_servers=2, gpus=[0, 1])

    async def run() -> tuple[ManagedServerEngine, dict[str, Any]]:
        engine = ManagedServerEngine(cfg, env=mps_env, program=FAKE, mps_program=FAKE_MPS)
        await engine.start()
        facts: dict[str, Any] = {"describe": engine.describe()}
        try:
            await all_up(engine)
            facts["folders"] = {d: c.folder for d, c in engine.mps.items()}
            facts["modes"] = [os.stat(f).st_mode & 0o777 for f in facts["folders"].values()]
            facts["pipes"] = [s.env.get("CUDA_MPS_PIPE_DIRECTORY") for s in engine.servers]
            facts["controls"] = [pgid for c in engine.mps.values() for pgid in c.pgids]
            facts["server_pids"] = [s.proc.pid for s in engine.servers]
            facts["pages"] = await asyncio.gather(*(engine.ocr(page(n)) for n in range(8)))
        finally:
            await engine.close()
        return engine, facts

    engine, facts = asyncio.run(asyncio.wait_for(run(), 120))
    assert facts["describe"]["mps"] is True
    assert sorted(facts["folders"]) == ["0", "1"] and facts["modes"] == [0o700, 0o700]
    pipe = {d: os.path.join(f, "pipe") for d, f in facts["folders"].items()}
    assert facts["pipes"] == [pipe["0"], pipe["0"], pipe["1"], pipe["1"]]
    daemons = {r["cuda"]: r for r in recorded(tmp_path / "mps")}
    assert sorted(daemons) == ["0", "1"]
    servers = {r["children"][0]: r for r in recorded(tmp_path / "servers")}
    assert len(servers) == 4
    assert all(r["cuda"] is None and r["mps"] is True for r in servers.values())
    pids = facts["server_pids"]
    assert sorted(daemons["0"]["clients"]) == sorted(pids[:2])
    assert sorted(daemons["1"]["clients"]) == sorted(pids[2:])
    assert daemons["0"]["pipe"] == pipe["0"] and daemons["1"]["pipe"] == pipe["1"]
    assert len(facts["pages"]) == 8 and all(p.text for p in facts["pages"])
    assert not any(os.path.exists(f) for f in facts["folders"].values())
    assert not any(group_alive(p) for p in facts["controls"] + engine.pgids)
    assert engine.mps == {}


def test_mps_only_where_servers_share_a_gpu_or_asked_for(
        mps_env: dict[str, str], model: str, tmp_path: Path) -> None:
    """mps null with one server per GPU, and mps false with two: no daemon, each server
    on its CUDA_VISIBLE_DEVICES, time-sliced."""
    async def run(cfg: EngineConfig) -> dict[str, Any]:
        engine = ManagedServerEngine(cfg, env=mps_env, program=FAKE, mps_program=FAKE_MPS)
        await engine.start()
        try:
            await all_up(engine)
            return {"mps": dict(engine.mps), "describe": engine.describe()["mps"],
                    "pages": await asyncio.gather(*(engine.ocr(page(n)) for n in range(2)))}
        finally:
            await engine.close()

    for cfg in (engine_config(model, servers_per_gpu=1, api_servers=2, gpus=[0, 1]),
                engine_config(model, servers_per_gpu=2, api_servers=2, gpus=[1], mps=False)):
        facts = asyncio.run(asyncio.wait_for(run(cfg), 60))
        assert facts["mps"] == {} and facts["describe"] is False
        assert all(p.text for p in facts["pages"])
    assert recorded(tmp_path / "mps") == []
    servers = recorded(tmp_path / "servers")
    assert sorted(r["cuda"] for r in servers) == ["0", "1", "1", "1"]
    assert not any(r["mps"] for r in servers)


def test_an_mps_daemon_that_cannot_start(mps_env: dict[str, str], model: str,
                                         tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The control daemon exits at once (no GPU): with mps null a warning and the
    servers time-sliced, converting; with mps true the engine does not start (EngineDead
    naming the daemon's own words), no server is started and nothing is left."""
    env = {**mps_env, "FAKE_MPS_FAIL": "1"}
    # this test's own temporary folder for the MPS pipes: others running beside it have
    # theirs in the system's
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    async def run(cfg: EngineConfig) -> list[PageOutput]:
        engine = ManagedServerEngine(cfg, env=env, program=FAKE, mps_program=FAKE_MPS)
        await engine.start()
        try:
            assert engine.mps == {}
            await all_up(engine)
            return await asyncio.gather(*(engine.ocr(page(n)) for n in range(2)))
        finally:
            await engine.close()

    with structlog.testing.capture_logs() as logs:
        pages = asyncio.run(asyncio.wait_for(
            run(engine_config(model, servers_per_gpu=2, api_servers=2, gpus=[0])), 60))
    assert all(p.text for p in pages)
    [warning] = [e for e in logs if e["event"] == "vllm_mps_unavailable"]
    assert warning["gpus"] == "0" and "no CUDA-capable device" in warning["error"]
    assert sorted(r["cuda"] for r in recorded(tmp_path / "servers")) == ["0", "0"]

    before = len(recorded(tmp_path / "servers"))
    cfg = engine_config(model, servers_per_gpu=2, api_servers=2, gpus=[0], mps=True)
    with pytest.raises(EngineDead, match="no CUDA-capable device"):
        asyncio.run(asyncio.wait_for(run(cfg), 60))
    assert len(recorded(tmp_path / "servers")) == before
    assert not list(scratch.glob("ocrd-mps-*"))


def test_a_killed_mps_daemon_is_started_again_and_its_servers_too(
        mps_env: dict[str, str], model: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL to the MPS control daemon of the two servers of a GPU while they convert:
    both servers lose their MPS server and exit (the fake's worst case), the supervisors
    start them again, ocrd starts the daemon again in the same folder, and every page
    still converts; close() leaves nothing."""
    cfg = engine_config(model, servers_per_gpu=2, api_servers=2, gpus=[0])

    async def run() -> tuple[ManagedServerEngine, list[PageOutput], int, list[int]]:
        engine = ManagedServerEngine(cfg, env=mps_env, program=FAKE, mps_program=FAKE_MPS)
        await engine.start()
        try:
            control = engine.mps["0"]
            pages = [asyncio.create_task(convert_waiting(engine, page(n)))
                     for n in range(12)]
            await asyncio.sleep(0.3)
            os.killpg(control.pgids[0], signal.SIGKILL)
            done = await asyncio.gather(*pages)
            while control.restarts < 1 or engine.restarts < 2 or not all(
                    s.up for s in engine.servers):
                await asyncio.sleep(0.05)
            done += await asyncio.gather(*(engine.ocr(page(n)) for n in range(12, 16)))
            restarts, pgids = control.restarts, list(control.pgids)
        finally:
            await engine.close()
        return engine, done, restarts, pgids

    engine, pages, restarts, controls = asyncio.run(asyncio.wait_for(run(), 120))
    assert restarts == 1 and len(controls) == 2
    assert engine.restarts >= 2
    assert len(pages) == 16 and all(p.text for p in pages)
    assert not any(group_alive(p) for p in controls + engine.pgids)


def test_an_mps_daemon_stops_when_ocrd_is_killed_outright(tmp_path: Path) -> None:
    """ocrd SIGKILLed (no close(), no systemd to clear its cgroup): its MPS control
    daemon, in a session of its own, gets SIGTERM from the kernel ("die with my parent",
    ocrd/engines/vllm/supervised.py DIE_WITH_PARENT) and exits instead of holding the GPU's
    MPS server as an orphan."""
    script, pid_file = tmp_path / "ocrd_like.py", tmp_path / "control.pid"
    script.write_text(
        "import asyncio, os, sys\n"
        "from ocrd.engines.vllm.mps import MpsControl\n"
        "async def main():\n"
        f"    c = MpsControl(None, dict(os.environ), {FAKE_MPS!r})\n"
        "    await c.start()\n"
        f"    open({str(pid_file)!r} + '.tmp', 'w').write(str(c.proc.pid))\n"
        f"    os.rename({str(pid_file)!r} + '.tmp', {str(pid_file)!r})\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    ocrd = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, env=env)
    pid = 0
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and ocrd.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), f"no control daemon started (ocrd: {ocrd.poll()})"
        pid = int(pid_file.read_text())
        assert group_alive(pid)  # its own session and group, led by it
        os.kill(ocrd.pid, signal.SIGKILL)
        ocrd.wait(30)
        deadline = time.monotonic() + 30
        while group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not group_alive(pid), "the control daemon outlived ocrd"
    finally:
        if ocrd.poll() is None:
            ocrd.kill()
            ocrd.wait()
        if pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
