"""DeepSeek-OCR-2's n-gram ban, the model recipe's logits processor, made cheap per step.

The recipe bans, for each request, every token that would repeat an n-gram already seen
in its last `window_size` output tokens (`ngram_size` 30, window 90, `<td>`/`</td>`
whitelisted; sent per request as extra args). vLLM's `NGramPerReqLogitsProcessor` does
it request by request inside the engine core's step: a Python scan of the window with a
tuple per position, then one GPU write per request from a pageable list — which waits
for the GPU's forward pass to finish, so the host stops preparing the next step. With
hundreds of pages in flight on a big GPU that costs the engine a large part of its pages
per second.

This processor bans the same tokens (tests/vllm_engine/test_ngram.py compares it with
vLLM's on random sequences, call by call as outputs grow) from an index per request that
each step updates by the newest n-gram (`NoRepeatNGram`), and writes all bans of a step
at once from pinned memory without waiting for the GPU. It is a drop-in: same request
arguments, same validation (vLLM's class is the base). Loaded where vLLM runs: by name in
the engine core of a `vllm serve` (the managed and remote engines), and by the in-process
engine (ocrd/engines/vllm/inprocess.py), which imports it when it starts vLLM inside the daemon's
process and passes the class; never by a daemon without a vLLM engine.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

import torch
from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor


class NoRepeatNGram:
    """One request's ban: tokens that would repeat an n-gram seen in the last `window`
    output tokens (minus the whitelist). Same result as vLLM's NoRepeatNGramLogitsProcessor,
    including its quirk that ngram_size 1 bans nothing.

    Incremental: the request's output only grows by a few tokens per step, so an index
    (n-1)-gram → {token that followed it: count} gains the n-grams completed since the
    last call and drops those that left the window; a step then costs one tuple and a
    few dict operations whatever the text looks like. (A full scan costs more the more
    positions match — most on a run of one token, where every position matches the
    first token — and with hundreds of pages in flight it was a visible share of the
    engine core's thread.) If the output is not what the index was
    built from (shorter, or its last token changed), the index is rebuilt."""

    __slots__ = ("ngram_size", "window_size", "whitelist_token_ids", "_follow", "_keys",
                 "_first", "_added", "_seen", "_last", "_suffix")

    def __init__(self, ngram_size: int, window_size: int,
                 whitelist_token_ids: Iterable[int] | None = None) -> None:
        self.ngram_size = ngram_size
        self.window_size = window_size
        self.whitelist_token_ids = frozenset(whitelist_token_ids or ())
        self._reset()

    def _reset(self) -> None:
        # (n-1)-gram → {token that followed it: how often}, over the n-grams in the window
        self._follow: dict[tuple[int, ...], dict[int, int]] = {}
        self._keys: deque[tuple[int, ...]] = deque()  # the key of each indexed start
        self._first = 0  # indexed starts: [_first, _added)
        self._added = 0
        self._seen = 0  # output length at the last call, and its last token
        self._last = -1
        self._suffix: tuple[int, tuple[int, ...]] = (-1, ())  # last query: (start, key)

    def banned(self, output_ids: list[int]) -> set[int]:
        n = self.ngram_size
        length = len(output_ids)
        if length < n or n < 2:
            return set()
        if length < self._seen or output_ids[self._seen - 1] != self._last:
            self._reset()
        self._seen, self._last = length, output_ids[-1]
        start = max(0, length - self.window_size)  # n-grams starting in [start, end)
        end = length - n + 1  # end inside the output
        follow, keys, last = self._follow, self._keys, n - 1
        if self._added < start:  # nothing indexed is in the window any more
            follow.clear()
            keys.clear()
            self._first = self._added = start
        for i in range(self._added, end):
            # the last call's query key is the key of the start it ended at
            key = self._suffix[1] if i == self._suffix[0] else tuple(output_ids[i:i + last])
            keys.append(key)
            token = output_ids[i + last]
            counts = follow.get(key)
            if counts is None:
                follow[key] = {token: 1}
            else:
                counts[token] = counts.get(token, 0) + 1
        if end > self._added:
            self._added = end
        while self._first < start:  # left the window
            key = keys.popleft()
            counts = follow[key]
            token = output_ids[self._first + last]
            if counts[token] == 1:
                del counts[token]
                if not counts:
                    del follow[key]
            else:
                counts[token] -= 1
            self._first += 1
        key = tuple(output_ids[end:])  # the n-1 newest tokens
        self._suffix = (end, key)
        counts = follow.get(key)
        if not counts:
            return set()
        banned = set(counts)
        return banned - self.whitelist_token_ids if self.whitelist_token_ids else banned

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
            # with a value tensor, which took a visible share of the engine core's main
            # thread on a GPU)
            index = torch.tensor(flat, dtype=torch.long,
                                 pin_memory=self.pin_memory and logits.is_cuda)
            index = index.to(logits.device, non_blocking=True)
            target = logits if logits.is_contiguous() else logits.contiguous()
            target.view(-1).index_fill_(0, index, -float("inf"))
            if target is not logits:
                logits.copy_(target)
        return logits
