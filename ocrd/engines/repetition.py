"""Never drop a page: retry pages whose output ran into a repetition loop, keep the best try.

A model sometimes loops on a phrase until `max_tokens` ("length"), or vLLM's repetition
detector stops it ("repetition"). The engines that talk to a model (local vLLM and
remote `vllm serve`) run every page through `convert_with_retries`, which asks again —
try by try, with the settings the model's recipe gives each try (DeepSeek-OCR-2: a
tighter n-gram ban, `deepseek_ocr2.attempt_settings`) — and, if no try ends normally,
returns the longest text without its looping tail, marked as degraded instead of
failing the page.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ocrd.outputs.page import PageOutput

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

    Linear in the text: the tail that has period p is p + Z[p] long, where Z[p] is how far
    the reversed text agrees with itself shifted by p; the Z-algorithm finds Z[1..P]
    reusing what it has compared, and each comparison is a slice compare (C speed).
    """
    n = len(text)
    periods = min(MAX_LOOP_PERIOD_CHARS, n // MIN_LOOP_COPIES)
    if periods < 1:
        return None
    rev = text[::-1]
    z = _z_prefix(rev, periods)
    best_len, best_p = 0, 0
    for p in range(1, periods + 1):
        tail = p + z[p]
        if tail >= MIN_LOOP_COPIES * p and tail - p >= MIN_LOOP_CHARS and tail > best_len:
            best_len, best_p = tail, p
    if not best_p:
        return None
    # The repeated block may start mid-line ("\n| a |" for "| a |\n"): end the kept
    # text at the next line break inside the second copy, if it has one.
    cut = n - best_len + best_p
    newline = text.find("\n", cut, cut + best_p)
    return newline + 1 if newline >= 0 else cut


def _z_prefix(s: str, last: int) -> list[int]:
    """Z[i] for i in 0..last: the length of the longest common prefix of s and s[i:]
    (Z[0] is left 0). The Z-algorithm: a box [left, right) that matches a prefix of s
    lets Z[i] inside it be read off Z[i - left]; only text past `right` is compared."""
    z = [0] * (last + 1)
    left = right = 0
    for i in range(1, last + 1):
        k = min(right - i, z[i - left]) if i < right else 0
        if i + k >= right:
            k += _common_prefix(s, k, i + k)
            left, right = i, i + k
        z[i] = k
    return z


def _common_prefix(s: str, a: int, b: int) -> int:
    """How many characters s[a:] and s[b:] have in common at their start (a < b):
    slices of doubling size compared until one differs, then that one halved down to
    the first difference. Work in proportion to the answer."""
    limit = len(s) - b
    done, size = 0, 64
    while done < limit:
        size = min(size, limit - done)
        if s[a + done:a + done + size] != s[b + done:b + done + size]:
            while size > 1:  # the first difference is in [done, done + size)
                half = size // 2
                if s[a + done:a + done + half] == s[b + done:b + done + half]:
                    done += half
                    size -= half
                else:
                    size = half
            return done
        done += size
        size *= 2
    return done


def trim_loop(text: str) -> str:
    """The text without the repeated copies of a looping tail (unchanged if none)."""
    cut = loop_start(text)
    return text if cut is None else text[:cut]


def pick_best(attempts: list[Attempt]) -> Attempt:
    """The first try that ended normally, else the one with the most text before its loop."""
    return _best(attempts)[0]


def _best(attempts: list[Attempt]) -> tuple[Attempt, str]:
    """The try to keep and its text (a looping tail cut when no try ended normally);
    each try's loop is looked for once."""
    for a in attempts:
        if a.stopped:
            return a, a.text
    trimmed = [(a, trim_loop(a.text)) for a in attempts]
    return max(trimmed, key=lambda pair: len(pair[1]))


async def convert_with_retries(
    run_attempt: Callable[[int], Awaitable[Attempt]],
    retries: int,
) -> PageOutput:
    """Run tries (1, 2, ...) until one ends normally or `retries` retries are spent.

    `run_attempt(n)` does try n; exceptions from it (engine unavailable or dead, a bad
    request) pass through untouched: only loops are handled here.
    """
    started_at = time.time()
    t0 = time.monotonic()
    attempts: list[Attempt] = []
    for n in range(1, retries + 2):
        attempt = await run_attempt(n)
        attempts.append(attempt)
        if attempt.stopped:
            break
    last = attempts[-1]
    if last.stopped:
        best, text = last, last.text
    else:  # looking for loops in long texts: work for a thread, not the event loop
        best, text = await asyncio.to_thread(_best, attempts)
    degraded = None
    extra = dict(best.extra)
    if not best.stopped:
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
