"""Where a vLLM engine core's main thread spends its time, from py-spy's collapsed stacks
(`bench/gpu/run.py ... --profile N` writes OUT/pyspy_ROW.txt; round 3's are stored gzipped in
bench/results/gpu/2026-11-30-round3/).

    python bench/probes/pyspy_summary.py FILE [FILE ...] [--top 25] [--lines] [--under FUNC]

Per file: samples per thread, then the main thread's functions by inclusive share (% of
its samples in which the function is on the stack) and by "leaf" share (the innermost
Python frame: the Python line that was running or waiting in C/CUDA code). --lines keeps
line numbers (which line of a function), --under limits the leaves to stacks through
FUNC (e.g. --under apply).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
from pathlib import Path


def stacks(path: Path) -> list[tuple[list[str], int]]:
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt") as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if stack and n.isdigit():
                out.append((stack.split(";"), int(n)))
    return out


def summary(path: Path, top: int, lines: bool, under: str) -> str:
    data = stacks(path)
    if not data:
        return f"{path}: no stacks ({path.read_bytes()[:200]!r})"
    threads: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    main = 0

    def name(frame: str) -> str:
        return frame if lines else re.sub(r":\d+\)$", ")", frame)

    for frames, n in data:
        threads[frames[0]] += n
        if "MainThread" not in frames[0]:
            continue
        main += n
        for f in {name(f) for f in frames[1:]}:
            inclusive[f] += n
        if not under or any(under in f for f in frames[1:]):
            leaves[name(frames[-1])] += n
    out = [f"== {path} ({main} main-thread samples)"]
    out += [f"{n:7d} {t}" for t, n in threads.most_common()]
    out.append("-- main thread, inclusive %")
    out += [f"{100 * n / main:5.1f} {f}" for f, n in inclusive.most_common(top)]
    out.append("-- main thread, leaf %" + (f" (stacks through {under})" if under else ""))
    out += [f"{100 * n / main:5.1f} {f}" for f, n in leaves.most_common(top)]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", type=Path, nargs="+")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--lines", action="store_true")
    p.add_argument("--under", default="")
    args = p.parse_args()
    for path in args.files:
        print(summary(path, args.top, args.lines, args.under))


if __name__ == "__main__":
    main()
