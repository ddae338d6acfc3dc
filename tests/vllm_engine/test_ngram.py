"""ocrd's n-gram ban (ocrd/vllm_model/ngram.py) bans exactly what vLLM's recipe processor bans.

vLLM's `NoRepeatNGramLogitsProcessor` and `NGramPerReqLogitsProcessor` are the reference:
both are run here on the same random outputs (small vocabularies, so n-grams repeat), one
request at a time and as a whole batch through the adapter's own state handling.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from needs import require_vllm  # tests/vllm_engine, on sys.path (conftest.py)

require_vllm()
import torch  # noqa: E402

from ocrd.vllm_model.ngram import NGramBanLogitsProcessor, NoRepeatNGram  # noqa: E402

pytestmark = pytest.mark.vllm

VOCAB = 12


def reference_banned(ngram: int, window: int, whitelist: list[int], ids: list[int]) -> set[int]:
    from vllm.model_executor.models.deepseek_ocr import NoRepeatNGramLogitsProcessor

    logits = torch.zeros(VOCAB)
    out = NoRepeatNGramLogitsProcessor(ngram, window, set(whitelist))(list(ids), logits)
    return {int(i) for i in torch.nonzero(torch.isinf(out)).flatten()}


def outputs(rng: random.Random, length: int) -> list[int]:
    """Random tokens with loops in them, as a looping model writes."""
    ids: list[int] = []
    while len(ids) < length:
        if ids and rng.random() < 0.5:
            back = rng.randint(1, min(len(ids), 8))
            ids.extend(ids[-back:][: rng.randint(1, 12)])
        else:
            ids.append(rng.randrange(3))
    return ids[:length]


def test_same_bans_as_vllm_on_random_outputs() -> None:
    rng = random.Random(5)
    cases = 0
    nonempty = 0
    for _ in range(3000):
        ngram = rng.randint(1, 6)
        window = rng.randint(1, 40)
        whitelist = rng.sample(range(3), rng.randint(0, 2))
        ids = outputs(rng, rng.randint(0, 60))
        want = reference_banned(ngram, window, whitelist, ids)
        assert NoRepeatNGram(ngram, window, whitelist).banned(ids) == want, (
            ngram, window, whitelist, ids)
        cases += 1
        nonempty += bool(want)
    assert nonempty > cases // 4  # the cases do ban things


def test_same_bans_step_by_step_as_the_output_grows() -> None:
    """One instance per request, called every step on its growing output (as the engine
    does): the incremental index must give what a full scan of the output gives, also
    when the output gets shorter or its newest token changes between calls."""
    rng = random.Random(9)
    checked = nonempty = rebuilt = 0
    for _ in range(300):
        ngram = rng.randint(2, 6)
        window = rng.randint(ngram, 40)
        whitelist = rng.sample(range(3), rng.randint(0, 1))
        target = outputs(rng, rng.randint(20, 90))
        ban = NoRepeatNGram(ngram, window, whitelist)
        ids: list[int] = []
        while len(ids) < len(target):
            ids.extend(target[len(ids):len(ids) + rng.choice((1, 1, 1, 2, 5))])
            if rng.random() < 0.05 and len(ids) > 3:  # rolled back, then regrown
                del ids[-rng.randint(1, 3):]
                rebuilt += 1
            elif rng.random() < 0.03:  # the newest token replaced
                ids[-1] = (ids[-1] + 1) % 3
                target[len(ids) - 1] = ids[-1]
                rebuilt += 1
            want = reference_banned(ngram, window, whitelist, ids)
            assert ban.banned(ids) == want, (ngram, window, whitelist, ids)
            checked += 1
            nonempty += bool(want)
    assert checked > 5000 and nonempty > checked // 4 and rebuilt > 100


def test_a_long_run_of_one_token_is_indexed_once() -> None:
    """A constant run: every position matches, one key holds the window's starts."""
    ban = NoRepeatNGram(30, 90, [])
    ids: list[int] = []
    for _ in range(400):
        ids.append(5)
        assert ban.banned(ids) == ({5} if len(ids) >= 30 else set())
    assert ban._follow == {(5,) * 29: {5: 90 - 30 + 1}} and len(ban._keys) == 90 - 30 + 1


def test_recipe_settings_on_a_long_loop() -> None:
    ids = [7, 8, 9, 10, 11] * 40  # 200 tokens of one loop: 7 would continue it
    assert NoRepeatNGram(30, 90, []).banned(ids) == reference_banned(30, 90, [], ids) == {7}
    assert NoRepeatNGram(30, 90, [7]).banned(ids) == reference_banned(30, 90, [7], ids) == set()
    short = ids[:31]  # the loop's n-gram has not been seen whole yet
    assert NoRepeatNGram(30, 90, []).banned(short) == reference_banned(30, 90, [], short)


def params(ngram: int | None, window: int = 90, whitelist: list[int] | None = None) -> Any:
    from vllm import SamplingParams

    extra = None if ngram is None else {"ngram_size": ngram, "window_size": window,
                                        "whitelist_token_ids": whitelist or []}
    return SamplingParams(extra_args=extra)


def test_a_batch_gets_the_bans_vllms_processor_gives() -> None:
    from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor

    rng = random.Random(11)
    ours = NGramBanLogitsProcessor(None, torch.device("cpu"), False)
    theirs = NGramPerReqLogitsProcessor(None, torch.device("cpu"), False)
    batch = []
    for row in range(16):
        p = params(None) if row % 5 == 0 else params(rng.randint(2, 5), rng.randint(5, 40),
                                                      rng.sample(range(3), 1))
        batch.append((row, p, outputs(rng, rng.randint(10, 50))))
    for proc in (ours, theirs):
        for row, p, ids in batch:
            state = proc._new_state(p, None, ids)
            if state is not None:
                proc.req_info[row] = state
    assert len(ours.req_info) == len(theirs.req_info) == 12
    logits = torch.randn(16, VOCAB)
    got = ours.apply(logits.clone())
    want = theirs.apply(logits.clone())
    assert torch.equal(got, want)
    assert int(torch.isinf(want).sum()) > 5
    # the lists are live: a token appended changes the next step's bans the same way
    for _, _, ids in batch:
        ids.append(ids[-3] if len(ids) > 3 else 0)
    assert torch.equal(ours.apply(logits.clone()), theirs.apply(logits.clone()))


def test_bad_arguments_are_refused_like_vllms() -> None:
    with pytest.raises(ValueError, match="ngram_size"):
        NGramBanLogitsProcessor.validate_params(params(0))
    NGramBanLogitsProcessor.validate_params(params(30))
