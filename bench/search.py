"""Full-text search's benchmarks: what indexing costs a conversion (pages/s with search
on ÷ off, side by side), and how fast a 100,000-page index answers through the console
(p95 of each kind of query)."""

from __future__ import annotations

import contextlib
import random
import sqlite3
import statistics
import time
from typing import Any

from bench.cases import Result, _log, fresh, saturation_docs
from bench.console import _alternating, _get
from bench.harness import OUT

PAGES = 100_000
PAGES_PER_DOC = 10
P95_TARGET_MS = 100.0
# a vocabulary with a long tail, as real documents have: a few words on most pages,
# most words on few
_SYLLABLES = ["ka", "ro", "mi", "ten", "lo", "sa", "ver", "un", "dis", "pe", "tor", "al",
              "ex", "bri", "no", "quen", "sta", "ge", "li", "mon"]
# CJK pages: characters of the common range, Zipf-weighted as in real text, with a few
# real words among them
_CJK = [chr(0x4E00 + k) for k in range(3000)]
_CJK_WEIGHTS = [1.0 / (rank + 1) for rank in range(len(_CJK))]
_CJK_WORDS = ["東京都", "請求書", "合計金額", "株式会社", "御中", "納品書", "支払期限"]
QUERIES = {
    "rare word": "toner",
    "common word": "{common}",
    "two words": "{common} {middling}",
    "phrase": '"{middling} {common}"',
    "prefix": "{prefix}*",
    "cjk": "請求書",
    "nothing": "zzqqxx",
}


def _vocabulary(n: int, rnd: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rnd.choice(_SYLLABLES) for _ in range(rnd.randint(2, 4))))
    return sorted(words)


def _page_text(rnd: random.Random, vocab: list[str], weights: list[float], k: int) -> str:
    if k % 20 == 0:  # one page in twenty in Japanese
        chars = rnd.choices(_CJK, _CJK_WEIGHTS, k=400)
        for _ in range(4):
            chars.insert(rnd.randrange(len(chars)), rnd.choice(_CJK_WORDS))
        return "".join(chars)
    words = rnd.choices(vocab, weights, k=220)
    if k % 997 == 0:
        words[rnd.randrange(len(words))] = "toner"
    return " ".join(words)


def build_index(state_dir: Any, inbox: str, pages: int) -> dict:
    """A journal with a done row per document and a search index of `pages` pages."""
    from ocrd.web.search import SearchIndex
    from ocrd.work.journal import Journal

    rnd = random.Random(34)
    vocab = _vocabulary(20_000, rnd)
    weights = [1.0 / (rank + 1) for rank in range(len(vocab))]  # Zipf
    journal_path = state_dir / "journal.sqlite3"
    Journal(journal_path).close()
    docs = pages // PAGES_PER_DOC
    now = time.time()
    db = sqlite3.connect(journal_path)
    db.executemany(
        "INSERT INTO jobs (id, inbox, relpath, claim_path, size, mtime_ns, state, attempts, "
        "pages, output, created, started, finished, degraded) "
        "VALUES (?,?,?,'',1000,1,'done',1,?,?,?,?,?,0)",
        [(d + 1, inbox, f"docs/doc_{d:06d}.pdf", PAGES_PER_DOC,
          f"{inbox}-out/docs/doc_{d:06d}.md", now - docs + d, now - docs + d,
          now - docs + d + 1) for d in range(docs)])
    db.commit()
    db.close()
    index = SearchIndex(state_dir / "search.sqlite3")
    t0 = time.perf_counter()
    k = 0
    for d in range(docs):
        texts = []
        for p in range(PAGES_PER_DOC):
            texts.append((p + 1, _page_text(rnd, vocab, weights, k)))
            k += 1
        index.add(d + 1, inbox, f"{inbox}-out/docs/doc_{d:06d}.md", now, texts)
    seconds = time.perf_counter() - t0
    size = (state_dir / "search.sqlite3").stat().st_size
    index.close()
    return {"pages": k, "documents": docs, "index_seconds": round(seconds, 1),
            "pages_indexed_per_s": round(k / seconds), "index_mb": round(size / 1e6, 1),
            "common": vocab[0], "middling": vocab[40], "prefix": vocab[3][:3]}


def search_queries(quick: bool) -> list[Result]:
    """p95 of each kind of query over a 100,000-page index, through the real server (the
    page and the API), the client in the same process."""
    from ocrd.config.load import parse_config
    from ocrd.web import Console

    root = fresh("search-queries")
    inbox = str(root / "inbox")
    cfg = parse_config({"state_dir": str(root / "state"), "web": {"listen": "127.0.0.1:0"},
                        "inboxes": [{"path": inbox, "outbox": inbox + "-out",
                                     "failed": inbox + "-failed", "on_success": "delete"}]},
                       root)
    cfg.state_dir.mkdir(parents=True)
    built = build_index(cfg.state_dir, inbox, PAGES)
    _log(f"search: {built['pages']} pages indexed in {built['index_seconds']} s "
         f"({built['index_mb']} MB)")
    console = Console.start(cfg, None)
    host, _, port = (console.address or "").rpartition(":")
    repeats = 20 if quick else 60
    per: dict[str, Any] = {}
    try:
        for kind, q in QUERIES.items():
            text = q.format(**built)
            for path in (f"/api/search?q={_quote(text)}", f"/search?q={_quote(text)}"):
                status, _ = _get(host, int(port), path)
                assert status == 200, (path, status)
                times = sorted(_get(host, int(port), path)[1] for _ in range(repeats))
                p95 = times[min(len(times) - 1, int(round(0.95 * len(times))) - 1)]
                key = f"{kind} ({'api' if path.startswith('/api') else 'page'})"
                per[key] = {"query": text, "p50_ms": round(statistics.median(times), 2),
                            "p95_ms": round(p95, 2)}
                _log(f"  {key} {text!r}: p50 {per[key]['p50_ms']} ms, p95 {per[key]['p95_ms']} ms")
    finally:
        console.stop()
    worst = max(per, key=lambda k: per[k]["p95_ms"])
    return [Result("search_p95_vs_100ms_100k_pages", per[worst]["p95_ms"] / P95_TARGET_MS,
                   1.0, "<=", {"index": built, "repeats": repeats, "worst": worst,
                               "queries": per})]


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text)


def search_throughput(quick: bool) -> list[Result]:
    """Conversion with the search index filled meanwhile ÷ without it (simulated engine,
    the saturation documents, alternating runs, best of each)."""
    docs = saturation_docs(quick)
    off, on = _alternating("search", docs, 3 if quick else 4,
                           {"web": {"search": False}}, {"web": {"search": True}})
    best_off = max(r["pages_per_s"] for r in off)
    best_on = max(r["pages_per_s"] for r in on)
    # what the indexer had done by the time each "on" daemon was stopped (it stops as
    # soon as the last Markdown file is there)
    indexed = []
    for k in range(len(on)):
        path = OUT / f"search-b{k}" / "state" / "search.sqlite3"
        with contextlib.closing(sqlite3.connect(path)) as db:
            indexed.append(db.execute("SELECT count(*) FROM pages").fetchone()[0])
    return [Result("search_on_vs_off_throughput", best_on / best_off, 0.98, ">=",
                   {"off": off, "on": on, "pages_indexed_when_stopped": indexed})]


SEARCH_CASES = {
    "search_queries": search_queries,
    "search_throughput": search_throughput,
}
