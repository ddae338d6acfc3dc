"""DeepSeek-OCR-2's n-gram ban, the model recipe's logits processor, made cheap per step.

The recipe bans, for each request, every token that would repeat an n-gram already seen
in its last `window_size` output tokens (`ngram_size` 30, window 90, `<td>`/`</td>`
whitelisted; sent per request as extra args). vLLM's `NGramPerReqLogitsProcessor` does
it request by request inside the engine core's step: a Python scan of the window with a
tuple per position, then one GPU write per request from a pageable list — which waits
for the GPU's forward pass to finish, so the host stops preparing the next step. On an
H200 with 256 pages in flight that cut the engine from 11.1 to 6.2 pages/s
(bench/GPU_RESULTS.md).

This processor bans the same tokens (tests/vllm_engine/test_ngram.py compares it with
vLLM's on random sequences) with a `list.index` scan that jumps between candidate
positions, and writes all bans of a step at once from pinned memory without waiting for
the GPU. It is a drop-in: same request arguments, same validation (vLLM's class is the
base). Loaded by name inside vLLM's engine core, never imported by the daemon itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor


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
        """vLLM's per-request interface (used only where `apply` below is bypassed)."""
        banned = self.banned(output_ids)
        if banned:
            logits[list(banned)] = -float("inf")
        return logits


class NGramBanLogitsProcessor(NGramPerReqLogitsProcessor):
    """vLLM's DeepSeek-OCR n-gram processor with the faster scan and one batched write."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        self.pin_memory = bool(is_pin_memory)

    def new_req_logits_processor(self, params: Any) -> NoRepeatNGram | None:
        plain = super().new_req_logits_processor(params)
        if plain is None:
            return None
        return NoRepeatNGram(plain.ngram_size, plain.window_size, plain.whitelist_token_ids)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.req_info:
            return logits
        flat: list[int] = []  # row * vocabulary + token, for every ban of the step
        vocab = logits.shape[-1]
        for row, state in self.req_info.items():
            ban = getattr(state, "func", None)
            if isinstance(ban, NoRepeatNGram):
                # state is partial(ban, output_ids): the request's live output list
                banned = ban.banned(state.args[-1])
                if banned:
                    base = row * vocab
                    flat.extend(base + token for token in banned)
            else:  # a state this class did not make: the adapter's own way
                req_logits = logits[row]
                new_logits = state(req_logits)
                if new_logits is not req_logits:
                    logits[row] = new_logits
        if flat:
            # one index, copied from pinned memory without waiting, and a fill with the
            # value as a kernel argument (`logits[i, j] = -inf` goes through index_put_
            # with a value tensor; on an H200 that line took 18% of the engine core's
            # main thread, bench/GPU_RESULTS.md round 3)
            index = torch.tensor(flat, dtype=torch.long,
                                 pin_memory=self.pin_memory and logits.is_cuda)
            index = index.to(logits.device, non_blocking=True)
            target = logits if logits.is_contiguous() else logits.contiguous()
            target.view(-1).index_fill_(0, index, -float("inf"))
            if target is not logits:
                logits.copy_(target)
        return logits
