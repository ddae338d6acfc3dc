"""A fake `nvidia-cuda-mps-control` for the managed-server tests, with the real one's
command line and pipe folder (bench/gpu/mps_probe.py and GPU_RESULTS.md round 11 show the
real one's files on an H200: a `control` socket, control.log in the log folder):

  fake_mps_control.py -f   the daemon in the foreground: listens on
                           $CUDA_MPS_PIPE_DIRECTORY/control after FAKE_MPS_START_SECONDS
                           (0.2), logs to $CUDA_MPS_LOG_DIRECTORY/control.log, answers
                           `get_server_list` and `quit` (removes its socket, exits 0), and
                           takes clients: a line `client PID` (tests/fake_vllm_serve.py's
                           engine core under MPS), kept open while the client runs
  fake_mps_control.py      the user interface: sends its stdin's lines to the daemon,
                           prints the answers; exit 1 ("Cannot find MPS control daemon
                           process") where no daemon listens

FAKE_MPS_FAIL=1: the daemon exits 1 at once with an error line (no GPU, say).
FAKE_MPS_RECORD (a folder): the daemon writes PID.json with its CUDA_VISIBLE_DEVICES, its
pipe folder and the clients it has had, at start and whenever one comes.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path


def record(clients: list[int]) -> None:
    folder = os.environ.get("FAKE_MPS_RECORD")
    if folder:
        Path(folder, f"{os.getpid()}.json").write_text(json.dumps({
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"), "clients": clients}))


async def daemon() -> int:
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    logs = os.environ.get("CUDA_MPS_LOG_DIRECTORY", pipe)
    if os.environ.get("FAKE_MPS_FAIL"):
        print("An instance of this daemon cannot start: no CUDA-capable device", flush=True)
        return 1
    clients: list[int] = []
    record(clients)
    await asyncio.sleep(float(os.environ.get("FAKE_MPS_START_SECONDS", "0.2")))
    done = asyncio.Event()
    path = os.path.join(pipe, "control")

    def note(text: str) -> None:
        with open(os.path.join(logs, "control.log"), "a") as f:
            f.write(f"[Control {os.getpid()}] {text}\n")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer(reader, writer)
        except (asyncio.CancelledError, ConnectionError):  # quit while a client runs
            pass

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := (await reader.readline()).decode().strip():
            if line == "quit":
                note("Cmd:quit")
                done.set()
                writer.write(b"\n")
            elif line == "get_server_list":
                writer.write(b"\n")
            elif line.startswith("client "):
                clients.append(int(line.split()[1]))
                record(clients)
                note(f"NEW CLIENT {line.split()[1]}")
                writer.write(b"ok\n")
            else:
                writer.write(f"unknown command {line}\n".encode())
            await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(serve, path)
    note("Starting control daemon")
    print(f"fake MPS control daemon listening on {path}", flush=True)
    await done.wait()
    server.close()
    os.unlink(path)
    return 0


def ui() -> int:
    path = os.path.join(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"),
                        "control")
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
    except OSError:
        print("Cannot find MPS control daemon process")
        return 1
    with s, s.makefile("rwb") as f:
        for line in sys.stdin.buffer:
            f.write(line)
            f.flush()
            sys.stdout.write(f.readline().decode())
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(daemon()) if sys.argv[1:] == ["-f"] else ui())
