"""ocrd end to end with several managed `vllm serve` processes, rows side by side:

    python bench/gpu/multi.py --work W --out OUT            # one GPU: 1 vs 2 servers
    python bench/gpu/multi.py --gpus 2 --work W --out OUT   # + 1 GPU vs 2 GPUs, both ways
    python bench/gpu/multi.py --tiny                        # CPU dry run, tiny model
    bash bench/gpu/run.sh multi                             # on the GPU machine (bundle)

Each row is a fresh `ocrd run` with its engine configuration (engine.vllm.servers_per_gpu,
gpus, data_parallel_size), the same PDFs dropped into its inbox at once, timed from the
drop to the last Markdown file. Rows:

  1gpu_x1        one server on one GPU (api_servers front ends, gpu_memory_utilization)
  1gpu_x2        two servers on that GPU, the memory and the front ends split (issue 22)
  2gpu_per_gpu   one group per GPU, --servers-per-gpu servers each (issue 21)
  2gpu_dp        one server over both GPUs, vLLM's --data-parallel-size 2 (issue 21)
  ROW_float      any row with vLLM's float page views (engine.vllm.uint8_pixels: false)
                 instead of ocrd's uint8 views (the default; issue 22)
  ROW_sN         any row with max_num_seqs N per server (default --max-num-seqs, 256)
  ROW_qN         any row with N pages queued per server beyond its batch
                 (engine.vllm.queue_per_server; default 4 per front end)
  ROW_nomps      any row with engine.vllm.mps false: servers sharing a GPU take turns
                 on it (time-sliced) instead of running under CUDA MPS (the default
                 where servers share a GPU; round 11)

--direct-pages N: before ocrd's pages (after them with --direct-after), N other pages go
straight to the row's servers with a plain HTTP client (the requests ocrd sends, ocrd's
number of pages in flight split evenly, or --direct-in-flight M), measured like ocrd's
run: what the servers do without the daemon. --direct-also M,...: then the same pages
again with M in flight, each (two depths on the same servers); MrS spreads the first M
over S seconds, MsS starts each server's pages S seconds after the previous server's
(does a run whose pages do not all start together, or whose servers' waves are out of
step, come out faster? issue 22: the whole run loses ~25 % against its middle).

Per row: engine start (s), GPU memory after start (MiB per GPU), every server warmed at
full width with short answers (compiled kernels: no row pays them), pages/s, pages/s in
the middle of the run (a quarter to three quarters of the pages), GPU busy (% per GPU,
whole run and middle), the stop's time, processes left and GPU memory after the stop.
--kill ROW kills one server of ROW (its whole process group) a third into the run: every
page must still come out (none in failed/), and the server's restart is recorded.
Dummy weights, full-size architecture, every page exactly T output tokens (EOS banned),
as bench/gpu/run.py. Results: OUT/results_multi.json (after each row) and a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu import common, inputs, measure  # noqa: E402
from bench.gpu.daemon import GpuDaemon, direct_http, stop_and_record  # noqa: E402
from ocrd.vllm_model.start_gate import TAKEN_MARK  # noqa: E402 - imports no vLLM

ROWS_ONE = ["1gpu_x1", "1gpu_x2"]
# the engine core's line at its first uint8 views (ocrd/vllm_model/dsocr2_pixels.py, which
# imports vLLM: not imported here)
UINT8_MARK = "ocrd page views arrive as uint8"
ROWS_TWO = ["1gpu_x1", "1gpu_x2", "2gpu_per_gpu", "2gpu_dp"]


# Rows of the layout ocrd picks itself (engine.vllm.profile: auto, no layout keys set):
# "auto" for this machine's GPU, "auto_24g" as the profile would pick for a 24 GB card, run
# inside a 24 GB card's share of this GPU's memory; "inproc_24g" is the in-process engine's
# defaults in the same share (the layout a 24 GB card got before profiles).
AUTO_ROWS = ("auto", "auto_24g", "inproc_24g")
CARD_24G_MIB = 24_564


def auto_engine(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """A row's engine config with only the bench's own settings: the layout is the
    profile's (auto), or what it picks for a 24 GB card given explicitly (auto_24g)."""
    from ocrd.engines.vllm import profile as gpu_profile

    e = common.engine_settings(args.tiny, args.model, None, args.engine_arg)
    v = e["vllm"]
    v["engine_args"]["logits_processors"] = [common.OCRD_NGRAM, common.BAN_EOS]
    if args.tiny:  # two cores and no GPU: the tiny model's settings stay
        v.update(profile="none", mode="managed", api_servers=2)
        return e
    for key in ("profile", "gpu_memory_utilization", "max_num_seqs"):
        v.pop(key)
    if name == "auto":
        return e
    gpus = gpu_profile.detect()
    share = CARD_24G_MIB / gpus[0].memory_mib if gpus else 1.0
    if name == "inproc_24g":
        v.update(profile="none", mode="inprocess")
        v["gpu_memory_utilization"] = round(0.9 * share, 3)
        return e
    card = gpu_profile.Gpu(0, "24 GB card", CARD_24G_MIB, gpus[0].capability if gpus else None)
    chosen = gpu_profile.choose([card])
    v.update(chosen.settings, profile="none")
    v["gpu_memory_utilization"] = round(chosen.settings.get("gpu_memory_utilization", 0.9)
                                        * share, 3)
    return e


def row_engine(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The engine config of a row: bench/gpu/run.py's settings plus the row's layout."""
    if name in AUTO_ROWS:
        return auto_engine(name, args)
    e = common.engine_settings(args.tiny, args.model, args.max_num_seqs, args.engine_arg)
    v = e["vllm"]
    v["mode"] = "managed"
    parts = name.split("_")  # "1gpu_x2_float_s384": the row, then its variations
    suffixes = []
    while parts and (parts[-1] in ("float", "nomps") or re.fullmatch(r"[sq]\d+", parts[-1])):
        suffixes.append(parts.pop())
    name = "_".join(parts)
    v["uint8_pixels"] = "float" not in suffixes
    if "nomps" in suffixes:
        v["mps"] = False
    for x in suffixes:
        if x[0] == "s":
            v["max_num_seqs"] = int(x[1:])
        elif x[0] == "q":  # pages each server holds beyond its batch
            v["queue_per_server"] = int(x[1:])
    v["engine_args"]["logits_processors"] = [common.OCRD_NGRAM, common.BAN_EOS]
    v["api_servers"] = args.api_servers
    one = [0] if args.gpus > 1 else []  # one GPU of a larger host; else the environment's
    layout = {"1gpu_x1": {"gpus": one, "servers_per_gpu": 1},
              "1gpu_x2": {"gpus": one, "servers_per_gpu": 2},
              "2gpu_per_gpu": {"gpus": [0, 1], "servers_per_gpu": args.servers_per_gpu},
              "2gpu_dp": {"gpus": [0, 1], "servers_per_gpu": 1, "data_parallel_size": 2,
                          "api_servers": 2 * args.api_servers}}[name]
    v.update(layout)
    if args.tiny:  # the CPU build: no devices to choose, and two cores
        v["gpus"] = []
        v["data_parallel_size"] = 1
        v["api_servers"] = args.api_servers  # >= 2: the managed mode with one server too
    return e


class Busy(measure.Sampler):
    """Memory in use and utilisation of every GPU, every 0.5 s (nvidia-smi)."""

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[tuple[float, list[tuple[int, int]]]] = []

    @staticmethod
    def query() -> list[tuple[int, int]]:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,utilization.gpu",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=10).stdout
            return [(int(a), int(b)) for a, b in (ln.split(",") for ln in out.splitlines())]
        except (OSError, ValueError, subprocess.SubprocessError):
            return []

    def sample(self) -> None:
        q = self.query()
        if q:
            self.samples.append((time.monotonic(), q))

    def busy(self, t0: float, t1: float) -> list[float] | None:
        rows = [q for t, q in self.samples if t0 <= t <= t1]
        if not rows:
            return None
        return [round(sum(r[i][1] for r in rows) / len(rows), 1) for i in range(len(rows[0]))]


def memory() -> list[int] | None:
    return [m for m, _ in Busy.query()] or None


def middle(t0: float, seen: list[tuple[float, int]]) -> tuple[float, float] | None:
    """When a quarter and three quarters of the pages were out."""
    total, cum, marks = sum(n for _, n in seen), 0, []
    for t, n in sorted(seen):
        cum += n
        while len(marks) < 2 and cum >= (0.25, 0.75)[len(marks)] * total:
            marks.append(t)
    # a run too short for a middle (64 pages done within a second: round 12 printed
    # 1,577 pages/s) has none
    return (marks[0], marks[1]) if len(marks) == 2 and marks[1] - marks[0] >= 2.0 else None


def warm(d: GpuDaemon, args: argparse.Namespace, urls: list[str]) -> float:
    """Every server at full width with short answers (kernels compiled before timing)."""
    servers = sorted({e["url"] for e in d.events("vllm_server_ready")})
    per = max(1, len(urls) // max(1, len(servers)))

    async def all_servers() -> None:
        await asyncio.gather(*(direct_http(s, str(args.model), urls[i * per:(i + 1) * per],
                                               64 if not args.tiny else 4, per)
                               for i, s in enumerate(servers)))

    t0 = time.monotonic()
    asyncio.run(all_servers())
    return round(time.monotonic() - t0, 1)


def direct_shape(text: str) -> tuple[int, str, float]:
    """--direct-also's items: "800" (800 in flight, sent at once), "800r30" (the first
    800 spread over 30 s), "800s20" (each server's pages 20 s after the previous
    server's: their waves out of step)."""
    m = re.fullmatch(r"(\d+)(?:([rs])(\d+(?:\.\d+)?))?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not N, NrSECONDS or NsSECONDS: {text!r}")
    return int(m[1]), m[2] or "", float(m[3] or 0)


def direct(d: GpuDaemon, args: argparse.Namespace, urls: list[str], in_flight: int,
           busy: Busy, result: dict[str, Any], how: str = "", seconds: float = 0.0) -> None:
    """`urls` straight to the row's servers with a plain client: each server its share
    of the pages and of ocrd's pages in flight, all at once (as ocrd's PDFs are
    dropped), or with how "r" spread over `seconds`, or with how "s" each server
    `seconds` after the previous one. Recorded under result["direct"]; the time counts
    from the first request, ramp and delays included."""
    servers = sorted({e["url"] for e in d.events("vllm_server_ready")})
    n, k = len(urls), len(servers)
    done: list[tuple[float, int]] = []
    t = common.sizes(args.tiny)["T"]
    ramp, stagger = (seconds if how == "r" else 0.0), (seconds if how == "s" else 0.0)

    async def all_servers() -> list[float]:
        return await asyncio.gather(*(
            direct_http(srv, str(args.model), urls[i::k], t, max(1, in_flight // k), done,
                        delay_s=i * stagger, ramp_s=ramp)
            for i, srv in enumerate(servers)))

    t0 = time.monotonic()
    asyncio.run(all_servers())
    t1 = time.monotonic()
    mid = middle(t0, done)
    out: dict[str, Any] = {"pages": n, "in_flight": max(1, in_flight // k) * k,
                           "ramp_s": ramp, "stagger_s": stagger,
                           "wall_s": round(t1 - t0, 2), "pages_per_s": round(n / (t1 - t0), 3),
                           "first_done_s": round(min(t for t, _ in done) - t0, 2),
                           "gpu_busy_pct": busy.busy(t0, t1)}
    if mid:
        out["middle_pages_per_s"] = round(0.5 * n / (mid[1] - mid[0]), 3)
        out["middle_gpu_busy_pct"] = busy.busy(*mid)
    result["direct"] = out
    print("DIRECT", json.dumps(out), flush=True)


def one_page(d: GpuDaemon, args: argparse.Namespace, singles: list[Path],
             result: dict[str, Any]) -> None:
    """One-page PDFs into the idle daemon one at a time (issue 22: within 1.5 s plus the
    page's decode time); then a page straight to the first server, first token alone
    and the whole page, for that decode time."""
    lat = []
    for pdf in singles:
        time.sleep(1.0)
        t0 = d.drop([pdf])
        lat.append(d.wait_outputs([pdf.name], common.sizes(args.tiny)["timeout"]) - t0)
    server = sorted({e["url"] for e in d.events("vllm_server_ready")})[0]
    ttft, full = [], []
    for i in range(len(singles)):
        one = inputs.data_urls(range(900_000 + 2 * i, 900_002 + 2 * i))
        ttft.append(asyncio.run(direct_http(server, str(args.model), one[:1], 1, 1))[0])
        full.append(asyncio.run(direct_http(server, str(args.model), one[1:],
                                            common.sizes(args.tiny)["T"], 1))[0])
    decode = statistics.median(full) - statistics.median(ttft)
    result["one_page"] = {"ocrd_s": [round(x, 2) for x in lat],
                          "ocrd_p50_s": round(statistics.median(lat), 2),
                          "direct_first_token_s": [round(x, 3) for x in ttft],
                          "direct_page_s": [round(x, 2) for x in full],
                          "decode_s": round(decode, 2),
                          "within_1_5_s_plus_decode": statistics.median(lat) <= 1.5 + decode}
    print("ONE_PAGE", json.dumps(result["one_page"]), flush=True)


def host() -> dict[str, Any]:
    """Which machine this is (issue 22 asks for two)."""
    info: dict[str, Any] = {"hostname": os.uname().nodename, "cores": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,uuid,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True,
                         check=False).stdout.strip() if shutil.which("nvidia-smi") else ""
    info["gpu"] = gpu
    return info


def kill_one(d: GpuDaemon, result: dict, n_files: int) -> None:
    """A third into the run, SIGKILL the first server's process group."""
    while (done := sum(1 for _ in d.outbox.glob("*.md"))) < max(1, n_files // 3):
        time.sleep(0.1)
    ready = d.events("vllm_server_ready")
    victim = ready[0]
    os.killpg(victim["pid"], signal.SIGKILL)
    result["killed"] = {"server": victim.get("server"), "pid": victim["pid"],
                        "at_outputs": done, "ready_events_before": len(ready)}


def run_row(name: str, args: argparse.Namespace, pdfs: list[Path],
            warm_urls: list[str], direct_urls: list[str], singles: list[Path],
            ) -> dict[str, Any]:
    s = common.sizes(args.tiny)
    env = common.tiny_env() if args.tiny else {"PYTHONPATH": os.pathsep.join(
        [os.environ.get("PYTHONPATH", ""), str(common.ROOT)])}
    engine = row_engine(name, args)
    result: dict[str, Any] = {"config": name, "T": s["T"], "vllm": {
        k: engine["vllm"].get(k) for k in ("gpus", "servers_per_gpu", "api_servers",
                                           "data_parallel_size", "gpu_memory_utilization",
                                           "max_num_seqs")}}
    d = GpuDaemon(args.work / "multi" / name, engine, env, quiet_seconds=args.quiet)
    # the daemon's own pages in flight: whether ocrd kept the servers full (round 7: its
    # memory budget held 76 of 544)
    gauges = measure.Gauges([f"http://{d.config['metrics']['listen']}/metrics"])
    with Busy() as busy, gauges:
        d.start(wait_ready=False)
        t_start = d.started_at
        try:
            ready = d.wait_event("ready", s["timeout"] + 600)
            result["daemon_ready_s"] = round(time.monotonic() - t_start, 1)
            result["server_start_s"] = [e.get("seconds") for e in d.events("vllm_server_ready")]
            result["gpu_mem_after_start_mib"] = memory()
            result["pages_in_flight"] = ready.get("pages_in_flight")
            d.remember_sessions()
            result["warm_s"] = warm(d, args, warm_urls)
            result["uint8_views_arrived"] = sum(
                1 for e in d.events("vllm_server") if UINT8_MARK in str(e.get("line", "")))
            profile = d.events("vllm_profile")
            if profile:  # the layout the daemon ran (an auto row's is the profile's)
                result["profile"] = {k: profile[-1].get(k) for k in (
                    "profile", "reason", "mode", "settings", "overridden")}
            planned = d.events("vllm_servers_planned")
            result["start"] = planned[-1].get("start") if planned else None
            result["start_gate_taken"] = sum(
                1 for e in d.events("vllm_server") if TAKEN_MARK in str(e.get("line", "")))
            result["mps_daemons"] = len(d.events("vllm_mps_ready"))
            result["mps_unavailable"] = [e.get("error") for e in d.events("vllm_mps_unavailable")]

            def plain_client() -> None:
                direct(d, args, direct_urls,
                       args.direct_in_flight or int(result["pages_in_flight"] or 0), busy, result)
                common.save(args.out, f"multi_{name}_direct", result)
                for n, how, sec in args.direct_also:  # the same pages again, n in flight
                    again: dict[str, Any] = {}
                    direct(d, args, direct_urls, n, busy, again, how, sec)
                    result.setdefault("direct_also", []).append(again["direct"])
                    common.save(args.out, f"multi_{name}_direct", result)

            if direct_urls and not args.direct_after:
                plain_client()
            t0 = d.drop(pdfs)
            if args.kill == name:
                kill_one(d, result, len(pdfs))
            t1 = d.wait_outputs([p.name for p in pdfs], s["timeout"] + 600)
            seen = [(d.appeared[p.stem + ".md"], args.per_file) for p in pdfs]
            mid = middle(t0, seen)
            n = len(pdfs) * args.per_file
            result.update(pages=n, wall_s=round(t1 - t0, 2),
                          pages_per_s=round(n / (t1 - t0), 3),
                          gpu_busy_pct=busy.busy(t0, t1), **gauges.between(t0, t1))
            result["peak_ocrd_pages_in_flight"] = max(
                (v.get("ocrd_pages_in_flight", 0) for t, v in gauges.samples if t0 <= t <= t1),
                default=None)
            ready_event = d.events("ready")
            if ready_event:
                result["memory_budget_bytes"] = ready_event[-1].get("memory_budget_bytes")
            if mid:
                result["middle_pages_per_s"] = round(0.5 * n / (mid[1] - mid[0]), 3)
                result["middle_gpu_busy_pct"] = busy.busy(*mid)
            print("OCRD", json.dumps({k: result.get(k) for k in (
                "pages", "wall_s", "pages_per_s", "gpu_busy_pct", "middle_pages_per_s",
                "middle_gpu_busy_pct", "peak_ocrd_pages_in_flight", "daemon_ready_s",
                "server_start_s", "start", "start_gate_taken", "mps_daemons")}), flush=True)
            common.save(args.out, f"multi_{name}_ocrd", result)
            if singles:
                one_page(d, args, singles, result)
            if direct_urls and args.direct_after:
                plain_client()
            if "killed" in result:
                before = result["killed"]["ready_events_before"]
                deadline = time.monotonic() + s["timeout"] + 600
                while (len(d.events("vllm_server_ready")) <= before
                       and time.monotonic() < deadline):
                    time.sleep(0.2)
                result["killed"]["restart_s"] = d.events("vllm_server_ready")[-1].get("seconds")
                result["killed"]["failed_files"] = (sorted(os.listdir(d.failed))
                                                    if d.failed.exists() else [])
        finally:
            stop_and_record(d, result, memory)
            shutil.copy(d.log_path, args.out / f"daemon_multi_{name}.log")
    print("ROW", json.dumps(result), flush=True)
    return result


def shape_label(x: dict[str, Any]) -> str:
    """", ramp 30 s" / ", stagger 20 s" for a plain client's run that was not at once."""
    if x.get("ramp_s"):
        return f", ramp {x['ramp_s']:g} s"
    if x.get("stagger_s"):
        return f", stagger {x['stagger_s']:g} s"
    return ""


def table(rows: list[dict]) -> str:
    base = next((r.get("pages_per_s") for r in rows if r["config"] == "1gpu_x1"), None)
    lines = ["| row | run | pages | pages/s | middle pages/s | × 1gpu_x1 | GPU busy % (middle) "
             "| start s | MiB after start | MiB after stop | left |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = (f"{r['pages_per_s'] / base:.2f}" if base and r.get("pages_per_s") else "—")
        for x in ([r["direct"]] if "direct" in r else []) + r.get("direct_also", []):
            lines.append(
                f"| {r['config']} | plain client, {x.get('in_flight')} in flight"
                f"{shape_label(x)} | "
                f"{x.get('pages')} | {x.get('pages_per_s')} | "
                f"{x.get('middle_pages_per_s')} | | {x.get('gpu_busy_pct')} "
                f"({x.get('middle_gpu_busy_pct')}) | | | | |")
        lines.append(
            f"| {r['config']} | ocrd | {r.get('pages')} | {r.get('pages_per_s')} | "
            f"{r.get('middle_pages_per_s')} | {ratio} | {r.get('gpu_busy_pct')} "
            f"({r.get('middle_gpu_busy_pct')}) | {r.get('daemon_ready_s')} | "
            f"{r.get('gpu_mem_after_start_mib')} | {r.get('gpu_mem_after_stop_mib')} | "
            f"{len(r.get('left_after_stop', []))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu-work"))
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu-out")))
    p.add_argument("--model", type=Path, default=None, help="default: WORK/model")
    p.add_argument("--tiny", action="store_true", help="CPU dry run with the tests' tiny model")
    p.add_argument("--gpus", type=int, default=1, help="GPUs on this host (1 or 2)")
    p.add_argument("--rows", default="", help="comma-separated rows (default: all for --gpus)")
    p.add_argument("--pages", type=int, default=0, help="pages per row (1,024; tiny 8)")
    p.add_argument("--per-file", type=int, default=0, help="pages per PDF (8; tiny 4)")
    p.add_argument("--api-servers", type=int, default=0, help="per GPU (8; tiny 2)")
    p.add_argument("--servers-per-gpu", type=int, default=1, help="for 2gpu_per_gpu")
    p.add_argument("--max-num-seqs", type=int, default=None, help="per server (256)")
    p.add_argument("--warm-pages", type=int, default=0, help="warm-up pages (256; tiny 4)")
    p.add_argument("--one-page", type=int, default=0,
                   help="one-page files into the idle daemon after ocrd's run (0: none)")
    p.add_argument("--direct-pages", type=int, default=0,
                   help="pages straight to each row's servers before ocrd's (0: none)")
    p.add_argument("--direct-after", action="store_true",
                   help="the plain client's pages after ocrd's (and the one-page files)")
    p.add_argument("--direct-in-flight", type=int, default=0, metavar="N",
                   help="the plain client's pages in flight (default: ocrd's)")
    p.add_argument("--direct-also", type=lambda t: [direct_shape(x) for x in t.split(",") if x],
                   default=[], metavar="N[rS|sS],...",
                   help="after the plain client's run, the same pages again with N in flight "
                        "(NrS: the first N spread over S seconds; NsS: each server S s "
                        "after the previous one)")
    p.add_argument("--kill", default="", help="kill one server of this row a third in")
    p.add_argument("--quiet", type=float, default=1.0, help="inbox quiet_seconds")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    for k, v in common.ENV.items():
        os.environ.setdefault(k, v)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tiny = args.tiny
    args.pages = args.pages or (8 if tiny else 1024)
    args.per_file = args.per_file or (4 if tiny else 8)
    args.api_servers = args.api_servers or (2 if tiny else 8)
    args.warm_pages = args.warm_pages or (4 if tiny else 256)
    args.out.mkdir(parents=True, exist_ok=True)
    args.model = args.model or args.work / ("tiny-model" if tiny else "model")
    if not (args.model / "config.json").exists():
        if tiny:
            from tests.vllm_engine.tiny_model import build

            build(args.model)
        else:
            inputs.build_model(args.model)
    rows = [r for r in args.rows.split(",") if r] or (ROWS_TWO if args.gpus > 1 else ROWS_ONE)
    pdfs = inputs.make_pdfs(args.work / "multi_pdfs", args.pages, args.per_file, 600_000)
    warm_urls = inputs.data_urls(range(700_000, 700_000 + args.warm_pages))
    direct_urls = inputs.data_urls(range(800_000, 800_000 + args.direct_pages))
    singles = [inputs.make_pdfs(args.work / f"multi_single{i}", 1, 1, 950_000 + i)[0]
               for i in range(args.one_page)]
    machine = host()
    print("HOST", json.dumps(machine), flush=True)
    results: list[dict] = []
    for name in rows:
        try:
            results.append(run_row(name, args, pdfs, warm_urls, direct_urls, singles))
        except Exception as e:  # noqa: BLE001 - the next row still runs
            results.append({"config": name, "error": f"{type(e).__name__}: {e}"[:3000]})
            print("ROW FAILED", name, results[-1]["error"], flush=True)
        common.save(args.out, "multi", {"rows": results, "gpu": Busy.query(),
                                     "host": machine, "knobs": common.knobs()})
    text = table(results)
    (args.out / "report_multi.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
