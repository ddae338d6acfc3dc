"""`vllm serve` of the tiny DeepSeek-OCR-2 as a subprocess on 127.0.0.1, for the remote
engine's tests (the `server` fixture in conftest.py starts one per test module)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ocrd.engines.deepseek_ocr2 import NGRAM_PROCESSOR

SERVED_NAME = "tiny-dsocr2"
READY_TIMEOUT_SECONDS = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """`vllm serve` as a subprocess in its own process group (so its engine core goes
    down with it)."""

    def __init__(self, model_dir: Path, log_path: Path) -> None:
        self.model_dir = model_dir
        self.log_path = log_path
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        # `python -m vllm.entrypoints.openai.api_server` is `vllm serve`; the `vllm` script
        # itself looks up the distribution "vllm", which the CPU build is not named.
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.port),
            # the recipe's server flags
            "--logits-processors", NGRAM_PROCESSOR,
            "--no-enable-prefix-caching", "--mm-processor-cache-gb", "0",
            "--limit-mm-per-prompt", json.dumps({"image": 1}),
            # tiny CPU settings (shared/notes/testing-vllm-on-cpu.md)
            "--load-format", "dummy", "--dtype", "bfloat16", "--max-model-len", "2048",
            "--max-num-seqs", "4", "--enforce-eager", "--seed", "0",
            "--distributed-executor-backend", "uni",
            "--kv-cache-memory-bytes", str(128 * 2**20),
        ]

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> float:
        """Poll /health until it answers 200; seconds taken. Fails if the server exits."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            health = f"http://127.0.0.1:{self.port}/health"
            with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
            time.sleep(0.25)
        pytest.fail(f"vllm serve not ready after {timeout} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it if it lingers."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        # the engine core may outlive the API server by a moment
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])
