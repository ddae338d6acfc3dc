"""The GPU benchmark's daemon phases (bench/gpu/run.py managed | inproc): ocrd's daemon with
a supervised local `vllm serve --api-server-count N` (managed) or the in-process engine
(inproc), against a plain HTTP client straight to the same server (the direct
configuration).

Rows and facts: the direct client; PDFs dropped into the inbox until every .md exists;
one-page latency on the idle daemon (and the direct first-token and one-page times); a
killed server restarted by the supervisor (--restart); a clean stop with no process
left. The daemon runs through the tests' harness (tests/daemon_process.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.gpu.common import (
    BAN_EOS,
    NGRAM_ARGS,
    OCRD_NGRAM,
    PROMPT,
    ROOT,
    SERVER_PORT,
    VLLM_NGRAM,
    engine_settings,
    flow,
    knobs,
    row,
    save,
    sizes,
    tiny_env,
)
from bench.gpu.inputs import data_urls, make_pdfs
from bench.gpu.measure import (
    Gauges,
    GpuMemory,
    end_sessions,
    gpu_processes,
    profile_engine_core,
    session_processes,
)
from tests.daemon_process import DaemonProcess

ENCODER_SETTING = {"auto": None, "batched": True, "page": False}


class GpuDaemon(DaemonProcess):
    """`ocrd run` in its own session with one inbox under root (emptied first), files
    deleted after conversion, /metrics on 127.0.0.1:9464; JSON log to root/daemon.log."""

    def __init__(self, root: Path, engine: dict, env: dict[str, str],
                 quiet_seconds: float, pages_in_flight: int = 0) -> None:
        shutil.rmtree(root, ignore_errors=True)
        self.inbox, self.outbox, self.failed = root / "in", root / "out", root / "failed"
        self.appeared: dict[str, float] = {}  # NAME.md → when it was first seen
        for d in (self.inbox, self.outbox, self.failed):
            d.mkdir(parents=True)
        config = {
            "state_dir": str(root / "state"),
            "drain_timeout_seconds": 5,  # a benchmark stopped early need not drain
            "engine": engine,
            "schedule": {"pages_in_flight": pages_in_flight},
            "metrics": {"listen": "127.0.0.1:9464"},
            "log": {"level": "info", "format": "json"},
            "inboxes": [{"path": str(self.inbox), "outbox": str(self.outbox),
                         "failed": str(self.failed), "on_success": "delete",
                         "quiet_seconds": quiet_seconds}],
        }
        super().__init__(root, config, env=env)

    def remember_sessions(self) -> set[int]:
        """Our daemon's session and its vLLM servers' ones, also in WORK/sessions.txt for
        `gpu.py cleanup` (the daemon and the server start their own sessions, which
        outlive a killed benchmark)."""
        sessions = {self.proc.pid} if self.proc else set()
        sessions |= {e["pid"] for e in self.events("vllm_server_starting") if "pid" in e}
        with open(self.root.parent.parent / "sessions.txt", "a") as f:
            f.write("".join(f"{pid}\n" for pid in sorted(sessions)))
        return sessions

    def drop(self, pdfs: list[Path]) -> float:
        """Copy finished files in the way a scanner does (write, close): the close event
        lets them through at once."""
        t0 = time.monotonic()
        for p in pdfs:
            (self.inbox / p.name).write_bytes(p.read_bytes())
        return t0

    def wait_outputs(self, names: list[str], timeout: float) -> float:
        """monotonic time when the last NAME.md appeared (polled every 20 ms)."""
        want = {Path(n).stem + ".md" for n in names}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            have = {p.name for p in self.outbox.glob("*.md")}
            now = time.monotonic()
            for name in have - self.appeared.keys():
                self.appeared[name] = now  # when each output was first seen (±20 ms)
            if want <= have:
                return time.monotonic()
            if self.failed.exists() and any(self.failed.iterdir()):
                raise RuntimeError(f"files failed: {sorted(os.listdir(self.failed))[:5]}")
            time.sleep(0.02)
        raise TimeoutError(f"{len(want - have)} of {len(want)} outputs missing "
                           f"after {timeout} s")


def stop_and_record(d: GpuDaemon, result: dict, gpu_mem_mib: Callable[[], Any]) -> None:
    """Stop the daemon and record what was left: processes of its sessions, GPU
    processes and memory (`gpu_mem_mib()`); then kill what is left of those sessions."""
    sessions = d.remember_sessions()
    t0 = time.monotonic()
    d.stop(120, strict=False)
    result["stop_s"] = round(time.monotonic() - t0, 1)
    result["daemon_rc"] = d.proc.returncode if d.proc else None
    time.sleep(1)
    result["left_after_stop"] = session_processes(sessions)
    result["gpu_processes_after_stop"] = gpu_processes()
    result["gpu_mem_after_stop_mib"] = gpu_mem_mib()
    d.kill(group_left=True)
    result["killed_after_stop"] = end_sessions(sessions)


async def direct_http(url: str, model: str, urls: list[str], t: int,
                      concurrency: int, done: list[tuple[float, int]] | None = None,
                      delay_s: float = 0.0, ramp_s: float = 0.0
                      ) -> tuple[float, list[float]]:
    """All pages to `vllm serve` with a plain client: the same requests ocrd sends.
    `delay_s`: the first request that much later; `ramp_s`: the first `concurrency`
    requests spread evenly over that many seconds instead of sent at once (the rest
    follow as pages finish, as always)."""
    import aiohttp

    bodies = [json.dumps({
        "model": model, "temperature": 0.0, "max_tokens": t, "skip_special_tokens": False,
        "vllm_xargs": NGRAM_ARGS,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": u}},
            {"type": "text", "text": PROMPT.removeprefix("<image>\n")}]}],
    }).encode() for u in urls]
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(client: aiohttp.ClientSession, body: bytes, j: int) -> None:
        if ramp_s and j < concurrency:
            await asyncio.sleep(ramp_s * j / concurrency)
        async with sem:
            t1 = time.monotonic()
            async with client.post(url + "/chat/completions", data=body,
                                   headers={"Content-Type": "application/json"}) as resp:
                answer = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {answer[:300]!r}")
            latencies.append(time.monotonic() - t1)
            if done is not None:
                done.append((time.monotonic(), 1))

    t0 = time.monotonic()
    if delay_s:
        await asyncio.sleep(delay_s)
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=900)) as client:
        await asyncio.gather(*(one(client, b, j) for j, b in enumerate(bodies)))
    return time.monotonic() - t0, latencies


def phase_daemon(args: argparse.Namespace, api_servers: int) -> None:
    run = DaemonRun(args, api_servers)
    with GpuMemory() as mem, run.gauges:
        run.mem = mem
        run.daemon.start(wait_ready=False)
        try:
            run.measure()
        finally:
            run.finish()
    print(run.phase.upper(), json.dumps(run.result), flush=True)


class DaemonRun:
    """One daemon phase: its inputs, its daemon, and the rows measured on it."""

    def __init__(self, args: argparse.Namespace, api_servers: int) -> None:
        self.args, self.api_servers = args, api_servers
        self.s = s = sizes(args.tiny)
        self.T: int = s["T"]
        self.phase = "managed" if api_servers > 1 else "inproc"
        env = tiny_env() if args.tiny else {"PYTHONPATH": os.pathsep.join(
            [os.environ.get("PYTHONPATH", ""), str(ROOT)])}
        engine = engine_settings(args.tiny, args.model, args.max_num_seqs, args.engine_arg)
        engine["vllm"]["api_servers"] = api_servers
        engine["vllm"]["mode"] = "managed" if api_servers > 1 else "inprocess"
        engine["vllm"]["server_port"] = SERVER_PORT
        ngram = VLLM_NGRAM if args.vllm_ngram else OCRD_NGRAM
        engine["vllm"]["engine_args"]["logits_processors"] = [ngram, BAN_EOS]
        engine["vllm"]["fast_encoder"] = not args.stock_encoder
        engine["vllm"]["batch_encoder"] = ENCODER_SETTING[args.encoder_mode]
        self.result: dict[str, Any] = {
            "phase": self.phase, "api_servers": api_servers, "T": self.T, "ngram": ngram,
            "fast_encoder": not args.stock_encoder, "encoder_mode": args.encoder_mode,
            "knobs": knobs(), "rows": []}
        work = args.work / self.phase
        self.n_ocrd = args.pages or (s["ocrd_pages"] if api_servers > 1
                                     else s["inproc_pages"])
        n_direct = (args.direct_pages if args.direct_pages is not None
                    else args.pages or s["direct_pages"])
        self.pdfs = make_pdfs(work / "pdfs", self.n_ocrd, s["per_file"], 100_000)
        self.singles = [make_pdfs(work / f"single{i}", 1, 1, 200_000 + i)[0]
                        for i in range(s["latency_n"] + 1)]
        self.urls = data_urls(range(300_000, 300_000 + n_direct)) if api_servers > 1 else []
        self.daemon = GpuDaemon(work / "daemon", engine, env, quiet_seconds=args.quiet,
                                pages_in_flight=args.pages_in_flight)
        self.gauges = Gauges([f"http://127.0.0.1:{SERVER_PORT}/metrics",
                              f"http://{self.daemon.config['metrics']['listen']}/metrics"])
        self.server = f"http://127.0.0.1:{SERVER_PORT}/v1"
        self.mem: GpuMemory | None = None

    def save(self) -> None:
        save(self.args.out, self.phase, self.result)

    def measure(self) -> None:
        args, d, result = self.args, self.daemon, self.result
        ready = d.wait_event("ready", self.s["timeout"])
        d.remember_sessions()
        result["daemon_ready_s"] = round(time.monotonic() - d.started_at, 1)
        started = d.events("engine_started")
        result["engine_start_s"] = started[-1].get("seconds") if started else None
        result["gpu_mem_after_start_mib"] = GpuMemory.used()
        result["pages_in_flight"] = ready.get("pages_in_flight")
        print("READY", json.dumps(result), flush=True)
        self.warm_up()
        self.end_to_end()
        if self.api_servers > 1 and args.direct_again and self.urls:
            self.direct(f"direct_http_vllm_serve_x{self.api_servers}_again")  # after ocrd
        self.one_page_latency()
        self.save()
        if self.api_servers > 1 and args.restart:
            self.restart()

    def warm_up(self) -> None:
        """The managed server: warmed at full width by the direct client (the first large
        batches compile kernels, which no measured row should pay), then the direct row;
        the in-process engine: warmed with one file."""
        if self.api_servers > 1:
            warm = data_urls(range(400_000, 400_000 + (8 if self.args.tiny else 256)))
            t0 = time.monotonic()
            asyncio.run(direct_http(self.server, str(self.args.model), warm, 64,
                                    self.result["pages_in_flight"]))
            self.result["warm_s"] = round(time.monotonic() - t0, 1)
            if self.urls:
                self.direct(f"direct_http_vllm_serve_x{self.api_servers}")
        else:
            self.daemon.drop([self.singles[-1]])
            self.daemon.wait_outputs([self.singles[-1].name], self.s["timeout"])

    def direct(self, name: str) -> None:
        """A row of the direct client: every URL to the server, as many in flight as the
        daemon keeps."""
        args, T = self.args, self.T
        assert self.mem is not None
        done: list[tuple[float, int]] = []
        if args.profile:
            profile_engine_core(args.out, name, args.profile_delay, args.profile)
        t0 = time.monotonic()
        dt, lat = asyncio.run(direct_http(self.server, str(args.model), self.urls, T,
                                          self.result["pages_in_flight"], done))
        self.result["rows"].append(row(name, len(self.urls), dt, T=T,
                                       latency_p50_s=round(statistics.median(lat), 2),
                                       gpu_busy_pct=self.mem.busy_between(t0, t0 + dt),
                                       **flow(t0, done), **self.gauges.between(t0, t0 + dt)))
        self.save()

    def end_to_end(self) -> None:
        """Every PDF into the inbox at once, until every .md exists."""
        args, d, s = self.args, self.daemon, self.s
        assert self.mem is not None
        name = (f"ocrd_e2e_managed_x{self.api_servers}" if self.api_servers > 1
                else "ocrd_e2e_inprocess")
        if args.profile:
            profile_engine_core(args.out, name, args.profile_delay, args.profile)
        t0 = d.drop(self.pdfs)
        t1 = d.wait_outputs([p.name for p in self.pdfs], s["timeout"])
        seen = [(d.appeared[Path(p.name).stem + ".md"], s["per_file"]) for p in self.pdfs]
        self.result["rows"].append(row(name, self.n_ocrd, t1 - t0, T=self.T,
                                       files=len(self.pdfs),
                                       gpu_busy_pct=self.mem.busy_between(t0, t1),
                                       **flow(t0, seen), **self.gauges.between(t0, t1)))
        self.save()

    def one_page_latency(self) -> None:
        """One page into the idle daemon, several times; the same page to the server
        directly (first token, whole page)."""
        d, s, result = self.daemon, self.s, self.result
        lat = []
        for p in self.singles[: s["latency_n"]]:
            time.sleep(1.0)
            t0 = d.drop([p])
            lat.append(d.wait_outputs([p.name], s["timeout"]) - t0)
        result["ocrd_one_page_s"] = [round(x, 2) for x in lat]
        result["ocrd_one_page_p50_s"] = round(statistics.median(lat), 2)
        if self.api_servers <= 1:
            return
        ttft, full = [], []
        model = str(self.args.model)
        for i in range(s["latency_n"]):
            one = data_urls(range(500_000 + 2 * i, 500_002 + 2 * i))
            ttft.append(asyncio.run(direct_http(self.server, model, one[:1], 1, 1))[0])
            full.append(asyncio.run(direct_http(self.server, model, one[1:], self.T, 1))[0])
        result["direct_first_token_s"] = [round(x, 3) for x in ttft]
        result["direct_first_token_p50_s"] = round(statistics.median(ttft), 3)
        result["direct_one_page_s"] = [round(x, 2) for x in full]
        result["decode_s"] = round(statistics.median(full) - statistics.median(ttft), 2)

    def restart(self) -> None:
        """The supervisor at work: kill the server's whole process group (as when the
        machine's OOM killer strikes), drop a page, wait for it and the new server."""
        d, s = self.daemon, self.s
        pid = d.events("vllm_server_ready")[-1]["pid"]
        n_ready = len(d.events("vllm_server_ready"))
        os.killpg(pid, signal.SIGKILL)
        t0 = d.drop([self.singles[-1]])
        t1 = d.wait_outputs([self.singles[-1].name], s["timeout"])
        while len(d.events("vllm_server_ready")) <= n_ready:
            time.sleep(0.2)
        d.remember_sessions()
        self.result["restart"] = {
            "page_after_kill_s": round(t1 - t0, 1),
            "server_restart_s": d.events("vllm_server_ready")[-1].get("seconds")}
        print("RESTART", json.dumps(self.result["restart"]), flush=True)

    def finish(self) -> None:
        """Stop the daemon and record what was left: processes of its sessions, GPU
        processes and memory; then kill what is left of those sessions."""
        d, result = self.daemon, self.result
        assert self.mem is not None
        stop_and_record(d, result, GpuMemory.used)
        result["gpu_mem_peak_mib"] = self.mem.peak
        self.save()
        shutil.copy(d.log_path, self.args.out / f"daemon_{self.phase}.log")
