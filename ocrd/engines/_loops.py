"""Never drop a page: retry pages whose output ran into a repetition loop, keep the best try.

DeepSeek-OCR-2 sometimes loops on a phrase until `max_tokens` ("length"), or vLLM's
repetition detector stops it ("repetition"). Both engines that talk to the model (local
vLLM and remote `vllm serve`) run every page through `convert_with_retries`, which asks
again with tighter anti-repetition settings (`deepseek_ocr2.attempt_settings`) and, if
no try ends normally, returns the longest text without its looping tail, marked as
degraded instead of failing the page.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ocrd.config import EngineConfig
from ocrd.engines.base import PageOutput
from ocrd.engines.deepseek_ocr2 import AttemptSettings, attempt_settings

# Looping tails are found with periods up to this many characters (long table rows).
MAX_LOOP_PERIOD_CHARS = 2000
# A tail counts as a loop when its pattern occurs at least this often and the copies
# after the first add up to at least this many characters.
MIN_LOOP_COPIES = 3
MIN_LOOP_CHARS = 16


@dataclass
class Attempt:
    """What one try at a page produced."""

    text: str
    finish_reason: str
    tokens: int | None = None
    prompt_tokens: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def stopped(self) -> bool:
        return self.finish_reason == "stop"


def loop_start(text: str) -> int | None:
    """Where the repeated copies of a looping tail begin, or None if the tail does not loop.

    Keeping `text[:loop_start(text)]` keeps everything up to and including the first copy
    of the repeated block (up to the end of its line). Among candidate periods the one
    covering the longest tail wins (ties: the shortest period).
    """
    n = len(text)
    best_len, best_cut = 0, None
    for p in range(1, min(MAX_LOOP_PERIOD_CHARS, n // MIN_LOOP_COPIES) + 1):
        if text[-1] != text[-1 - p]:
            continue
        # Largest tail length L (p < L <= n) whose text has period p. Periodicity of a
        # tail is monotone in L, so a binary search over L finds it with slice compares.
        lo, hi = p, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if text[n - mid:n - p] == text[n - mid + p:]:
                lo = mid
            else:
                hi = mid - 1
        tail = lo
        if tail >= MIN_LOOP_COPIES * p and tail - p >= MIN_LOOP_CHARS and tail > best_len:
            best_len, best_cut = tail, n - tail + p
    if best_cut is not None:
        # The repeated block may start mid-line ("\n| a |" for "| a |\n"): end the kept
        # text at the next line break inside the second copy, if it has one.
        p = best_len - (n - best_cut)
        newline = text.find("\n", best_cut, best_cut + p)
        if newline >= 0:
            best_cut = newline + 1
    return best_cut


def trim_loop(text: str) -> str:
    """The text without the repeated copies of a looping tail (unchanged if none)."""
    cut = loop_start(text)
    return text if cut is None else text[:cut]


def pick_best(attempts: list[Attempt]) -> Attempt:
    """The first try that ended normally, else the one with the most text before its loop."""
    for a in attempts:
        if a.stopped:
            return a
    return max(attempts, key=lambda a: len(trim_loop(a.text)))


async def convert_with_retries(
    run_attempt: Callable[[AttemptSettings], Awaitable[Attempt]],
    cfg: EngineConfig,
) -> PageOutput:
    """Run tries until one ends normally or `cfg.loop_retries` retries are spent.

    `run_attempt` does one request; exceptions from it (engine unavailable or dead, a
    bad request) pass through untouched: only loops are handled here.
    """
    started_at = time.time()
    t0 = time.monotonic()
    attempts: list[Attempt] = []
    for n in range(1, cfg.loop_retries + 2):
        attempt = await run_attempt(attempt_settings(cfg.ngram, n))
        attempts.append(attempt)
        if attempt.stopped:
            break
    best = pick_best(attempts)
    text, degraded = best.text, None
    extra = dict(best.extra)
    if not best.stopped:
        text = trim_loop(best.text)
        degraded = (f"no normal end in {len(attempts)} attempt(s) "
                    f"(finish_reason={best.finish_reason}); kept the longest text"
                    + (", repeated tail removed" if len(text) < len(best.text) else ""))
        extra["loop_trimmed_chars"] = len(best.text) - len(text)
    extra["attempt_finish_reasons"] = [a.finish_reason for a in attempts]
    return PageOutput(
        text=text,
        finish_reason=best.finish_reason,
        tokens=best.tokens,
        prompt_tokens=best.prompt_tokens,
        attempts=len(attempts),
        degraded=degraded,
        seconds=time.monotonic() - t0,
        started_at=started_at,
        finished_at=time.time(),
        extra=extra,
    )
