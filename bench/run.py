"""Run ocrd's benchmarks and compare each against its peer, measured side by side.

    python bench/run.py --quick            # the whole set in under ten minutes
    python bench/run.py                    # full size (10,000-file burst, more pages)
    python bench/run.py --only burst,pickup

Prints one line per benchmark (`name  ratio  target  ok`), writes the details as JSON to
bench/out/, appends the table to bench/RESULTS.md and exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cases import CASES, Result  # noqa: E402
from bench.console import CONSOLE_CASES  # noqa: E402
from bench.harness import OUT, ROOT  # noqa: E402
from bench.intake import INTAKE_CASES  # noqa: E402
from bench.search import SEARCH_CASES  # noqa: E402
from bench.structure import STRUCTURE_CASES  # noqa: E402
from bench.worst_text import WORST_TEXT_CASES  # noqa: E402

RESULTS_MD = ROOT / "bench" / "RESULTS.md"
RESULTS_HEADER = """# Benchmark results

Appended by `python bench/run.py`; every ratio is ocrd ÷ its peer (or ÷ the target
value), measured side by side in the same run. See bench/README.md for what each line
means.
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller inputs (under 10 minutes)")
    p.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(CASES)}")
    p.add_argument("--no-record", action="store_true",
                   help="do not append to bench/RESULTS.md")
    return p.parse_args(argv)


def fmt_target(r: Result) -> str:
    return f"{'≥' if r.op == '>=' else '≤'}{r.target:g}"


def record(results: list[Result], quick: bool, seconds: float) -> None:
    cores = os.cpu_count() or 0
    stamp = time.strftime("%Y-%m-%d %H:%M")
    lines = [f"\n## {stamp} — {'quick' if quick else 'full'}, {cores} cores, "
             f"{platform.python_implementation()} {platform.python_version()}, "
             f"{seconds:.0f} s\n",
             "| benchmark | ratio | target | ok | measured |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.name} | {r.value:.3f} | {fmt_target(r)} | "
                     f"{'yes' if r.ok else 'NO'} | {summary(r)} |")
    if not RESULTS_MD.exists():
        RESULTS_MD.write_text(RESULTS_HEADER)
    with open(RESULTS_MD, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def summary(r: Result) -> str:
    """A few words on what was measured, for RESULTS.md."""
    d = r.details
    if r.error:
        return f"error: {r.error}"
    if r.name.startswith("saturation_"):
        best = max(d["engine_alone"], key=lambda x: x["pages_per_s"])
        return (f"daemon {d['daemon']['pages_per_s']:.2f} pages/s vs engine alone "
                f"{best['pages_per_s']:.2f} ({best['concurrency']} at once), "
                f"{d['daemon']['pages']} pages")
    if r.name.startswith("vs_fixed_batch_"):
        return (f"daemon {d['daemon']['pages_per_s']:.2f} pages/s vs batches of 4 "
                f"{d['fixed_batch']['pages_per_s']:.2f}")
    if r.name == "rendering":
        o = max(x["pages_per_s"] for x in d["ocrd"])
        p = max(x["pages_per_s"] for x in d["pdftoppm"])
        return f"RenderPool {o:.1f} pages/s vs pdftoppm {p:.1f}"
    if r.name.startswith("memory"):
        return (f"peak RSS {d['1000_pages']['peak_rss_mb']} MB (1,000 pages) vs "
                f"{d['10_pages']['peak_rss_mb']} MB (10)")
    if r.name == "pickup_moved_p50_vs_closed":
        return (f"p50 moved in {d['p50_ms']['moved']} ms vs closed after writing "
                f"{d['p50_ms']['closed']} ms, {d['files']} files, quiet 5 s")
    if r.name.startswith("pickup"):
        return f"p50 {d['p50_ms']} ms, p95 {d['p95_ms']} ms, {d['files']} files"
    if r.name.startswith("burst"):
        return (f"{d['files']} files, {d['files_per_s']} files/s, peak RSS "
                f"{d['peak_rss_mb']} MB, exactly once: {d['exactly_once']}")
    if r.name.startswith("console_1100_idle"):
        idle = max(x["pages_per_s"] for x in d["idle"])
        crowd = max(d["crowded"], key=lambda x: x["pages_per_s"])
        return (f"{crowd['pages_per_s']:.2f} pages/s with {crowd['crowd']['connections']} "
                f"idle connections vs {idle:.2f} idle, descriptors {d['nofile']}, "
                f"{crowd['crowd']['closed_by_server']} connections closed by the console")
    if r.name.startswith("structure_"):
        return d.get("summary", "")
    if r.name == "search_p95_vs_100ms_100k_pages":
        worst = d["queries"][d["worst"]]
        return (f"{d['index']['pages']} pages ({d['index']['index_mb']} MB); worst p95 "
                f"{worst['p95_ms']} ms: {d['worst']}")
    if r.name == "search_on_vs_off_throughput":
        return (f"{max(x['pages_per_s'] for x in d['on']):.2f} vs "
                f"{max(x['pages_per_s'] for x in d['off']):.2f} pages/s")
    if r.name.startswith("worst_text_"):
        return (f"loop blocked {d['blocked_ms']} ms at most (rounds {d['rounds_blocked_ms']}"
                f", idle noise {d['rounds_idle_noise_ms']}), {d['answer_chars']:,} chars, "
                f"{d['outcome']}")
    if r.name == "console_p95_vs_300ms_100k_rows":
        worst = d["queries"][d["worst"]]
        return f"{d['rows']:,} rows; worst p95 {worst['p95_ms']} ms: {d['worst']}"
    if r.name.startswith("intake_rescan"):
        b, base = d["backlog"], d["baseline"]
        return (f"{b['files']:,} files: loop blocked {b['blocked_ms']} ms at most (p99 "
                f"{b['p99_ms']}; first scan {b['first_scan_blocked_ms']}), "
                f"{b['status_no_daemon']} of {b['status_asked']} status answers without the "
                f"daemon; 1,000 files: {base['blocked_ms']} ms; idle noise "
                f"{b.get('idle_noise_ms')} ms, load {b.get('load_average')}")
    if r.name.startswith("intake_files"):
        b, base = d["backlog"], d["baseline"]
        return (f"{b['files']:,} files: {b['files_per_s']} files/s vs 1,000 files: "
                f"{base['files_per_s']}; loop blocked {b['blocked_ms']} ms at most (p99 "
                f"{b['p99_ms']}) vs {base['blocked_ms']} ms (p99 {base['p99_ms']}), "
                f"{b['status_no_daemon']} of {b['status_asked']} status answers without "
                "the daemon")
    if r.name.startswith("small_vs_large"):
        return f"small {d['small_seconds']} s, large {d['big_seconds']} s"
    return ""


CASES.update(CONSOLE_CASES)
CASES.update(STRUCTURE_CASES)
CASES.update(SEARCH_CASES)
CASES.update(WORST_TEXT_CASES)
CASES.update(INTAKE_CASES)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    from ocrd.service import log

    log.setup("warning", "console")  # engines driven in this process: no info chatter
    t0 = time.time()
    results: list[Result] = []
    for name in names:
        print(f"{name} ...", flush=True)
        try:
            results.extend(CASES[name](args.quick))
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            traceback.print_exc()
            results.append(Result(name, float("nan"), 0.0, ">=", error=repr(e)))
    seconds = time.time() - t0

    width = max(len(r.name) for r in results)
    print()
    print(f"{'name':<{width}}  {'ratio':>7}  {'target':>7}  ok")
    for r in results:
        print(f"{r.name:<{width}}  {r.value:>7.3f}  {fmt_target(r):>7}  "
              f"{'yes' if r.ok else 'NO'}")

    report = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": args.quick,
              "cores": os.cpu_count(), "python": platform.python_version(),
              "seconds": round(seconds, 1), "results": [r.row() for r in results]}
    out = OUT / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    (OUT / "latest.json").write_text(out.read_text())
    print(f"\ndetails: {out.relative_to(ROOT)}  ({seconds:.0f} s)")
    if not args.no_record:
        record(results, args.quick, seconds)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
