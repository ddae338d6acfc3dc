"""The GPU benchmark's report: every row of the phases' results as a table, with ratios
against vLLM alone and ocrd against the best direct configuration.
"""

from __future__ import annotations

import json
from pathlib import Path


def report(out: Path, merge: list[Path] | None = None) -> str:
    """The table of every row in OUT's results (and those of --merge folders), with
    ratios against vLLM alone and ocrd against the best direct configuration."""
    res: dict[str, list[dict]] = {}
    for folder in [out, *(merge or [])]:
        for phase in ("offline", "managed", "inproc"):
            p = folder / f"results_{phase}.json"
            if p.exists():
                res.setdefault(phase, []).append(json.loads(p.read_text()))
    rows = [r for runs in res.values() for d in runs for r in d["rows"]
            if r["config"] != "warmup"]
    base = next((r["pages_per_s"] for r in rows if r["config"] == "vllm_offline_all_at_once"),
                None)
    lines = ["| configuration | pages | T | wall s | pages/s | × vLLM alone |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['pages_per_s'] / base:.2f}" if base and r["pages_per_s"] else "—"
        lines.append(f"| {r['config']} | {r['pages']} | {r.get('T')} | {r['wall_s']} | "
                     f"{r['pages_per_s']} | {ratio} |")
    ocrd = max((r["pages_per_s"] for r in rows if r["config"].startswith("ocrd_e2e")),
               default=None)
    direct = max((r["pages_per_s"] for r in rows
                  if r["config"].startswith(("direct_", "vllm_offline"))), default=None)
    same = max((r["pages_per_s"] for r in rows if r["config"].startswith("direct_")),
               default=None)
    if ocrd and direct:
        lines.append(f"\nocrd end to end, best: {ocrd:.2f} pages/s (≥10: "
                     f"{'yes' if ocrd >= 10 else 'NO'}); ÷ best direct configuration "
                     f"{direct:.2f} = {ocrd / direct:.3f} (target ≥0.95)")
    if ocrd and same:
        lines.append(f"ocrd ÷ the same server fed directly ({same:.2f}): {ocrd / same:.3f}")
    for phase, runs in res.items():
        for d in runs:
            facts = {k: v for k, v in d.items() if k not in ("rows", "phase")}
            lines.append(f"\n{phase}: " + json.dumps(facts))
    text = "\n".join(lines)
    (out / "report.md").write_text(text + "\n")
    return text
