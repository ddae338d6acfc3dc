"""The console's benchmarks: its lists and API over a journal of 100,000 rows, the
throughput a daemon keeps while browsers and a script poll its console — or while a
crowd of connections that send nothing sits on it — and page previews made on demand:
that conversion pays nothing for them, and that their byte limit holds while every page
is looked at."""

from __future__ import annotations

import http.client
import os
import random
import resource
import selectors
import socket
import sqlite3
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from bench.cases import SIMULATED, Doc, Result, _log, fresh, saturation_docs
from bench.harness import OUT, DaemonProcess, daemon_config, drop_file, pdf_bytes, wait_for

ROWS = 100_000
TESSERACT = {"kind": "tesseract"}
P95_TARGET_MS = 300.0
QUERIES = [
    "/files", "/files?state=failed", "/files?state=degraded", "/files?q=scan_09999",
    "/files?page=1500", "/files?inbox={inbox_b}&state=done", "/failed",
    "/failed?reason=engine_failed&page=20", "/", "/fragments/live",
    "/api/files?limit=50", "/api/files?state=failed&offset=4000",
    "/api/files?q=0999&limit=100", "/api/files?inbox={inbox_b}&limit=500", "/api/status",
]


def _fill_journal(path: Path, inboxes: list[str], rows: int) -> None:
    """rows jobs as a long-running daemon leaves them: mostly done, some degraded,
    failed, retried, a few waiting; written straight into the journal's own schema."""
    from ocrd.work.journal import Journal

    Journal(path).close()  # schema, indexes, added columns
    rnd = random.Random(18)
    reasons = ["engine_failed", "encrypted", "truncated", "unsupported_format", "too_large"]
    now = time.time()
    data = []
    for i in range(rows):
        inbox = inboxes[i % len(inboxes)]
        t = now - (rows - i) * 30.0
        roll = rnd.random()
        state, reason, degraded = "done", None, 0
        if roll < 0.05:
            state, reason = "failed", rnd.choice(reasons)
        elif roll < 0.06:
            state, reason = "retried", rnd.choice(reasons)
        elif roll < 0.09:
            degraded = 1
        elif i > rows - 20:
            state = "claimed"
        rel = f"scans/{time.strftime('%Y-%m', time.localtime(t))}/scan_{i:06d}.pdf"
        out = f"{inbox}-out/{rel[:-4]}.md" if state == "done" else f"{inbox}-failed/{rel}"
        data.append((inbox, rel, "", 100_000 + i, i, state, 1, rnd.randint(1, 40), reason,
                     "a sentence for a human" if reason else None, out, t, t + 1,
                     t + 20 if state != "claimed" else None, degraded))
    db = sqlite3.connect(path)
    db.executemany(
        "INSERT INTO jobs (inbox, relpath, claim_path, size, mtime_ns, state, attempts, pages,"
        " reason, message, output, created, started, finished, degraded) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", data)
    db.commit()
    db.close()


def _get(host: str, port: int, path: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, (time.perf_counter() - t0) * 1000
    finally:
        conn.close()


def console_queries(quick: bool) -> list[Result]:
    """p95 latency of each list, page and API call over 100,000 journal rows, through the
    real server (uvicorn on its thread; the client in the same process, sharing its
    GIL, so a little pessimistic)."""
    from ocrd.config.load import parse_config
    from ocrd.web import Console

    root = fresh("console-queries")
    inboxes = [str(root / "a" / "inbox"), str(root / "b" / "inbox")]
    cfg = parse_config({"state_dir": str(root / "state"), "web": {"listen": "127.0.0.1:0"},
                        "inboxes": [{"path": p, "outbox": p + "-out", "failed": p + "-failed",
                                     "on_success": "delete"} for p in inboxes]}, root)
    cfg.state_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    _fill_journal(cfg.state_dir / "journal.sqlite3", inboxes, ROWS)
    _log(f"console: {ROWS} journal rows written in {time.perf_counter() - t0:.1f} s")
    console = Console.start(cfg, None)
    host, _, port = (console.address or "").rpartition(":")
    repeats = 20 if quick else 60
    per: dict[str, Any] = {}
    try:
        for q in QUERIES:
            path = q.format(inbox_b=inboxes[1])
            status, _ = _get(host, int(port), path)  # warm: compiled template, page cache
            assert status == 200, (path, status)
            times = sorted(_get(host, int(port), path)[1] for _ in range(repeats))
            p95 = times[min(len(times) - 1, int(round(0.95 * len(times))) - 1)]
            per[q] = {"p50_ms": round(statistics.median(times), 2), "p95_ms": round(p95, 2),
                      "max_ms": round(times[-1], 2)}
            _log(f"  {q}: p50 {per[q]['p50_ms']} ms, p95 {per[q]['p95_ms']} ms")
    finally:
        console.stop()
    worst = max(per, key=lambda k: per[k]["p95_ms"])
    return [Result("console_p95_vs_300ms_100k_rows", per[worst]["p95_ms"] / P95_TARGET_MS,
                   1.0, "<=", {"rows": ROWS, "repeats": repeats, "worst": worst,
                               "queries": per})]


class Poller:
    """What the console's users do while files convert: `tabs` overview pages each
    fetching /fragments/live every 2 s (console.js), and a script asking /api/status and
    /api/files every second."""

    def __init__(self, port: int, tabs: int = 4) -> None:
        self.port = port
        self.tabs = tabs
        self.requests = 0
        self.errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._tab, args=(k,), daemon=True)
                         for k in range(tabs)]
        self._threads.append(threading.Thread(target=self._script, daemon=True))

    def _call(self, path: str) -> None:
        try:
            status, _ = _get("127.0.0.1", self.port, path)
            self.errors += status != 200
        except OSError:
            self.errors += 1
        self.requests += 1

    def _tab(self, k: int) -> None:
        self._stop.wait(k * 2.0 / self.tabs)
        while not self._stop.is_set():
            self._call("/fragments/live")
            self._stop.wait(2.0)

    def _script(self) -> None:
        while not self._stop.is_set():
            self._call("/api/status")
            self._call("/api/files?limit=50")
            self._stop.wait(1.0)

    def __enter__(self) -> Poller:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)


class IdleCrowd:
    """`n` connections to the console that send nothing, each opened again `again`
    seconds after the server closes it (a client that insists), from a thread of this
    process."""

    def __init__(self, port: int, n: int, again: float = 1.0) -> None:
        self.port, self.n, self.again = port, n, again
        self.opened = self.closed_by_server = self.refused = 0
        self.most_open = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, sel: selectors.BaseSelector) -> None:
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", self.port))
        except BlockingIOError:
            pass
        except OSError:
            self.refused += 1
            s.close()
            return
        sel.register(s, selectors.EVENT_READ)
        self.opened += 1

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        due: list[float] = []
        for _ in range(self.n):
            self._open(sel)
        while not self._stop.is_set():
            self.most_open = max(self.most_open, len(sel.get_map()))
            for key, _ in sel.select(timeout=0.1):
                sel.unregister(key.fileobj)
                key.fileobj.close()  # the server closed it (or refused it at once)
                self.closed_by_server += 1
                due.append(time.monotonic() + self.again)
            now = time.monotonic()
            while due and due[0] <= now:
                due.pop(0)
                self._open(sel)
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        sel.close()

    def __enter__(self) -> IdleCrowd:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < self.n + 256:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, self.n + 1024), hard))
        self._thread.start()
        wait_for(lambda: self.opened >= self.n, 60, f"{self.n} connections opened")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def facts(self) -> dict:
        return {"connections": self.n, "opened": self.opened,
                "closed_by_server": self.closed_by_server, "refused": self.refused,
                "most_open_at_once": self.most_open}


def _convert(root: Path, docs: list[Doc], web: dict, poll: bool = False,
             watch: Path | None = None, engine: dict | None = None,
             crowd: int = 0, nofile: str | None = None, after: Any = None) -> dict:
    """Drop the documents at once into a fresh daemon; pages/s from the first byte to
    the last Markdown file. `watch`: a folder whose size is sampled meanwhile; `crowd`:
    idle connections held on the console meanwhile; `nofile`: the daemon's descriptor
    limit (soft:hard, prlimit); `after`: called with the console's port once converted,
    before the daemon stops."""
    port = _free_port()
    cfg = daemon_config(root, engine or SIMULATED)
    cfg["web"] = {"listen": f"127.0.0.1:{port}", **web}
    sizes: list[int] = []
    prefix = ["prlimit", f"--nofile={nofile}"] if nofile else None
    idle = IdleCrowd(port, crowd) if crowd else None
    with DaemonProcess(root, cfg, prefix=prefix).start() as d:
        sampler = _Sampler(watch, sizes) if watch is not None else None
        with Poller(port) if poll else _Nothing() as poller, idle or _Nothing():
            t0 = time.time()
            for doc in docs:
                drop_file(d.inbox / doc.name, doc.data)
            done = d.wait_markdown(len(docs), 60 + 3 * sum(x.pages for x in docs))
        log_text = d.log_text()
        if after is not None:
            after(port)
        if sampler is not None:
            wait_for(lambda: sampler.settled(), 60, "previews written")
            sampler.stop()
    pages = sum(doc.pages for doc in docs)
    seconds = done[-1] - t0
    out = {"pages": pages, "seconds": round(seconds, 3), "pages_per_s": pages / seconds}
    if poll:
        out.update(requests=poller.requests, request_errors=poller.errors)
    if sizes:
        out.update(max_bytes_seen=max(sizes), final_bytes=sizes[-1])
    if idle is not None:
        out.update(crowd=idle.facts(),
                   accept_failures_logged=log_text.count("socket.accept() out of system"),
                   log_lines=log_text.count("\n"))
    return out


class _Nothing:
    requests = errors = 0

    def __enter__(self) -> _Nothing:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _Sampler:
    """The total size of a folder tree, every 0.1 s, in a thread."""

    def __init__(self, folder: Path, into: list[int]) -> None:
        self.folder = folder
        self.into = into
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.into.append(tree_bytes(self.folder))
            self._stop.wait(0.1)

    def settled(self) -> bool:
        return len(self.into) > 10 and len(set(self.into[-10:])) == 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.into.append(tree_bytes(self.folder))


def tree_bytes(folder: Path) -> int:
    total = 0
    for base, _dirs, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(base, f)).st_size
            except OSError:
                pass
    return total


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alternating(name: str, docs: list[Doc], rounds: int, a: dict, b: dict) -> tuple[list, list]:
    """Runs of set-ups a and b in turns, so both see the same machine; the order swaps
    every round (a, b, b, a, a, b …), so that neither always runs first in a pair."""
    runs_a, runs_b = [], []
    for k in range(rounds):
        pair = [("a", a, runs_a), ("b", b, runs_b)]
        for label, setup, into in (pair if k % 2 == 0 else pair[::-1]):
            into.append(_convert(fresh(f"{name}-{label}{k}"), docs, **setup))
            _log(f"  {name} {label}{k}: {into[-1]['pages_per_s']:.2f} pages/s")
    return runs_a, runs_b


def console_polling(quick: bool) -> list[Result]:
    """Converting while four overview tabs and an API script poll the console ÷ the
    same with the console idle (simulated engine, best of the alternating runs)."""
    docs = saturation_docs(quick)
    idle, polled = _alternating("polling", docs, 2 if quick else 3,
                                {"web": {}}, {"web": {}, "poll": True})
    best_idle = max(r["pages_per_s"] for r in idle)
    best_polled = max(r["pages_per_s"] for r in polled)
    return [Result("console_polled_vs_idle_throughput", best_polled / best_idle, 0.98, ">=",
                   {"idle": idle, "polled": polled})]


IDLE_CONNECTIONS = 1100
# systemd's default soft limit, here the hard one too: raising it cannot help
CROWD_NOFILE = "1024:1024"


def console_idle_crowd(quick: bool) -> list[Result]:
    """Converting while 1,100 connections that send nothing sit on the console (each
    opened again a second after the server closes it) ÷ the same with the console idle;
    the daemon may hold 1,024 descriptors in both (simulated engine, best of the
    alternating runs)."""
    docs = saturation_docs(quick)
    idle, crowded = _alternating(
        "crowd", docs, 2 if quick else 3, {"web": {}, "nofile": CROWD_NOFILE},
        {"web": {}, "nofile": CROWD_NOFILE, "crowd": IDLE_CONNECTIONS})
    best_idle = max(r["pages_per_s"] for r in idle)
    best_crowded = max(r["pages_per_s"] for r in crowded)
    return [Result("console_1100_idle_connections_vs_idle_throughput",
                   best_crowded / best_idle, 0.95, ">=", {"idle": idle, "crowded": crowded,
                                                          "nofile": CROWD_NOFILE})]


def _ask_every_preview(port: int, pages: int, limit_ids: int = 100) -> dict:
    """Every page's image through the console, as a person paging through reviews
    would: the first time (rendered from the original) and again (from the cache)."""
    import json

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", f"/api/files?state=done&limit={limit_ids}",
                     headers={"Host": f"127.0.0.1:{port}"})
        files = json.loads(conn.getresponse().read())["files"]
    finally:
        conn.close()
    first, again, asked = [], [], 0
    for f in files:
        for page in range(1, (f["pages"] or 0) + 1):
            path = f"/files/{f['id']}/pages/{page}.jpg"
            status, ms = _get("127.0.0.1", port, path)
            assert status == 200, (path, status)
            first.append(ms)
            again.append(_get("127.0.0.1", port, path)[1])
            asked += 1
    assert asked == pages, (asked, pages)
    return {"pages": asked, "first_ms_median": round(statistics.median(first), 1),
            "first_ms_p95": round(sorted(first)[int(0.95 * (len(first) - 1))], 1),
            "cached_ms_median": round(statistics.median(again), 1)}


def previews(quick: bool) -> list[Result]:
    """Page previews, made on demand: conversion with them on ÷ off (they must cost it
    nothing), and the byte limit holding while every page is looked at."""
    docs = saturation_docs(quick)
    off, on = _alternating("previews", docs, 3,
                           {"web": {"previews": False}}, {"web": {"previews": True}})
    made = tree_bytes(OUT / "previews-b0" / "state" / "previews")
    limit = 4 * 1024**2
    pages = sum(d.pages for d in docs)
    asked: dict = {}
    held = _convert(fresh("previews-limit"), docs, {"previews_max_bytes": limit},
                    watch=(OUT / "previews-limit") / "state" / "previews",
                    after=lambda port: asked.update(_ask_every_preview(port, pages)))
    files = list((OUT / "previews-limit" / "state" / "previews").rglob("*.jpg"))
    from PIL import Image

    dims = {Image.open(p).size for p in files[:50]}
    _log(f"  previews on demand: {asked}; limit {limit} B: max seen "
         f"{held['max_bytes_seen']} B, final {held['final_bytes']} B")
    # the CPU engine: tesseract takes the cores
    few = [Doc(f"t{i}.pdf", pdf_bytes(n, i * 5), n, i * 5) for i, n in enumerate([1, 4, 2, 3])]
    tess_off, tess_on = _alternating("previews-tesseract", few, 2,
                                     {"web": {"previews": False}, "engine": TESSERACT},
                                     {"web": {"previews": True}, "engine": TESSERACT})
    best_off = max(r["pages_per_s"] for r in off)
    best_on = max(r["pages_per_s"] for r in on)
    return [
        Result("previews_on_vs_off_throughput", best_on / best_off, 0.98, ">=",
               {"off": off, "on": on, "bytes_made_while_converting": made}),
        Result("previews_on_vs_off_tesseract", max(r["pages_per_s"] for r in tess_on) /
               max(r["pages_per_s"] for r in tess_off), 0.98, ">=",
               {"off": tess_off, "on": tess_on}),
        Result("previews_bytes_vs_limit", held["max_bytes_seen"] / limit, 1.05, "<=",
               {"limit": limit, "run": held, "on_demand": asked,
                "long_side_px": max((max(d) for d in dims), default=0)}),
    ]


CONSOLE_CASES = {
    "console_queries": console_queries,
    "console_polling": console_polling,
    "console_idle_crowd": console_idle_crowd,
    "previews": previews,
}
