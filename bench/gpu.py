"""DeepSeek-OCR-2 on one GPU: vLLM alone against ocrd end to end, side by side.

    bash bench/gpu_run.sh all          # on the GPU machine (installs the carried bundle)
    python bench/gpu.py PHASE ...      # one phase (the script above runs them in order)
    python bench/gpu.py all --tiny     # dry run on a CPU with the tests' tiny model

Full-size DeepSeek-OCR-2 architecture, dummy weights (`load_format=dummy`), so every
page generates exactly T output tokens (ignore_eos for vLLM alone; the benchmark-only
logits processor bench.gpu_lp:BanEos for the daemon's requests). Every page is a
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
records what was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = "<image>\n<|grounding|>Convert the document to markdown. "
A4 = (1190, 1684)  # 144 dpi
GRID = (1536, 2304)  # the 2×3 grid of 768 px tiles that an A4 page is resized to
VOCAB = 129280
NGRAM_ARGS = {"ngram_size": 30, "window_size": 90, "whitelist_token_ids": [128821, 128822]}
SERVER_PORT = 8765
VLLM_NGRAM = "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor"
OCRD_NGRAM = "ocrd.vllm_model.ngram:NGramBanLogitsProcessor"  # ocrd's production default
BAN_EOS = "bench.gpu_lp:BanEos"
ENV = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0", "PYTHONUNBUFFERED": "1",
}


# ---- sizes: GPU or the tiny CPU dry run ------------------------------------------------

def sizes(tiny: bool) -> dict[str, Any]:
    if tiny:
        return {"T": 16, "baseline_pages": 8, "ceiling_pages": 8, "prerender": 4,
                "encoder_pages": 2,
                "direct_pages": 8, "ocrd_pages": 8, "inproc_pages": 8, "per_file": 4,
                "latency_n": 2, "max_num_seqs": 4, "api_servers": 2, "timeout": 600}
    return {"T": 1024, "baseline_pages": 256, "ceiling_pages": 256, "prerender": 16,
            "encoder_pages": 8,
            "direct_pages": 768, "ocrd_pages": 768, "inproc_pages": 256, "per_file": 8,
            "latency_n": 3, "max_num_seqs": 256, "api_servers": 8, "timeout": 400}


def engine_settings(tiny: bool, model: Path, max_num_seqs: int | None = None,
                    extra_args: list[str] | None = None) -> dict[str, Any]:
    """EngineConfig fields shared by the phases (recipe settings, 1024 tokens);
    `extra_args`: --engine-arg KEY=VALUE items (VALUE read as YAML) for engine_args."""
    s = sizes(tiny)
    vllm: dict[str, Any] = {"dtype": "bfloat16", "max_model_len": 8192,
                            "gpu_memory_utilization": 0.85,
                            "max_num_seqs": max_num_seqs or s["max_num_seqs"]}
    engine_args: dict[str, Any] = {"load_format": "dummy", "seed": 0}
    if tiny:
        from tests.vllm_engine.conftest import TINY_ENGINE_ARGS, TINY_VLLM

        vllm.update(TINY_VLLM)
        engine_args.update(TINY_ENGINE_ARGS)
    import yaml

    for item in extra_args or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--engine-arg wants KEY=VALUE, got {item!r}")
        engine_args[key.strip()] = yaml.safe_load(value)
    vllm["engine_args"] = engine_args
    # max_tokens=T with EOS banned: "length" every time, which is no loop here
    return {"kind": "vllm", "model": str(model), "max_tokens": s["T"], "loop_retries": 0,
            "request_timeout_seconds": 900, "vllm": vllm}


def tiny_env() -> dict[str, str]:
    from tests.vllm_engine.conftest import ENV as TINY
    from tests.vllm_engine.conftest import PLUGIN_DIR

    return {**TINY, "PYTHONPATH": os.pathsep.join(
        [str(PLUGIN_DIR), str(ROOT), os.environ.get("PYTHONPATH", "")])}


# ---- inputs ----------------------------------------------------------------------------

def build_model(out: Path) -> Path:
    """Full-size DeepSeek-OCR-2 config (as deepseek-ai/DeepSeek-OCR-2, no head_dim: the
    guard must supply it) and a tokenizer with all 129,280 ids, so that generated ids
    detokenize like real ones (the CPU tests' tokenizer has ~400)."""
    from transformers import LlamaTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    bos, eos, unk, pad = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<unk>",
                          "<｜▁pad▁｜>")
    special = ["<image>", "<|grounding|>", "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>"]
    vocab = {unk: 0, bos: 1, eos: 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in ["▁"] + [chr(c) for c in range(33, 127)]:
        vocab.setdefault(ch, len(vocab))
    i = 0
    while len(vocab) < VOCAB - 1 - len(special):
        vocab[f"▁w{i}"] = len(vocab)
        i += 1
    tok = LlamaTokenizerFast(vocab=vocab, merges=[], bos_token=bos, eos_token=eos,
                             unk_token=unk, add_bos_token=True, add_eos_token=False,
                             legacy=False, add_prefix_space=False)
    tok.add_special_tokens({"pad_token": pad, "additional_special_tokens": special})
    tok.model_max_length = 8192
    assert len(tok) == VOCAB, len(tok)
    tok.save_pretrained(str(out))
    text = {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "vocab_size": VOCAB, "hidden_size": 1280, "intermediate_size": 6848,
        "moe_intermediate_size": 896, "num_hidden_layers": 12, "num_attention_heads": 10,
        "num_key_value_heads": 10, "kv_lora_rank": None, "q_lora_rank": None,
        "qk_nope_head_dim": 0, "qk_rope_head_dim": 0, "v_head_dim": 0, "use_mla": False,
        "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "topk_method": "greedy",
        "n_group": 1, "topk_group": 1, "norm_topk_prob": False,
        "routed_scaling_factor": 1.0, "scoring_func": "softmax",
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "attention_bias": False, "bos_token_id": 1,
        "eos_token_id": 2, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    config = {
        "architectures": ["DeepseekOCR2ForCausalLM"], "model_type": "deepseek_vl_v2",
        "candidate_resolutions": [[1024, 1024]], "global_view_pos": "head",
        "tile_tag": "2D", "language_config": text,
        "projector_config": {"model_type": "mlp_projector", "projector_type": "linear",
                             "input_dim": 896, "n_embed": 1280},
        "vision_config": {"image_size": 1024, "model_type": "vision", "width": 896},
        "vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def page_image(seed: int, size: tuple[int, int] = A4) -> Any:
    """A document-like page: dark 'words' on lines, with a unique stamp per seed."""
    import numpy as np
    from PIL import Image, ImageDraw

    w, h = size
    rng = np.random.default_rng(seed % 64)
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    s = w / A4[0]
    y = int(80 * s)
    while y < h - 80 * s:
        x = int(80 * s)
        while x < w - 120 * s:
            ww = int(rng.integers(20, 110) * s)
            d.rectangle([x, y, x + ww, y + int(14 * s)],
                        fill=tuple(int(v) for v in rng.integers(0, 90, 3)))
            x += ww + int(rng.integers(8, 20) * s)
        y += int((24 + int(rng.integers(0, 10))) * s)
    d.rectangle([8, 8, 72, 40], fill=(seed % 251, (seed // 251) % 251, 7))
    d.rectangle([w - 72, h - 40, w - 8, h - 8], fill=(200, seed % 241, (seed // 241) % 241))
    return img


def _write_pdf(job: tuple[str, list[int]]) -> str:
    path, seeds = job
    pages = [page_image(s) for s in seeds]
    pages[0].save(path, "PDF", save_all=True, append_images=pages[1:], resolution=144.0)
    return path


def make_pdfs(folder: Path, n_pages: int, per_file: int, seed0: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    jobs = []
    for k, first in enumerate(range(0, n_pages, per_file)):
        seeds = [seed0 + first + j for j in range(min(per_file, n_pages - first))]
        jobs.append((str(folder / f"doc{seed0}_{k:04d}.pdf"), seeds))
    with multiprocessing.Pool(min(16, os.cpu_count() or 2)) as pool:
        return [Path(p) for p in pool.map(_write_pdf, jobs)]


def _data_url(job: tuple[int, tuple[int, int]]) -> str:
    from ocrd.engines.remote import image_data_url

    return image_data_url(page_image(job[0], job[1]))


def data_urls(seeds: range, size: tuple[int, int] = A4) -> list[str]:
    """Pages as ocrd sends them (PNG data URLs), made before any timing."""
    with multiprocessing.Pool(min(16, os.cpu_count() or 2)) as pool:
        return pool.map(_data_url, [(s, size) for s in seeds])


# ---- measuring helpers -------------------------------------------------------------------

class Sampler:
    """Calls `sample()` every 0.5 s on a background thread inside a `with` block."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.sample()

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


class GpuMemory(Sampler):
    """Peak GPU memory in use and the GPU's busy share (nvidia-smi, every 0.5 s) while a
    phase runs."""

    def __init__(self) -> None:
        super().__init__()
        self.peak: int | None = None
        self.samples: list[tuple[float, int]] = []
        self.busy: list[tuple[float, int]] = []  # (monotonic time, utilization.gpu %)

    @staticmethod
    def query() -> tuple[int, int] | None:
        """(MiB in use, % of the last sample period a kernel ran)."""
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,utilization.gpu",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=10).stdout
            used, util = out.splitlines()[0].split(",")
            return int(used), int(util)
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None

    @classmethod
    def used(cls) -> int | None:
        q = cls.query()
        return q[0] if q else None

    def sample(self) -> None:
        q = self.query()
        if q is not None:
            now = time.monotonic()
            self.samples.append((round(now - self.t0, 1), q[0]))
            self.busy.append((now, q[1]))
            self.peak = max(self.peak or 0, q[0])

    def busy_between(self, t0: float, t1: float) -> float | None:
        """Mean GPU utilisation (%) between two time.monotonic() readings."""
        xs = [u for t, u in self.busy if t0 <= t <= t1]
        return round(sum(xs) / len(xs), 1) if xs else None


class Gauges(Sampler):
    """Prometheus gauges sampled every 0.5 s while a phase runs: vLLM's requests running
    and waiting in the engine (the server's /metrics) and ocrd's pages in flight (the
    daemon's), to see whether the engine was kept full."""

    WANTED = ("vllm:num_requests_running", "vllm:num_requests_waiting",
              "vllm:kv_cache_usage_perc", "ocrd_pages_in_flight", "ocrd_queue_depth")

    def __init__(self, urls: list[str]) -> None:
        super().__init__()
        self.urls = urls
        self.samples: list[tuple[float, dict[str, float]]] = []

    @classmethod
    def parse(cls, text: str) -> dict[str, float]:
        """Each wanted gauge's largest value over its label sets (with several API
        servers, each may report the one engine's gauge)."""
        out: dict[str, float] = {}
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in cls.WANTED:
                try:
                    value = float(line.rsplit(" ", 1)[1])
                except (IndexError, ValueError):
                    continue
                out[name] = max(out.get(name, value), value)
        return out

    def sample(self) -> None:
        import urllib.request

        now, values = time.monotonic(), {}
        for url in self.urls:
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    values.update(self.parse(resp.read().decode()))
            except OSError:
                continue
        if values:
            self.samples.append((now, values))

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """Mean of each gauge between two time.monotonic() readings."""
        rows = [v for t, v in self.samples if t0 <= t <= t1]
        names = sorted({k for v in rows for k in v})
        return {f"mean_{k.replace('vllm:', 'vllm_')}": round(
            statistics.fmean(v[k] for v in rows if k in v), 2) for k in names}


def live_processes() -> Iterator[tuple[int, int, str]]:
    """(pid, session id, command line) of every live (not zombie) process."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[-1].split()
            cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if stat[0] != "Z":
            yield int(entry.name), int(stat[3]), cmd.decode(errors="replace")


def engine_core_pids() -> list[int]:
    """vLLM's engine core processes (they name themselves VLLM::EngineCore...)."""
    return [pid for pid, _, cmd in live_processes() if "EngineCore" in cmd]


def py_spy() -> str | None:
    """py-spy from PATH or from a --target install on PYTHONPATH (gpu_run.sh's)."""
    found = shutil.which("py-spy")
    for entry in [*os.environ.get("PYTHONPATH", "").split(os.pathsep), sys.prefix]:
        if not found and entry and (Path(entry) / "bin" / "py-spy").exists():
            found = str(Path(entry) / "bin" / "py-spy")
    return found


# --profile-native: py-spy also samples C/C++ frames, pausing the engine core for each
# sample (py-spy cannot read native stacks otherwise): a diagnosis, not a measured row
PYSPY_NATIVE = False


def profile_engine_core(out: Path, name: str, delay: float, seconds: int) -> threading.Thread:
    """After `delay` s, sample the engine core's Python stacks for `seconds` s (py-spy,
    every thread, idle frames included, without pausing it unless PYSPY_NATIVE) into
    OUT/pyspy_NAME.txt (collapsed stacks). Runs beside the measured run; the same for
    every row compared."""

    def run() -> None:
        time.sleep(delay)
        exe, pids = py_spy(), engine_core_pids()
        note = out / f"pyspy_{name}.txt"
        if not exe or not pids:
            note.write_text(f"no py-spy ({exe}) or no engine core ({pids})\n")
            return
        mode = ["--native"] if PYSPY_NATIVE else ["--nonblocking"]
        r = subprocess.run([exe, "record", "--pid", str(pids[0]), "--duration", str(seconds),
                            "--rate", "50", *mode, "--idle", "--threads",
                            "--format", "raw", "--output", str(note)],
                           capture_output=True, text=True, timeout=seconds + 60)
        if r.returncode:
            note.write_text(f"py-spy rc={r.returncode}: {r.stderr[-2000:]}\n")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def gpu_processes() -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=10).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        return []


def session_processes(sessions: set[int]) -> list[str]:
    """Live processes (not zombies) in the given sessions: what our daemon (its own
    session) and its vLLM server (another one) left behind. Nothing else is touched."""
    return [f"{pid} {cmd[:160]}" for pid, sid, cmd in live_processes() if sid in sessions]


def save(out: Path, phase: str, data: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"results_{phase}.json").write_text(json.dumps(data, indent=1))


def knobs() -> dict[str, str]:
    """ocrd's environment settings of this run (OCRD_VLLM_ENCODER_BUCKETS=0 etc.)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("OCRD_")}


def row(name: str, pages: int, seconds: float, **extra: Any) -> dict[str, Any]:
    r = {"config": name, "pages": pages, "wall_s": round(seconds, 2),
         "pages_per_s": round(pages / seconds, 3) if seconds > 0 else None, **extra}
    print("ROW", json.dumps(r), flush=True)
    return r


# ---- phase: vLLM alone -----------------------------------------------------------------

# (encoder mode, n-gram ban, label): vLLM's encoder path first (the round-1 ceiling),
# then ocrd's modes; bans: none, ocrd's (production), vLLM's
CEILINGS = (("stock", None, "stock_no"), ("page", None, "page_no"),
            ("batched", None, "batched_no"), ("padded", None, "padded_no"),
            ("page", "fast", "page_ocrd"), ("batched", "fast", "batched_ocrd"),
            ("padded", "fast", "padded_ocrd"), ("page", "vllm", "page_vllm"),
            ("padded", "fast_old", "padded_ocrd_old"),
            ("padded_fused", None, "padded_fused_no"),
            ("padded_fused", "fast", "padded_fused_ocrd"),
            ("padded_fused_graphs", None, "padded_fused_graphs_no"),
            ("padded_fused_graphs", "fast", "padded_fused_graphs_ocrd"),
            ("padded_fused_graphs", "fast_scan", "padded_fused_graphs_ocrd_scan"),
            ("bucketed_fused_graphs", None, "bucketed_fused_graphs_no"),
            ("bucketed_fused_graphs", "fast", "bucketed_fused_graphs_ocrd"))


def phase_offline(args: argparse.Namespace) -> None:
    s = sizes(args.tiny)
    T = s["T"]
    env = tiny_env() if args.tiny else {}
    os.environ.update(env)
    if args.tiny:
        sys.path.insert(0, env["PYTHONPATH"].split(os.pathsep)[0])
    result: dict[str, Any] = {"phase": "offline", "rows": [], "T": T, "knobs": knobs()}
    t0 = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from ocrd.engines.vllm_args import HeadDimGuard
    from ocrd.vllm_model import plugin

    result["vllm"] = vllm.__version__
    result["import_s"] = round(time.perf_counter() - t0, 1)
    settings = engine_settings(args.tiny, args.model, args.max_num_seqs,
                               args.engine_arg)["vllm"]
    kwargs = {**{k: v for k, v in settings.items() if k != "engine_args"},
              **settings["engine_args"]}
    guard = HeadDimGuard()
    # ocrd's fast encoder model (its vLLM plugin, found through the .dist-info that
    # gpu_run.sh writes); stock and fast are then compared inside this one engine by
    # switching the model's path (apply_model sends the switch: needs pickled callables)
    os.environ[plugin.ENV] = "1"
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    plugin.use(True)
    result["plugin_installed"] = plugin.installed()
    with GpuMemory() as mem:
        t0 = time.perf_counter()
        llm = LLM(model=str(args.model), enable_prefix_caching=False, mm_processor_cache_gb=0,
                  limit_mm_per_prompt={"image": 1}, hf_overrides=guard,
                  logits_processors=["bench.gpu_lp:VllmNGramIfAsked",
                                     "bench.gpu_lp:FastNGramIfAsked",
                                     "bench.gpu_lp:OldNGramIfAsked",
                                     "bench.gpu_lp:ScanNGramIfAsked"], **kwargs)
        result["engine_start_s"] = round(time.perf_counter() - t0, 1)
        result["gpu_mem_after_start_mib"] = GpuMemory.used()
        eng = llm.llm_engine
        try:
            result["head_size"] = eng.model_config.get_head_size()
            result["kv_cache_blocks"] = eng.vllm_config.cache_config.num_gpu_blocks
        except Exception:  # noqa: BLE001 - informational
            pass
        result["model_class"] = llm.apply_model(_model_class)[0]
        print("ENGINE", json.dumps(result), flush=True)
        only = set(args.only.split(",")) if args.only else None

        def encoder(mode: str) -> None:
            llm.apply_model(functools.partial(_set_mode, mode=mode))

        if not only or "encoder" in only:
            result["encoder"] = llm.apply_model(functools.partial(
                _encoder_bench, pages=s["encoder_pages"]))[0]
            print("ENCODER", json.dumps(result["encoder"]), flush=True)
            save(args.out, "offline", result)

        def requests(seed0: int, n: int, size: tuple[int, int] = A4) -> list[dict]:
            return [{"prompt": PROMPT, "multi_modal_data": {"image": page_image(seed0 + i, size)}}
                    for i in range(n)]

        def params(t: int, ngram: str | None = None, final_only: bool = False) -> Any:
            extra = {**NGRAM_ARGS, "bench_ngram": ngram} if ngram else None
            kind = {"output_kind": RequestOutputKind.FINAL_ONLY} if final_only else {}
            return SamplingParams(temperature=0, max_tokens=t, ignore_eos=True,
                                  detokenize=True, skip_special_tokens=False, extra_args=extra,
                                  **kind)

        def generate(name: str, reqs: list[dict], t: int, ngram: str | None = None) -> None:
            if args.profile and name != "warmup":
                profile_engine_core(args.out, name, args.profile_delay, args.profile)
            t0, m0 = time.perf_counter(), time.monotonic()
            outs = llm.generate(reqs, params(t, ngram), use_tqdm=False)
            dt = time.perf_counter() - t0
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            result["rows"].append(row(name, len(reqs), dt, T=t, out_tokens=tokens,
                                      prompt_tokens=len(outs[0].prompt_token_ids),
                                      gpu_busy_pct=mem.busy_between(m0, m0 + dt)))
            save(args.out, "offline", result)

        generate("warmup", requests(10_000, 8), 32)
        if not only or "baseline" in only:
            encoder("stock")
            generate("vllm_offline_all_at_once", requests(20_000, s["baseline_pages"]), T)
        for i, mode in enumerate(("page", "batched")):
            if not only or f"baseline_{mode}" in only:
                encoder(mode)
                generate(f"vllm_offline_all_at_once_{mode}_encoder",
                         requests(25_000 + 1000 * i, s["baseline_pages"]), T)

        # Decoding alone: text prompts (no image, no encoder), the same output length and
        # ban: what the engine does per step without the vision side
        if not only or "decode_text" in only:
            generate("decode_only_text_prompts_ocrd_ngram",
                     [{"prompt": f"Page {i}: write the text of a long document."}
                      for i in range(s["ceiling_pages"])], T, "fast")

        # The front end's own cost per page: vLLM's input processing, A4 and grid-sized.
        renderer = eng.renderer
        prepared = {}
        for label, size in (("a4", A4), ("grid", GRID)):
            reqs = requests(30_000, s["prerender"], size)
            t0 = time.perf_counter()
            prepared[label] = renderer.render_cmpl(reqs)
            ms = (time.perf_counter() - t0) / len(reqs) * 1000
            result[f"frontend_ms_per_page_{label}"] = round(ms, 1)
            print(f"FRONTEND {label} {ms:.1f} ms/page", flush=True)
        save(args.out, "offline", result)

        def decode_prepared(name: str, n: int, ngram: str | None, T: int = T,
                            rate: float = 0.0) -> None:
            """GPU-only: inputs prepared untimed, copies with their own hashes (so the
            vision encoder runs for every page). rate 0: all submitted at once; else
            paced like a served engine: at most `rate` pages/s arrive (vLLM's front
            ends) and at most --paced-in-flight are in the engine, each finished page
            making room for the next (the steady state, where pages trickle in)."""
            base = prepared["a4"]
            sp = params(T, ngram, final_only=True)
            outs, done = [], []
            in_flight = args.paced_in_flight if rate else n
            if args.profile:
                profile_engine_core(args.out, name, args.profile_delay, args.profile)
            t0, m0 = time.perf_counter(), time.monotonic()
            added = 0
            while added < n or eng.has_unfinished_requests():
                due = n if not rate else min(n, int((time.perf_counter() - t0) * rate) + 1)
                while added < min(due, len(outs) + in_flight):
                    item = dict(base[added % len(base)])
                    item["mm_hashes"] = {"image": [f"{name}-{added}"]}
                    item["arrival_time"] = time.time()
                    eng.add_request(f"{name}-{added}", item, sp)
                    added += 1
                if not eng.has_unfinished_requests():
                    time.sleep(0.001)  # paced: the next page is not due yet
                    continue
                finished = [o for o in eng.step() if o.finished]
                outs += finished
                done += [(time.monotonic(), 1) for _ in finished]
            dt = time.perf_counter() - t0
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            # how repetitive the (dummy-weight) text is: the n-gram scan's cost follows it
            distinct = sorted(len(set(o.outputs[0].token_ids)) for o in outs)
            result["rows"].append(row(name, n, dt, T=T, out_tokens=tokens,
                                      ngram=ngram or "none",
                                      distinct_tokens_p50=distinct[len(distinct) // 2]
                                      if distinct else None,
                                      gpu_busy_pct=mem.busy_between(m0, m0 + dt),
                                      **({"arrival_rate": rate, "in_flight": in_flight,
                                          **flow(m0, done)} if rate else {})))
            save(args.out, "offline", result)

        # several sizes: with max_num_seqs above 256, how much more the GPU does at once
        counts = [int(x) for x in args.ceiling_pages.split(",")] if args.ceiling_pages else [
            s["ceiling_pages"]]
        chosen = [c for c in CEILINGS if not only or f"ceiling_{c[2]}" in only]
        if chosen and args.repeat > 1:  # a first, short pass takes the JIT compiles
            encoder(chosen[0][0])
            decode_prepared("warm_ceiling", s["ceiling_pages"], chosen[0][1], T=64)
        for n in counts:
            for rep in range(args.repeat):  # alternating order, `repeat` times
                for mode, ngram, label in chosen:
                    encoder(mode)
                    size = "" if n == sizes(False)["ceiling_pages"] else f"_x{n}"
                    again = f"_r{rep + 1}" if args.repeat > 1 else ""
                    kind = "paced" if args.paced else "ceiling"
                    decode_prepared(f"gpu_only_{kind}_{label}_ngram{size}{again}", n, ngram,
                                    rate=args.paced)
        encoder("page")
    result["gpu_mem_peak_mib"] = mem.peak
    save(args.out, "offline", result)
    print("OFFLINE", json.dumps(result), flush=True)
    try:
        eng.engine_core.shutdown()
    except Exception as e:  # noqa: BLE001
        print("shutdown:", repr(e))
    sys.stdout.flush()
    os._exit(0)  # skip vLLM's slow teardown


# ---- run inside the engine's worker (LLM.apply_model) ---------------------------------

def _model_class(model: Any) -> str:
    return type(model).__name__


def _set_mode(model: Any, mode: str, chunks: tuple[int, int] | None = None) -> str | None:
    """stock: vLLM's encoder code; page / batched / padded / bucketed: ocrd's modes
    (padded: batched in calls of the full size; bucketed: of the full size or one of its
    halves, the default), optionally `_fused` (SAM's attention in ocrd's fused
    kernel) and `_graphs` (padded calls replayed as CUDA graphs). chunks: (global views,
    tiles) per call."""
    if not hasattr(model, "ocrd_set_fast"):
        return None
    import torch

    from ocrd.vllm_model import dsocr2_fast

    base, *flags = mode.split("_")
    model.ocrd_set_fast(base != "stock")
    model.ocrd_batched = base in ("batched", "padded", "bucketed")
    model.ocrd_padded = base in ("padded", "bucketed")
    model.ocrd_bucketed = base == "bucketed"
    model.ocrd_set_fused("fused" in flags)
    graphs = "graphs" in flags and model.ocrd_padded and torch.cuda.is_available()
    if graphs != bool(getattr(model, "ocrd_graphs", None)) or (chunks and graphs):
        model.ocrd_graphs = dsocr2_fast.EncoderGraphs() if graphs else None
    if chunks:
        model.ocrd_chunks = chunks
    return mode


ENCODER_MODES = (("stock", None), ("page", None), ("padded_fused", None),
                 ("padded_fused_graphs", None), ("bucketed_fused", None),
                 ("bucketed_fused_graphs", None), ("padded_fused_graphs", (4, 12)))
# the modes whose CUDA kernels are listed (where the time goes)
PROFILED = ("padded_fused_graphs",)
# page counts timed besides one page and `pages` (a step's new pages when they trickle)
FEW_PAGES = (2, 3, 4)


def _encoder_bench(model: Any, pages: int, reps: int = 3) -> dict[str, Any]:
    """vLLM's per-page encoder code against ocrd's modes on the same A4-shaped inputs (a
    global view and 2×3 tiles per page): wall time per page with the GPU synchronised
    (`pages` at once, and one page alone: a step's latency), how far the embeddings
    differ from vLLM's, and the GPU kernels that take the time."""
    import torch


    if not hasattr(model, "ocrd_set_fast"):
        return {"error": f"{type(model).__name__} is not ocrd's fast model"}
    default_chunks = model.ocrd_chunks
    p = next(model.sam_model.parameters())
    g = torch.Generator(device=p.device).manual_seed(0)
    pixel_values = torch.randn(pages, 3, 1024, 1024, device=p.device, dtype=p.dtype,
                               generator=g)
    crops = torch.randn(6 * pages, 3, 768, 768, device=p.device, dtype=p.dtype, generator=g)
    spatial = torch.tensor([[2, 3]] * pages, dtype=torch.long)
    out: dict[str, Any] = {"pages": pages, "mask_patched": model.ocrd_mask_patched,
                           "chunks_default": list(default_chunks),
                           "fused_layers": getattr(model, "ocrd_fused_layers", None)}
    sync = torch.cuda.synchronize if p.device.type == "cuda" else (lambda: None)
    embeddings = {}

    def timed(n: int) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            embeddings[label] = model._pixel_values_to_embedding(
                pixel_values[:n], crops[:6 * n], spatial[:n])
            sync()
            times.append(time.perf_counter() - t0)
        return round(min(times) / n * 1000, 2)

    with torch.inference_mode():
        for mode, chunks in ENCODER_MODES:
            label = mode if chunks is None else f"{mode}_{chunks[0]}x{chunks[1]}"
            _set_mode(model, mode, chunks or default_chunks)
            model._pixel_values_to_embedding(pixel_values[:2], crops[:12], spatial[:2])
            sync()
            out[f"{label}_one_page_ms"] = timed(1)
            alone = embeddings[label][0]
            out[f"{label}_few_pages_ms_per_page"] = {n: timed(n) for n in FEW_PAGES
                                                     if n < pages}
            out[f"{label}_ms_per_page"] = timed(pages)
            # batch invariance: page 0 alone and among `pages` others, the same numbers?
            out[f"{label}_page_alone_equal"] = bool(torch.equal(alone, embeddings[label][0]))
        _set_mode(model, "page", default_chunks)
        for label in embeddings:
            if label == "stock":
                continue
            pairs = list(zip(embeddings[label], embeddings["stock"], strict=True))
            out[f"{label}_max_abs_diff"] = max((a.float() - b.float()).abs().max().item()
                                               for a, b in pairs)
            out[f"{label}_shapes_equal"] = all(a.shape == b.shape for a, b in pairs)
        out["max_abs_value"] = max(b.float().abs().max().item() for b in embeddings["stock"])
        if p.device.type == "cuda":  # where each mode's encoder time goes
            from torch.profiler import ProfilerActivity, profile

            for mode in PROFILED:
                _set_mode(model, mode, default_chunks)
                model._pixel_values_to_embedding(pixel_values, crops, spatial)  # capture
                sync()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    model._pixel_values_to_embedding(pixel_values, crops, spatial)
                    sync()
                # CUDA activity only: the rows are kernels and copies (self time = time)
                rows = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
                total = sum(e.self_device_time_total for e in rows) / 1000
                out[f"profile_{mode}_gpu_ms_per_page"] = round(total / pages, 2)
                out[f"profile_{mode}_top"] = [
                    [e.key[:90], round(e.self_device_time_total / 1000 / pages, 2), e.count]
                    for e in rows[:15]]
    _set_mode(model, "page", default_chunks)
    return out


# ---- the daemon ------------------------------------------------------------------------

class Daemon:
    """`ocrd run` as a subprocess in its own session; JSON log to a file."""

    def __init__(self, root: Path, engine: dict, env: dict[str, str],
                 quiet_seconds: float, pages_in_flight: int = 0) -> None:
        self.root = root
        shutil.rmtree(root, ignore_errors=True)
        self.inbox, self.outbox, self.failed = root / "in", root / "out", root / "failed"
        self.appeared: dict[str, float] = {}
        for d in (self.inbox, self.outbox):
            d.mkdir(parents=True)
        self.config = {
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
        self.env = env
        self.log_path = root / "daemon.log"
        self.proc: subprocess.Popen | None = None
        self._events: list[dict] = []
        self._offset = 0

    def remember_sessions(self) -> set[int]:
        """Our daemon's session and its vLLM servers' ones, also in WORK/sessions.txt for
        `gpu.py cleanup` (the daemon and the server start their own sessions, which
        outlive a killed benchmark)."""
        sessions = {self.proc.pid} if self.proc else set()
        sessions |= {e["pid"] for e in self.events("vllm_server_starting") if "pid" in e}
        with open(self.root.parent.parent / "sessions.txt", "a") as f:
            f.write("".join(f"{pid}\n" for pid in sorted(sessions)))
        return sessions

    def start(self) -> float:
        import yaml

        (self.root / "config.yaml").write_text(yaml.safe_dump(self.config))
        logf = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ocrd", "run", "-c", str(self.root / "config.yaml")],
            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env}, start_new_session=True)
        logf.close()
        self.remember_sessions()
        return self.t_start

    def events(self, name: str) -> list[dict]:
        with open(self.log_path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        cut = data.rfind(b"\n") + 1
        self._offset += cut
        for line in data[:cut].splitlines():
            if line.startswith(b"{"):
                try:
                    self._events.append(json.loads(line))
                except ValueError:
                    pass
        return [e for e in self._events if e.get("event") == name]

    def wait_event(self, name: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.events(name)
            if found:
                return found[-1]
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited ({self.proc.returncode}) before {name}:\n"
                                   + self.log_path.read_text(errors="replace")[-4000:])
            time.sleep(0.2)
        raise TimeoutError(f"no {name} within {timeout} s")

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

    def stop(self, timeout: float = 120) -> float:
        t0 = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return time.monotonic() - t0

    def kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)


def end_sessions(sessions: set[int]) -> list[str]:
    """SIGKILL what is left of our own daemon's and server's sessions; what was left."""
    left = session_processes(sessions)
    for line in left:
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    return left


def flow(t0: float, done: list[tuple[float, int]]) -> dict[str, Any]:
    """How pages came out over time, from (monotonic time, pages) per finished item: the
    fill (first finished) and the rate between a quarter and three quarters of the pages
    done, which leaves out the pipeline's fill and its final drain (with dummy weights
    every page has the same length, so pages finish in waves: a long run is still the
    better measure)."""
    done = sorted(done)
    total = sum(n for _, n in done)
    if not done or total < 4:
        return {}
    cum, marks = 0, {}
    for t, n in done:
        cum += n
        for q in (0.25, 0.75):
            if q not in marks and cum >= q * total:
                marks[q] = (t, cum)
    (ta, ca), (tb, cb) = marks[0.25], marks[0.75]
    return {"first_done_s": round(done[0][0] - t0, 1),
            "middle_pages_per_s": round((cb - ca) / (tb - ta), 3) if tb > ta else None}


async def direct_http(url: str, model: str, urls: list[str], t: int,
                      concurrency: int, done: list[tuple[float, int]] | None = None
                      ) -> tuple[float, list[float]]:
    """All pages to `vllm serve` with a plain client: the same requests ocrd sends."""
    from ocrd.engines.remote import http_request

    bodies = [json.dumps({
        "model": model, "temperature": 0.0, "max_tokens": t, "skip_special_tokens": False,
        "vllm_xargs": NGRAM_ARGS,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": u}},
            {"type": "text", "text": PROMPT.removeprefix("<image>\n")}]}],
    }).encode() for u in urls]
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(body: bytes) -> None:
        async with sem:
            t1 = time.monotonic()
            resp = await http_request(url + "/chat/completions", "POST", body,
                                      {"Content-Type": "application/json"}, timeout=900)
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {resp.error_text()}")
            latencies.append(time.monotonic() - t1)
            if done is not None:
                done.append((time.monotonic(), 1))

    t0 = time.monotonic()
    await asyncio.gather(*(one(b) for b in bodies))
    return time.monotonic() - t0, latencies


ENCODER_SETTING = {"auto": None, "batched": True, "page": False}


def phase_daemon(args: argparse.Namespace, api_servers: int) -> None:
    s = sizes(args.tiny)
    T = s["T"]
    phase = "managed" if api_servers > 1 else "inproc"
    env = tiny_env() if args.tiny else {"PYTHONPATH": os.pathsep.join(
        [os.environ.get("PYTHONPATH", ""), str(ROOT)])}
    engine = engine_settings(args.tiny, args.model, args.max_num_seqs, args.engine_arg)
    engine["vllm"]["api_servers"] = api_servers
    engine["vllm"]["server_port"] = SERVER_PORT
    ngram = VLLM_NGRAM if args.vllm_ngram else OCRD_NGRAM
    engine["vllm"]["engine_args"]["logits_processors"] = [ngram, BAN_EOS]
    engine["vllm"]["fast_encoder"] = not args.stock_encoder
    engine["vllm"]["batch_encoder"] = ENCODER_SETTING[args.encoder_mode]
    result: dict[str, Any] = {"phase": phase, "api_servers": api_servers, "T": T,
                              "ngram": ngram, "fast_encoder": not args.stock_encoder,
                              "encoder_mode": args.encoder_mode, "knobs": knobs(),
                              "rows": []}
    work = args.work / phase
    n_ocrd = args.pages or (s["ocrd_pages"] if api_servers > 1 else s["inproc_pages"])
    n_direct = (args.direct_pages if args.direct_pages is not None
                else args.pages or s["direct_pages"])
    pdfs = make_pdfs(work / "pdfs", n_ocrd, s["per_file"], 100_000)
    singles = [make_pdfs(work / f"single{i}", 1, 1, 200_000 + i)[0]
               for i in range(s["latency_n"] + 1)]
    urls = data_urls(range(300_000, 300_000 + n_direct)) if api_servers > 1 else []
    d = Daemon(work / "daemon", engine, env, quiet_seconds=args.quiet,
               pages_in_flight=args.pages_in_flight)
    gauges = Gauges([f"http://127.0.0.1:{SERVER_PORT}/metrics",
                     f"http://{d.config['metrics']['listen']}/metrics"])
    with GpuMemory() as mem, gauges:
        t_start = d.start()
        try:
            ready = d.wait_event("ready", s["timeout"])
            d.remember_sessions()
            result["daemon_ready_s"] = round(time.monotonic() - t_start, 1)
            started = d.events("engine_started")
            result["engine_start_s"] = started[-1].get("seconds") if started else None
            result["gpu_mem_after_start_mib"] = GpuMemory.used()
            result["pages_in_flight"] = ready.get("pages_in_flight")
            print("READY", json.dumps(result), flush=True)
            server = f"http://127.0.0.1:{SERVER_PORT}/v1"
            def direct(name: str) -> None:
                done: list[tuple[float, int]] = []
                if args.profile:
                    profile_engine_core(args.out, name, args.profile_delay, args.profile)
                t0 = time.monotonic()
                dt, lat = asyncio.run(direct_http(server, str(args.model), urls, T,
                                                  result["pages_in_flight"], done))
                result["rows"].append(row(name, len(urls), dt, T=T,
                                          latency_p50_s=round(statistics.median(lat), 2),
                                          gpu_busy_pct=mem.busy_between(t0, t0 + dt),
                                          **flow(t0, done), **gauges.between(t0, t0 + dt)))
                save(args.out, phase, result)

            if api_servers > 1:
                # warm-up at full width: the first large batches compile kernels (vLLM
                # logs a Triton JIT of fused_moe_kernel), which no measured row should pay
                warm = data_urls(range(400_000, 400_000 + (8 if args.tiny else 256)))
                t0 = time.monotonic()
                asyncio.run(direct_http(server, str(args.model), warm, 64,
                                        result["pages_in_flight"]))
                result["warm_s"] = round(time.monotonic() - t0, 1)
                if urls:
                    direct(f"direct_http_vllm_serve_x{api_servers}")
            else:  # warm the in-process engine like the direct client warms the server
                t0 = d.drop([singles[-1]])
                d.wait_outputs([singles[-1].name], s["timeout"])
            name = (f"ocrd_e2e_managed_x{api_servers}" if api_servers > 1
                    else "ocrd_e2e_inprocess")
            if args.profile:
                profile_engine_core(args.out, name, args.profile_delay, args.profile)
            t0 = d.drop(pdfs)
            t1 = d.wait_outputs([p.name for p in pdfs], s["timeout"])
            seen = [(d.appeared[Path(p.name).stem + ".md"], s["per_file"]) for p in pdfs]
            result["rows"].append(row(name, n_ocrd, t1 - t0, T=T, files=len(pdfs),
                                      gpu_busy_pct=mem.busy_between(t0, t1),
                                      **flow(t0, seen), **gauges.between(t0, t1)))
            save(args.out, phase, result)
            if api_servers > 1 and args.direct_again and urls:  # the same server, after ocrd
                direct(f"direct_http_vllm_serve_x{api_servers}_again")
            # one page into the idle daemon, several times
            lat = []
            for p in singles[: s["latency_n"]]:
                time.sleep(1.0)
                t0 = d.drop([p])
                lat.append(d.wait_outputs([p.name], s["timeout"]) - t0)
            result["ocrd_one_page_s"] = [round(x, 2) for x in lat]
            result["ocrd_one_page_p50_s"] = round(statistics.median(lat), 2)
            if api_servers > 1:
                ttft, full = [], []
                for i in range(s["latency_n"]):
                    one = data_urls(range(500_000 + 2 * i, 500_002 + 2 * i))
                    ttft.append(asyncio.run(direct_http(server, str(args.model), one[:1],
                                                        1, 1))[0])
                    full.append(asyncio.run(direct_http(server, str(args.model), one[1:],
                                                        T, 1))[0])
                result["direct_first_token_s"] = [round(x, 3) for x in ttft]
                result["direct_first_token_p50_s"] = round(statistics.median(ttft), 3)
                result["direct_one_page_s"] = [round(x, 2) for x in full]
                result["decode_s"] = round(statistics.median(full) - statistics.median(ttft), 2)
            save(args.out, phase, result)
            if api_servers > 1 and args.restart:
                # the supervisor at work on the GPU: kill the server, drop a page
                # (its whole process group, as when the machine's OOM killer strikes)
                pid = d.events("vllm_server_ready")[-1]["pid"]
                n_ready = len(d.events("vllm_server_ready"))
                os.killpg(pid, signal.SIGKILL)
                t0 = d.drop([singles[-1]])
                t1 = d.wait_outputs([singles[-1].name], s["timeout"])
                while len(d.events("vllm_server_ready")) <= n_ready:
                    time.sleep(0.2)
                d.remember_sessions()
                result["restart"] = {
                    "page_after_kill_s": round(t1 - t0, 1),
                    "server_restart_s": d.events("vllm_server_ready")[-1].get("seconds")}
                print("RESTART", json.dumps(result["restart"]), flush=True)
        finally:
            sessions = d.remember_sessions()
            result["stop_s"] = round(d.stop(), 1)
            result["daemon_rc"] = d.proc.returncode if d.proc else None
            time.sleep(1)
            result["left_after_stop"] = session_processes(sessions)
            result["gpu_processes_after_stop"] = gpu_processes()
            result["gpu_mem_after_stop_mib"] = GpuMemory.used()
            d.kill()
            result["killed_after_stop"] = end_sessions(sessions)
            result["gpu_mem_peak_mib"] = mem.peak
            save(args.out, phase, result)
            shutil.copy(d.log_path, args.out / f"daemon_{phase}.log")
    print(phase.upper(), json.dumps(result), flush=True)


# ---- the report ------------------------------------------------------------------------

def report(out: Path, merge: list[Path] | None = None) -> str:
    """The table of every row in OUT's results (and those of --merge folders), with
    ratios against vLLM alone and ocrd against the best direct configuration."""
    res: dict[str, list[dict]] = {}
    for folder in [out, *(merge or [])]:
        for phase in ("offline", "managed", "inproc"):
            p = folder / f"results_{phase}.json"
            if p.exists():
                res.setdefault(phase, []).append(json.loads(p.read_text()))
    rows = [r for runs in res.values() for d in runs for r in d["rows"]
            if r["config"] != "warmup"]
    base = next((r["pages_per_s"] for r in rows if r["config"] == "vllm_offline_all_at_once"),
                None)
    lines = ["| configuration | pages | T | wall s | pages/s | × vLLM alone |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['pages_per_s'] / base:.2f}" if base and r["pages_per_s"] else "—"
        lines.append(f"| {r['config']} | {r['pages']} | {r.get('T')} | {r['wall_s']} | "
                     f"{r['pages_per_s']} | {ratio} |")
    ocrd = max((r["pages_per_s"] for r in rows if r["config"].startswith("ocrd_e2e")),
               default=None)
    direct = max((r["pages_per_s"] for r in rows
                  if r["config"].startswith(("direct_", "vllm_offline"))), default=None)
    same = max((r["pages_per_s"] for r in rows if r["config"].startswith("direct_")),
               default=None)
    if ocrd and direct:
        lines.append(f"\nocrd end to end, best: {ocrd:.2f} pages/s (≥10: "
                     f"{'yes' if ocrd >= 10 else 'NO'}); ÷ best direct configuration "
                     f"{direct:.2f} = {ocrd / direct:.3f} (target ≥0.95)")
    if ocrd and same:
        lines.append(f"ocrd ÷ the same server fed directly ({same:.2f}): {ocrd / same:.3f}")
    for phase, runs in res.items():
        for d in runs:
            facts = {k: v for k, v in d.items() if k not in ("rows", "phase")}
            lines.append(f"\n{phase}: " + json.dumps(facts))
    text = "\n".join(lines)
    (out / "report.md").write_text(text + "\n")
    return text


# ---- command line ----------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
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
    p.add_argument("--repeat", type=int, default=1,
                   help="offline: run the chosen GPU-only ceilings this many times in "
                   "alternating order, after a short warm-up pass")
    p.add_argument("--encoder-mode", choices=sorted(ENCODER_SETTING), default="auto",
                   help="daemon phases: engine.vllm.batch_encoder null (auto: batched on a "
                   "GPU, the default), true (batched) or false (page by page); round 2's "
                   "--batch-encoder was unpadded batching")
    args = p.parse_args(argv)
    global PYSPY_NATIVE
    PYSPY_NATIVE = args.profile_native
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
