"""A fake `vllm serve` executable for the managed-server tests: run as
`python fake_vllm_serve.py serve MODEL --port P --api-server-count N ...` in place of
vLLM's CLI, with the flags ocrd gives the real one.

Like the real server it takes a while before it answers /health, answers /v1/models with
its --served-model-name and /v1/chat/completions with vLLM's JSON shapes after a page's
time (tests/fake_vllm.py's FakeVllm: HTTP 503 above its concurrency limit,
requests of clients that hang up are dropped), and runs N front-end processes plus an
engine core as children in its process group. Those children outlive it (as vLLM's may
when their parent is killed), so only ending the whole group leaves nothing behind.

Environment: FAKE_VLLM_START_SECONDS (0.5) before it listens, FAKE_VLLM_LATENCY (0.2 s
a page), FAKE_VLLM_LIMIT (pages at once; default max_num_seqs), FAKE_VLLM_RECORD (a
folder: PID.json with its argv, CUDA_VISIBLE_DEVICES and children, written at start),
FAKE_VLLM_EXIT_ON_DEVICE (exit with code 3 before listening when CUDA_VISIBLE_DEVICES
is this; with FAKE_VLLM_EXIT_ONCE_FILE, only while that file is missing, which the exit
creates), FAKE_VLLM_HOLD_DEVICE (DEVICE=PATH: on that device, still loading until PATH
exists).

Under CUDA MPS (CUDA_MPS_PIPE_DIRECTORY set) its engine core is a client of that MPS
control daemon (tests/fake_mps_control.py), as CUDA makes every process that starts on
a GPU: it connects to the daemon's socket (recorded as "mps" in its PID.json: true, or
false where none listens: CUDA then runs the process without MPS) and exits with an
error when the daemon goes away while it runs (the worst a lost MPS server does).

With OCRD_VLLM_START_LOCK (ocrd's start gate) it sizes its memory as the real engine
core does through ocrd's plugin: inside the gate (ocrd/vllm_model/start_gate.py, its
lines on stdout), for FAKE_VLLM_SIZING_SECONDS (0.3), appending "arrived/taken/released
PID LOCK" lines to FAKE_VLLM_GATE_LOG (a file) where given. FAKE_VLLM_GATE_HOLD_FOR=N
keeps the gate (up to 30 s) until N servers have arrived at it: only servers started
together pass that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fake_vllm import FakeVllm

from ocrd.vllm_model import plugin, start_gate

CHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"


class FakeServe(FakeVllm):
    served_name: str = ""

    async def _answer(self, method: str, path: str, body: bytes,
                      reader: asyncio.StreamReader) -> tuple[int | None, dict]:
        if method == "GET" and path == "/health":
            return 200, {}
        if method == "GET" and path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.served_name,
                                                     "object": "model"}]}
        return await super()._answer(method, path, body, reader)


def size_memory_at_the_gate(gate: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="INFO %(message)s")
    gate_log = os.environ.get("FAKE_VLLM_GATE_LOG")

    def note(what: str) -> None:
        if gate_log:
            with open(gate_log, "a") as f:  # O_APPEND: one line per write
                f.write(f"{what} {os.getpid()} {gate}\n")

    note("arrived")
    start_gate.take(gate)
    note("taken")
    time.sleep(float(os.environ.get("FAKE_VLLM_SIZING_SECONDS", "0.3")))
    hold_for = int(os.environ.get("FAKE_VLLM_GATE_HOLD_FOR", "0"))
    deadline = time.monotonic() + 30
    while gate_log and time.monotonic() < deadline and hold_for > sum(
            1 for line in Path(gate_log).read_text().splitlines()
            if line.startswith("arrived") and line.endswith(gate)):
        time.sleep(0.05)
    note("released")
    start_gate.release()
    sys.stdout.flush()


async def mps_client() -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """Connect to the MPS control daemon, as CUDA does at start: the connection, or None
    (no MPS: none asked for, or none listening)."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not pipe:
        return None
    try:
        reader, writer = await asyncio.open_unix_connection(os.path.join(pipe, "control"))
    except OSError:
        return None
    writer.write(f"client {os.getpid()}\n".encode())
    await writer.drain()
    await reader.readline()
    return reader, writer  # (a writer let go closes the connection)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["serve"])
    p.add_argument("model")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--api-server-count", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--data-parallel-size", type=int, default=1)
    args, _ = p.parse_known_args()
    # front ends and an engine core that ignore SIGTERM: only SIGKILL to the group ends them
    children = [subprocess.Popen([sys.executable, "-c", CHILD])
                for _ in range(args.api_server_count + 1)]
    record = os.environ.get("FAKE_VLLM_RECORD")
    if record:
        Path(record, f"{os.getpid()}.json").write_text(json.dumps({
            "argv": sys.argv[1:], "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "children": [c.pid for c in children], "pgid": os.getpgid(0),
            "env": {k: v for k, v in os.environ.items() if k.startswith("OCRD_VLLM_")},
            "started": time.monotonic()}))
    await asyncio.sleep(float(os.environ.get("FAKE_VLLM_START_SECONDS", "0.5")))
    mps = await mps_client()
    if record:
        path = Path(record, f"{os.getpid()}.json")
        path.write_text(json.dumps({**json.loads(path.read_text()), "mps": mps is not None}))
    device = os.environ.get("CUDA_VISIBLE_DEVICES")
    exit_on = os.environ.get("FAKE_VLLM_EXIT_ON_DEVICE")
    once = os.environ.get("FAKE_VLLM_EXIT_ONCE_FILE")
    if exit_on is not None and device == exit_on and not (once and os.path.exists(once)):
        if once:  # the next start on this device goes well
            Path(once).touch()
        print("ERROR fake vllm serve: no usable GPU", flush=True)
        sys.exit(3)
    hold = os.environ.get("FAKE_VLLM_HOLD_DEVICE", "")
    if hold and hold.split("=", 1)[0] == device:  # loading until that file exists
        while not os.path.exists(hold.split("=", 1)[1]):
            await asyncio.sleep(0.05)
    gate = os.environ.get(plugin.START_LOCK_ENV)
    if gate:
        size_memory_at_the_gate(gate)
    server = FakeServe(latency=float(os.environ.get("FAKE_VLLM_LATENCY", "0.2")),
                       limit=int(os.environ.get("FAKE_VLLM_LIMIT", args.max_num_seqs)),
                       port=args.port)
    server.served_name = args.served_model_name or args.model
    await server.start()
    print(f"INFO fake vllm serve listening on {args.host}:{args.port}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if mps is not None:  # the MPS server's loss ends the client
        lost = asyncio.create_task(mps[0].read())
        await asyncio.wait([lost, asyncio.create_task(stop.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        if not stop.is_set():
            print("ERROR fake vllm serve: CUDA error: the MPS server went away", flush=True)
            os._exit(1)
    await stop.wait()
    await server.stop()
    print("INFO fake vllm serve stopped (children left running)", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
