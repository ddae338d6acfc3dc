"""The n-gram ban's CPU cost per request and step: ocrd's index (ocrd/vllm_model/ngram.py)
against round 3's full window scan (bench/gpu/logits.py:FullScan), side by side.

    .venv/bin/python bench/probes/ngram_micro.py

One request grows to 1,024 tokens, the ban is asked after every token (as the engine
does), with the recipe's settings (30-grams, window 90). Three kinds of text: varied
(random tokens), a 7-token loop, one token repeated (a dot leader, or dummy weights).
Prints µs per step and the ratio index ÷ scan (below 1: the index is cheaper).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.logits import FullScan  # noqa: E402
from ocrd.vllm_model.ngram import NoRepeatNGram  # noqa: E402


def per_step_us(kind: type, text: list[int], reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        ban = kind(30, 90, [])
        ids: list[int] = []
        t0 = time.perf_counter()
        for token in text:
            ids.append(token)
            ban.banned(ids)
        best = min(best, (time.perf_counter() - t0) / len(text) * 1e6)
    return best


def main() -> None:
    rng = random.Random(0)
    texts = {"varied": [rng.randrange(50_000) for _ in range(1024)],
             "loop of 7": [1, 2, 3, 4, 5, 6, 7] * 147,
             "one token": [5] * 1024}
    for name, text in texts.items():
        index, scan = per_step_us(NoRepeatNGram, text), per_step_us(FullScan, text)
        assert NoRepeatNGram(30, 90, []).banned(text) == FullScan(30, 90, []).banned(text)
        print(f"{name:10s} index {index:6.2f} µs  scan {scan:6.2f} µs  "
              f"index ÷ scan {index / scan:.2f}")


if __name__ == "__main__":
    main()
