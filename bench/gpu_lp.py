"""Benchmark-only vLLM logits processors for bench/gpu.py, loaded by name inside vLLM's
engine core (`bench.gpu_lp:BanEos`), never by ocrd in production.

With dummy weights the output length would be up to chance; `BanEos` makes every page
generate exactly max_tokens tokens, like `ignore_eos` does for the offline baseline (the
daemon's requests have no ignore_eos field). `FastNGramPerReqLogitsProcessor` is an
experiment: the recipe's n-gram ban (same arguments, same banned tokens) with the search
done by `list.index` and one batched write per step; 75x less Python per step than vLLM's
on a CPU, but no faster on the H200 (bench/GPU_RESULTS.md), so ocrd keeps vLLM's. The two
`...IfAsked` classes let one engine hold both implementations and pick one per request
(extra_args["bench_ngram"]).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch
from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor
from vllm.v1.sample.logits_processor import LogitsProcessor


class NoRepeatNGram:
    """One request's ban: tokens that would repeat an n-gram seen in the last `window`
    output tokens (minus the whitelist). Same result as vLLM's NoRepeatNGramLogitsProcessor,
    including its quirk that ngram_size 1 bans nothing."""

    __slots__ = ("ngram_size", "window_size", "whitelist_token_ids")

    def __init__(self, ngram_size: int, window_size: int,
                 whitelist_token_ids: Iterable[int] | None = None) -> None:
        self.ngram_size = ngram_size
        self.window_size = window_size
        self.whitelist_token_ids = frozenset(whitelist_token_ids or ())

    def banned(self, output_ids: list[int]) -> set[int]:
        n = self.ngram_size
        length = len(output_ids)
        if length < n or n < 2:
            return set()
        start = max(0, length - self.window_size)
        end = length - n + 1  # n-grams starting before `end` end inside the output
        prefix = output_ids[length - n + 1:]  # the n-1 newest tokens
        first = prefix[0]
        find = output_ids.index
        found: set[int] = set()
        i = start
        while i < end:
            try:
                i = find(first, i, end)
            except ValueError:
                break
            if output_ids[i:i + n - 1] == prefix:
                found.add(output_ids[i + n - 1])
            i += 1
        return found - self.whitelist_token_ids if found else found

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        """vLLM's per-request interface (used only if `apply` below is bypassed)."""
        banned = self.banned(output_ids)
        if banned:
            logits[list(banned)] = -float("inf")
        return logits


class FastNGramPerReqLogitsProcessor(NGramPerReqLogitsProcessor):
    """vLLM's DeepSeek-OCR n-gram processor with the faster search and one batched write."""

    def new_req_logits_processor(self, params: Any) -> NoRepeatNGram | None:
        slow = super().new_req_logits_processor(params)
        if slow is None:
            return None
        return NoRepeatNGram(slow.ngram_size, slow.window_size, slow.whitelist_token_ids)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.req_info:
            return logits
        rows: list[int] = []
        cols: list[int] = []
        for row, state in self.req_info.items():
            ban = getattr(state, "func", None)
            if isinstance(ban, NoRepeatNGram):
                # state is partial(ban, output_ids): the request's live output list
                banned = ban.banned(state.args[-1])
                if banned:
                    rows.extend([row] * len(banned))
                    cols.extend(banned)
            else:  # a state this class did not make: the adapter's own way
                req_logits = logits[row]
                new_logits = state(req_logits)
                if new_logits is not req_logits:
                    logits[row] = new_logits
        if rows:
            index = torch.tensor([rows, cols], dtype=torch.long).to(logits.device)
            logits[index[0], index[1]] = -float("inf")
        return logits


class BanEos(LogitsProcessor):
    """EOS never wins: every request runs to max_tokens."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        mc = vllm_config.model_config
        eos = (getattr(mc.hf_text_config, "eos_token_id", None)
               or getattr(mc.hf_config, "eos_token_id", None)
               or int(os.environ.get("BENCH_EOS_ID", "2")))
        self.eos = [eos] if isinstance(eos, int) else list(eos)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Any) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        logits[:, self.eos] = float("-inf")
        return logits


def _asked(params: Any, name: str) -> bool:
    return bool(params.extra_args) and params.extra_args.get("bench_ngram") == name


class VllmNGramIfAsked(NGramPerReqLogitsProcessor):
    """vLLM's own n-gram processor, for requests with extra_args bench_ngram=vllm."""

    def new_req_logits_processor(self, params: Any) -> Any:
        return super().new_req_logits_processor(params) if _asked(params, "vllm") else None


class FastNGramIfAsked(FastNGramPerReqLogitsProcessor):
    """ocrd's n-gram processor, for requests with extra_args bench_ngram=fast."""

    def new_req_logits_processor(self, params: Any) -> Any:
        return super().new_req_logits_processor(params) if _asked(params, "fast") else None
