"""The GPU benchmark's offline phase (bench/gpu/run.py offline): vLLM alone, in one engine
with ocrd's fast-encoder model switched between vLLM's encoder path and ocrd's
(`LLM.apply_model`, bench/gpu/encoder.py).

Rows: the encoder alone on A4-shaped inputs; `LLM.generate` of all pages at once (the
baseline), with either encoder path; decoding text prompts (no vision side); the cost of
preparing one page on the front-end thread; GPU-only ceilings: pages prepared untimed,
then decoded with each encoder mode and n-gram ban (CEILINGS), all at once or paced.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from typing import Any

from bench.gpu import kernel_profile as gpu_kernels
from bench.gpu.common import (
    A4,
    GRID,
    NGRAM_ARGS,
    PROMPT,
    engine_settings,
    flow,
    knobs,
    row,
    save,
    sizes,
    tiny_env,
)
from bench.gpu.encoder import encoder_bench, model_class, set_mode
from bench.gpu.inputs import page_image
from bench.gpu.measure import GpuMemory, profile_engine_core

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
# the n-gram processors of bench.gpu.logits, each acting only on requests that ask for it
LOGITS_PROCESSORS = ["bench.gpu.logits:VllmNGramIfAsked", "bench.gpu.logits:FastNGramIfAsked",
                     "bench.gpu.logits:OldNGramIfAsked", "bench.gpu.logits:ScanNGramIfAsked"]


def phase_offline(args: argparse.Namespace) -> None:
    env = tiny_env() if args.tiny else {}
    os.environ.update(env)
    if args.tiny:
        sys.path.insert(0, env["PYTHONPATH"].split(os.pathsep)[0])
    bench = Offline(args)
    with GpuMemory() as mem:
        bench.start(mem)
        bench.run()
    bench.result["gpu_mem_peak_mib"] = mem.peak
    bench.save()
    print("OFFLINE", json.dumps(bench.result), flush=True)
    try:
        bench.eng.engine_core.shutdown()
    except Exception as e:  # noqa: BLE001
        print("shutdown:", repr(e))
    sys.stdout.flush()
    os._exit(0)  # skip vLLM's slow teardown


def kernel_windows(spec: str) -> list[tuple[float, float]]:
    """--kernels "AT:SECONDS,...": the windows of kernel profiling in a GPU-only run."""
    out = []
    for item in filter(None, spec.split(",")):
        at, _, dur = item.partition(":")
        out.append((float(at), float(dur or 1.0)))
    return sorted(out)


class Offline:
    """One LLM engine and the rows measured on it (result["rows"], saved after each)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.s = sizes(args.tiny)
        self.T: int = self.s["T"]
        self.result: dict[str, Any] = {"phase": "offline", "rows": [], "T": self.T,
                                       "knobs": knobs()}
        self.only = set(args.only.split(",")) if args.only else None
        self.llm: Any = None
        self.eng: Any = None
        self.mem: GpuMemory | None = None
        self.prepared: dict[str, Any] = {}

    def wanted(self, name: str) -> bool:
        return not self.only or name in self.only

    def save(self) -> None:
        save(self.args.out, "offline", self.result)

    # -- the engine ------------------------------------------------------------------

    def start(self, mem: GpuMemory) -> None:
        args, result = self.args, self.result
        self.mem = mem
        t0 = time.perf_counter()
        import vllm
        from vllm import LLM

        from ocrd.engines.vllm.args import HeadDimGuard
        from ocrd.vllm_model import plugin

        result["vllm"] = vllm.__version__
        result["import_s"] = round(time.perf_counter() - t0, 1)
        settings = engine_settings(args.tiny, args.model, args.max_num_seqs,
                                   args.engine_arg)["vllm"]
        kwargs = {**{k: v for k, v in settings.items() if k != "engine_args"},
                  **settings["engine_args"]}
        # ocrd's fast encoder model (its vLLM plugin, found through the .dist-info that
        # gpu_run.sh writes); stock and fast are then compared inside this one engine by
        # switching the model's path (apply_model sends the switch: needs pickled callables)
        os.environ[plugin.ENV] = "1"
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        plugin.use(True)
        result["plugin_installed"] = plugin.installed()
        t0 = time.perf_counter()
        self.llm = LLM(model=str(args.model), enable_prefix_caching=False,
                       mm_processor_cache_gb=0, limit_mm_per_prompt={"image": 1},
                       hf_overrides=HeadDimGuard(), logits_processors=LOGITS_PROCESSORS,
                       **kwargs)
        result["engine_start_s"] = round(time.perf_counter() - t0, 1)
        result["gpu_mem_after_start_mib"] = GpuMemory.used()
        self.eng = self.llm.llm_engine
        try:
            result["head_size"] = self.eng.model_config.get_head_size()
            result["kv_cache_blocks"] = self.eng.vllm_config.cache_config.num_gpu_blocks
        except Exception:  # noqa: BLE001 - informational
            pass
        result["model_class"] = self.llm.apply_model(model_class)[0]
        print("ENGINE", json.dumps(result), flush=True)

    def encoder(self, mode: str) -> None:
        self.llm.apply_model(functools.partial(set_mode, mode=mode))

    def requests(self, seed0: int, n: int, size: tuple[int, int] = A4) -> list[dict]:
        return [{"prompt": PROMPT, "multi_modal_data": {"image": page_image(seed0 + i, size)}}
                for i in range(n)]

    def params(self, t: int, ngram: str | None = None, final_only: bool = False) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        extra = {**NGRAM_ARGS, "bench_ngram": ngram} if ngram else None
        kind = {"output_kind": RequestOutputKind.FINAL_ONLY} if final_only else {}
        return SamplingParams(temperature=0, max_tokens=t, ignore_eos=True,
                              detokenize=True, skip_special_tokens=False, extra_args=extra,
                              **kind)

    # -- the rows ----------------------------------------------------------------------

    def run(self) -> None:
        s = self.s
        if self.wanted("encoder"):
            self.result["encoder"] = self.llm.apply_model(functools.partial(
                encoder_bench, pages=s["encoder_pages"]))[0]
            print("ENCODER", json.dumps(self.result["encoder"]), flush=True)
            self.save()
        self.generate("warmup", self.requests(10_000, 8), 32)
        if self.wanted("baseline"):
            self.encoder("stock")
            self.generate("vllm_offline_all_at_once",
                          self.requests(20_000, s["baseline_pages"]), self.T)
        for i, mode in enumerate(("page", "batched")):
            if self.wanted(f"baseline_{mode}"):
                self.encoder(mode)
                self.generate(f"vllm_offline_all_at_once_{mode}_encoder",
                              self.requests(25_000 + 1000 * i, s["baseline_pages"]), self.T)
        # Decoding alone: text prompts (no image, no encoder), the same output length and
        # ban: what the engine does per step without the vision side
        if self.wanted("decode_text"):
            self.generate("decode_only_text_prompts_ocrd_ngram",
                          [{"prompt": f"Page {i}: write the text of a long document."}
                           for i in range(s["ceiling_pages"])], self.T, "fast")
        self.frontend()
        self.ceilings()
        self.encoder("page")

    def generate(self, name: str, reqs: list[dict], t: int, ngram: str | None = None) -> None:
        args = self.args
        assert self.mem is not None
        if args.profile and name != "warmup":
            profile_engine_core(args.out, name, args.profile_delay, args.profile)
        t0, m0 = time.perf_counter(), time.monotonic()
        outs = self.llm.generate(reqs, self.params(t, ngram), use_tqdm=False)
        dt = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        self.result["rows"].append(row(name, len(reqs), dt, T=t, out_tokens=tokens,
                                       prompt_tokens=len(outs[0].prompt_token_ids),
                                       gpu_busy_pct=self.mem.busy_between(m0, m0 + dt)))
        self.save()

    def frontend(self) -> None:
        """The front end's own cost per page: vLLM's input processing, A4 and grid-sized
        (the prepared A4 pages are kept for the ceilings)."""
        renderer = self.eng.renderer
        for label, size in (("a4", A4), ("grid", GRID)):
            reqs = self.requests(30_000, self.s["prerender"], size)
            t0 = time.perf_counter()
            self.prepared[label] = renderer.render_cmpl(reqs)
            ms = (time.perf_counter() - t0) / len(reqs) * 1000
            self.result[f"frontend_ms_per_page_{label}"] = round(ms, 1)
            print(f"FRONTEND {label} {ms:.1f} ms/page", flush=True)
        self.save()

    def ceilings(self) -> None:
        """The chosen GPU-only ceilings at several sizes (with max_num_seqs above 256:
        how much more the GPU does at once), `--repeat` times in alternating order."""
        args, s = self.args, self.s
        counts = [int(x) for x in args.ceiling_pages.split(",")] if args.ceiling_pages \
            else [s["ceiling_pages"]]
        chosen = [c for c in CEILINGS if self.wanted(f"ceiling_{c[2]}")]
        if chosen and args.repeat > 1:  # a first, short pass takes the JIT compiles
            self.encoder(chosen[0][0])
            self.decode_prepared("warm_ceiling", s["ceiling_pages"], chosen[0][1], T=64)
        for n in counts:
            for rep in range(args.repeat):
                for mode, ngram, label in chosen:
                    self.encoder(mode)
                    size = "" if n == sizes(False)["ceiling_pages"] else f"_x{n}"
                    again = f"_r{rep + 1}" if args.repeat > 1 else ""
                    kind = "paced" if args.paced else "ceiling"
                    self.decode_prepared(f"gpu_only_{kind}_{label}_ngram{size}{again}", n,
                                         ngram, rate=args.paced)

    def decode_prepared(self, name: str, n: int, ngram: str | None, T: int | None = None,
                        rate: float = 0.0) -> None:
        """GPU-only: inputs prepared untimed, copies with their own hashes (so the
        vision encoder runs for every page). rate 0: all submitted at once; else
        paced like a served engine: at most `rate` pages/s arrive (vLLM's front
        ends) and at most --paced-in-flight are in the engine, each finished page
        making room for the next (the steady state, where pages trickle in)."""
        args, T = self.args, T or self.T
        assert self.mem is not None
        in_flight = args.paced_in_flight if rate else n
        if args.profile:
            profile_engine_core(args.out, name, args.profile_delay, args.profile)
        t0, m0 = time.perf_counter(), time.monotonic()
        outs, done = self._feed(name, n, self.params(T, ngram, final_only=True), rate,
                                in_flight)
        dt = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        # how repetitive the (dummy-weight) text is: the n-gram scan's cost follows it
        distinct = sorted(len(set(o.outputs[0].token_ids)) for o in outs)
        self.result["rows"].append(row(
            name, n, dt, T=T, out_tokens=tokens, ngram=ngram or "none",
            distinct_tokens_p50=distinct[len(distinct) // 2] if distinct else None,
            gpu_busy_pct=self.mem.busy_between(m0, m0 + dt),
            **({"arrival_rate": rate, "in_flight": in_flight, **flow(m0, done)}
               if rate else {})))
        self.save()

    def _feed(self, name: str, n: int, sp: Any, rate: float,
              in_flight: int) -> tuple[list[Any], list[tuple[float, int]]]:
        """Add n prepared pages to the engine (paced at `rate` when given) and step it
        until all are finished: their outputs, and when each finished."""
        eng, base = self.eng, self.prepared["a4"]
        outs: list[Any] = []
        done: list[tuple[float, int]] = []
        windows = kernel_windows(self.args.kernels) if name.startswith("gpu_only") else []
        profiling: tuple[float, float] | None = None
        t0 = time.perf_counter()
        added = 0
        while added < n or eng.has_unfinished_requests():
            now = time.perf_counter() - t0
            if profiling is None and windows and now >= windows[0][0]:
                profiling = windows.pop(0)
                self.llm.apply_model(gpu_kernels.start)
            elif profiling is not None and now >= profiling[0] + profiling[1]:
                k = self.llm.apply_model(gpu_kernels.stop)[0]
                k.update(at_s=profiling[0], pages_done=len(outs), pages_added=added)
                self.result.setdefault("kernels", {}).setdefault(name, []).append(k)
                print("KERNELS", name, json.dumps({x: k.get(x) for x in (
                    "at_s", "pages_done", "span_ms", "busy_pct", "steps", "per_step_ms",
                    "classes_ms")}), flush=True)
                profiling = None
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
        if profiling is not None:  # the run ended inside a window
            self.llm.apply_model(gpu_kernels.stop)
        return outs, done
