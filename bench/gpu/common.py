"""What the GPU benchmark's phases share (bench/gpu/run.py): the recipe's constants, the
sizes of a GPU run and of the tiny CPU dry run, the engine settings, and how a measured
row is printed and saved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

PROMPT = "<image>\n<|grounding|>Convert the document to markdown. "
A4 = (1190, 1684)  # 144 dpi
GRID = (1536, 2304)  # the 2×3 grid of 768 px tiles that an A4 page is resized to
VOCAB = 129280
NGRAM_ARGS = {"ngram_size": 30, "window_size": 90, "whitelist_token_ids": [128821, 128822]}
SERVER_PORT = 8765
VLLM_NGRAM = "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor"
OCRD_NGRAM = "ocrd.vllm_model.ngram:NGramBanLogitsProcessor"  # ocrd's production default
BAN_EOS = "bench.gpu.logits:BanEos"
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
    # profile none: each row measures the layout it names, not the one ocrd would pick
    vllm: dict[str, Any] = {"profile": "none", "dtype": "bfloat16", "max_model_len": 8192,
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
            "remote": {"request_timeout_seconds": 900}, "vllm": vllm}


def tiny_env() -> dict[str, str]:
    from tests.vllm_engine.conftest import ENV as TINY
    from tests.vllm_engine.conftest import PLUGIN_DIR

    return {**TINY, "PYTHONPATH": os.pathsep.join(
        [str(PLUGIN_DIR), str(ROOT), os.environ.get("PYTHONPATH", "")])}


# ---- rows ------------------------------------------------------------------------------

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
