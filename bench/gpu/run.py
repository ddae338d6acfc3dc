"""DeepSeek-OCR-2 on one GPU: vLLM alone against ocrd end to end, side by side.

    bash bench/gpu/run.sh all          # on the GPU machine (installs the carried bundle)
    python bench/gpu/run.py PHASE ...      # one phase (the script above runs them in order)
    python bench/gpu/run.py all --tiny     # dry run on a CPU with the tests' tiny model

Full-size DeepSeek-OCR-2 architecture, dummy weights (`load_format=dummy`), so every
page generates exactly T output tokens (ignore_eos for vLLM alone; the benchmark-only
logits processor bench.gpu.logits:BanEos for the daemon's requests). Every page is a
different A4 image (1190×1684 at 144 dpi → 2×3 tiles, 1121 image tokens). Phases:

  offline   One engine with ocrd's fast-encoder model, switched between vLLM's encoder
            path and ocrd's (apply_model): the encoder alone on A4-shaped inputs (ms
            per page, largest difference of the embeddings); vLLM alone: `LLM.generate`
            of all pages at once (the baseline), with either encoder path; the cost of
            preparing one page on the front-end thread (A4 and at the tile grid's size);
            GPU-only ceilings: pages prepared untimed, then decoded with vLLM's encoder
            path, and with ocrd's with no n-gram ban, vLLM's ban and ocrd's.
  managed   ocrd's daemon with engine.vllm.api_servers=N (a supervised local
            `vllm serve --api-server-count N`): a plain HTTP client straight to that server
            (the direct configuration), then PDFs dropped into the inbox until every .md
            exists, one-page latency on the idle daemon, a killed server restarted by the
            supervisor, a clean stop with no process left.
  inproc    ocrd's daemon with the in-process engine (api_servers: 1).
  report    the table and the ratios from the phases' JSON files.

Results go to OUT (default /tmp/gpu-out) as results_PHASE.json; bench/GPU_RESULTS.md
records what was measured. The phases live in their own modules: gpu_offline.py (with
gpu_encoder.py, run inside vLLM's worker), gpu_daemon.py (managed and inproc, the daemon
through the tests' harness), gpu_report.py; what they share in gpu_common.py,
gpu_inputs.py and gpu_measure.py.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu import measure as gpu_measure  # noqa: E402
from bench.gpu.common import ENV, sizes  # noqa: E402
from bench.gpu.daemon import ENCODER_SETTING, phase_daemon  # noqa: E402
from bench.gpu.inputs import build_model  # noqa: E402
from bench.gpu.measure import end_sessions, gpu_processes  # noqa: E402
from bench.gpu.offline import phase_offline  # noqa: E402
from bench.gpu.report import report  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("phase", choices=["model", "offline", "managed", "inproc", "report", "all",
                                      "cleanup"])
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu-work"))
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu-out")))
    p.add_argument("--model", type=Path, default=None, help="model folder (default: WORK/model)")
    p.add_argument("--tiny", action="store_true", help="CPU dry run with the tests' tiny model")
    p.add_argument("--api-servers", type=int, default=None)
    p.add_argument("--quiet", type=float, default=5.0, help="inbox quiet_seconds")
    p.add_argument("--vllm-ngram", action="store_true",
                   help="daemon phases: vLLM's own n-gram processor instead of ocrd's")
    p.add_argument("--stock-encoder", action="store_true",
                   help="daemon phases: engine.vllm.fast_encoder false (vLLM's encoder path)")
    p.add_argument("--restart", action="store_true", help="managed: kill the server once")
    p.add_argument("--direct-pages", type=int, default=None,
                   help="managed: pages for the direct client (default: --pages; 0: none)")
    p.add_argument("--direct-again", action="store_true",
                   help="managed: feed the server directly again after ocrd's run")
    p.add_argument("--merge", type=Path, action="append", default=[],
                   help="report: also the results in this folder (repeatable)")
    p.add_argument("--only", default="", help="offline: some of encoder,baseline,"
                   "baseline_page,baseline_batched, and ceiling_LABEL for the labels of "
                   "CEILINGS (ceiling_page_ocrd, ...) (default: all)")
    p.add_argument("--ceiling-pages", default="",
                   help="offline: pages per GPU-only ceiling, comma-separated (256)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="pages decoded at once (default 256 on a GPU)")
    p.add_argument("--profile", type=int, default=0,
                   help="seconds of py-spy on the engine core during each measured run "
                   "(OUT/pyspy_ROW.txt; 0: off)")
    p.add_argument("--profile-delay", type=float, default=20,
                   help="seconds into each run before py-spy starts")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="one more vLLM engine argument (engine.vllm.engine_args; as a "
                   "`vllm serve` flag in the managed phase), VALUE read as YAML; e.g. "
                   "mm_tensor_ipc=torch_shm")
    p.add_argument("--profile-native", action="store_true",
                   help="--profile with C/C++ frames (py-spy --native pauses the engine "
                   "core per sample: the profiled rows' rates are not comparable)")
    p.add_argument("--pages", type=int, default=0,
                   help="daemon phases: pages for ocrd and the direct client (768 / 256)")
    p.add_argument("--pages-in-flight", type=int, default=0,
                   help="daemon phases: schedule.pages_in_flight (0: the engine's choice; "
                   "the direct client keeps as many in flight)")
    p.add_argument("--paced", type=float, default=0.0,
                   help="offline: run the chosen GPU-only ceilings paced, at most this many "
                   "pages/s arriving (vLLM's front ends: ~40 with 8) and --paced-in-flight "
                   "in the engine, instead of all at once")
    p.add_argument("--paced-in-flight", type=int, default=288,
                   help="offline, --paced: pages in the engine at once (the managed "
                   "daemon's 256 + 4 per front end)")
    p.add_argument("--kernels", default="",
                   help="offline: windows AT:SECONDS,... (seconds into each GPU-only run) "
                   "in which PyTorch's profiler records the worker's CUDA kernels: busy "
                   "share, time per step, per kernel class (bench/gpu/kernel_profile.py)")
    p.add_argument("--repeat", type=int, default=1,
                   help="offline: run the chosen GPU-only ceilings this many times in "
                   "alternating order, after a short warm-up pass")
    p.add_argument("--encoder-mode", choices=sorted(ENCODER_SETTING), default="auto",
                   help="daemon phases: engine.vllm.batch_encoder null (auto: batched on a "
                   "GPU, the default), true (batched) or false (page by page); round 2's "
                   "--batch-encoder was unpadded batching")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    gpu_measure.PYSPY_NATIVE = args.profile_native
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    # a timeout's SIGTERM unwinds (finally: blocks stop the daemon) instead of vanishing
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.phase == "cleanup":
        f = args.work / "sessions.txt"
        ids = {int(x) for x in f.read_text().split()} if f.exists() else set()
        print("CLEANUP killed", end_sessions(ids), "GPU", gpu_processes())
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.model is None:
        args.model = args.work / ("tiny-model" if args.tiny else "model")
    if not (args.model / "config.json").exists() and args.phase != "report":
        if args.tiny:
            from tests.vllm_engine.tiny_model import build

            build(args.model)
        else:
            build_model(args.model)
    n = args.api_servers or sizes(args.tiny)["api_servers"]
    if args.phase == "offline":
        phase_offline(args)
    elif args.phase == "managed":
        phase_daemon(args, n)
    elif args.phase == "inproc":
        phase_daemon(args, 1)
    elif args.phase == "all":
        for phase in ("managed", "inproc", "offline"):
            subprocess.run([sys.executable, __file__, phase, *sys.argv[2:]], check=False)
    if args.phase in ("report", "all"):
        print(report(args.out, args.merge))


if __name__ == "__main__":
    random.seed(0)
    main()
