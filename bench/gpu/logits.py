"""Benchmark-only vLLM logits processors for bench/gpu/run.py, loaded by name inside vLLM's
engine core (`bench.gpu.logits:BanEos`), never by ocrd in production.

With dummy weights the output length would be up to chance; `BanEos` makes every page
generate exactly max_tokens tokens, like `ignore_eos` does for the offline baseline (the
daemon's requests have no ignore_eos field). The two `...IfAsked` classes let one engine
hold vLLM's n-gram ban and ocrd's (ocrd/vllm_model/ngram.py) and pick one per request
(extra_args["bench_ngram"]).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor
from vllm.v1.sample.logits_processor import LogitsProcessor

from ocrd.vllm_model.ngram import NGramBanLogitsProcessor, NoRepeatNGram


class BanEos(LogitsProcessor):
    """EOS never wins: every request runs to max_tokens."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        mc = vllm_config.model_config
        eos = (getattr(mc.hf_text_config, "eos_token_id", None)
               or getattr(mc.hf_config, "eos_token_id", None)
               or int(os.environ.get("BENCH_EOS_ID", "2")))
        eos = [eos] if isinstance(eos, int) else list(eos)
        # a device index made once: building it from a list every step would copy it
        # from pageable memory, which waits for the GPU and stalls async scheduling
        self.eos = torch.tensor(eos, dtype=torch.long, device=device)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Any) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        logits.index_fill_(1, self.eos, float("-inf"))
        return logits


def _asked(params: Any, name: str) -> bool:
    return bool(params.extra_args) and params.extra_args.get("bench_ngram") == name


class VllmNGramIfAsked(NGramPerReqLogitsProcessor):
    """vLLM's own n-gram processor, for requests with extra_args bench_ngram=vllm."""

    def new_req_logits_processor(self, params: Any) -> Any:
        return super().new_req_logits_processor(params) if _asked(params, "vllm") else None


class FastNGramIfAsked(NGramBanLogitsProcessor):
    """ocrd's n-gram processor, for requests with extra_args bench_ngram=fast."""

    def new_req_logits_processor(self, params: Any) -> Any:
        return super().new_req_logits_processor(params) if _asked(params, "fast") else None


class OldNGramIfAsked(NGramBanLogitsProcessor):
    """ocrd's n-gram processor as it was before round 3 (bans written with
    `logits[rows, cols] = -inf`), for requests with extra_args bench_ngram=fast_old: the
    side-by-side control for the index_fill_ write."""

    def new_req_logits_processor(self, params: Any) -> Any:
        return super().new_req_logits_processor(params) if _asked(params, "fast_old") else None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.req_info:
            return logits
        rows: list[int] = []
        cols: list[int] = []
        for row, state in self.req_info.items():
            banned = state.func.banned(state.args[-1])
            if banned:
                rows.extend([row] * len(banned))
                cols.extend(banned)
        if rows:
            index = torch.tensor([rows, cols], dtype=torch.long,
                                 pin_memory=self.pin_memory and logits.is_cuda)
            index = index.to(logits.device, non_blocking=True)
            logits[index[0], index[1]] = -float("inf")
        return logits


class FullScan(NoRepeatNGram):
    """Round 3's ban: the whole window scanned at every step (a `list.index` walk over
    the positions that start with the right token). Same bans as the incremental index."""

    __slots__ = ()

    def banned(self, output_ids: list[int]) -> set[int]:
        n = self.ngram_size
        length = len(output_ids)
        if length < n or n < 2:
            return set()
        end = length - n + 1
        prefix = output_ids[end:]
        find = output_ids.index
        found: set[int] = set()
        i = max(0, length - self.window_size)
        while i < end:
            try:
                i = find(prefix[0], i, end)
            except ValueError:
                break
            if output_ids[i:i + n - 1] == prefix:
                found.add(output_ids[i + n - 1])
            i += 1
        return found - self.whitelist_token_ids if found else found


class ScanNGramIfAsked(NGramBanLogitsProcessor):
    """ocrd's n-gram processor with round 3's full scan per step, for requests with
    extra_args bench_ngram=fast_scan: the side-by-side control for the incremental index."""

    def new_req_logits_processor(self, params: Any) -> Any:
        if not _asked(params, "fast_scan"):
            return None
        plain = super().new_req_logits_processor(params)
        return FullScan(plain.ngram_size, plain.window_size, plain.whitelist_token_ids)
