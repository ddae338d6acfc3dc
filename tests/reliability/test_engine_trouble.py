"""An engine that raises, hangs, returns garbage, dies or cannot be reached: bounded
retries, pages re-queued, never a silent drop. The simulated engine with injected faults
(tests/simulated_engines.py's FaultyEngine) stands in for a GPU engine; the faults are
deterministic.

The remote engine's servers are fake `vllm serve`s (tests/fake_vllm.py's
FakeVllm, served from a thread of the test) that fail as real ones do: drop a thousand
pages and refuse connections, hang behind a live /v1/models, answer with something that
is not a chat completion or with text no file should hold. No file may fail for that.
"""

from __future__ import annotations

import html.parser
import json
import time
from pathlib import Path
from typing import Any

import pytest
from fake_vllm import FakeVllm, FakeVllmThread, engine_section
from helpers import (
    Daemon,
    claimed_files,
    drop,
    files_under,
    free_port,
    make_pdf,
    sentence_lines,
    wait_for,
)
from markdown_it import MarkdownIt
from simulated_engines import FAULTY, SIMULATED

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]

FAST = {"kind": SIMULATED, "options": {"step_seconds": 0.01, "decode_steps": 5}}


def docs(tmp_path: Path, n: int, pages: int = 2) -> list[Path]:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    return [make_pdf(src / f"doc{i}.pdf", [sentence_lines(90 + i, 2)] * pages)
            for i in range(n)]


def test_errors_hangs_and_garbage_are_retried_and_every_page_kept(tmp_path: Path) -> None:
    engine = {"kind": FAULTY, "options": {"inner": FAST, "error_every": 3, "hang_every": 7,
                                          "garbage_every": 5}}
    files = docs(tmp_path, 6)
    with Daemon(tmp_path / "d", engine=engine,
                schedule={"page_timeout_seconds": 1.5, "page_retries": 4}) as d:
        d.start()
        for f in files:
            drop(f, d.inbox / f.name)
        for f in files:
            wait_for((d.outbox / f.name.replace(".pdf", ".md")).exists, 90, f.name)
        errs = d.events("page_engine_error")
    assert any(e["error"] == "timed out" for e in errs), errs  # hangs were cut off
    assert any("injected: engine error" in e["error"] for e in errs)
    assert files_under(d.failed) == []
    for f in files:
        meta = json.loads((d.outbox / f.name.replace(".pdf", ".json")).read_text())
        assert [p["page"] for p in meta["pages"]] == [1, 2]
        text = (d.outbox / f.name.replace(".pdf", ".md")).read_text()
        assert text.count("<!-- page ") == 2


def test_a_page_the_engine_always_fails_fails_its_file_not_the_daemon(tmp_path: Path) -> None:
    engine = {"kind": FAULTY, "options": {"inner": FAST, "error_every": 1}}
    (f,) = docs(tmp_path, 1)
    with Daemon(tmp_path / "d", engine=engine, schedule={"page_retries": 1}) as d:
        d.start()
        drop(f, d.inbox / f.name)
        wait_for((d.failed / (f.name + ".error.json")).exists, 60, "failed file")
        assert d.proc.poll() is None
    err = json.loads((d.failed / (f.name + ".error.json")).read_text())
    assert err["reason"] == "engine_failed" and "2 times" in err["message"]


def test_engine_death_exits_non_zero_and_the_next_start_finishes_the_work(
        tmp_path: Path) -> None:
    files = docs(tmp_path, 5)
    d = Daemon(tmp_path / "d", engine={"kind": FAULTY, "options": {"inner": FAST, "die_after": 3}})
    with d:
        d.start()
        for f in files:
            drop(f, d.inbox / f.name)
        wait_for(lambda: d.proc.poll() is not None, 60, "the daemon to exit")
        assert d.proc.returncode == 1
        assert d.event("engine_dead")
        assert files_under(d.failed) == []  # engine death is not a page failure
        d.config["engine"] = FAST
        d.start()
        for f in files:
            wait_for((d.outbox / f.name.replace(".pdf", ".md")).exists, 60, f.name)
    assert sorted(p.name for p in d.outbox.glob("*.md")) == sorted(
        f.name.replace(".pdf", ".md") for f in files)
    assert sorted(p.name for p in d.archive.iterdir()) == sorted(f.name for f in files)


def test_unreachable_engine_pauses_intake_and_fails_nothing(tmp_path: Path) -> None:
    files = docs(tmp_path, 3, pages=1)
    engine = {"kind": FAULTY, "options": {"inner": FAST, "unavailable_seconds": 5}}
    with Daemon(tmp_path / "d", engine=engine) as d:
        d.start()
        drop(files[0], d.inbox / files[0].name)
        wait_for(lambda: d.event("engine_unavailable"), 30, "engine_unavailable")
        for f in files[1:]:
            drop(f, d.inbox / f.name)
        # intake is paused: the later files stay in the inbox, unclaimed
        assert not (d.outbox / "doc0.md").exists()
        wait_for(lambda: d.event("engine_available"), 30, "engine_available")
        for f in files:
            wait_for((d.outbox / f.name.replace(".pdf", ".md")).exists, 60, f.name)
        unavailable_at = d.event("engine_unavailable")["timestamp"]
        available_at = d.event("engine_available")["timestamp"]
        claims = {e["file"]: e["timestamp"] for e in d.events("file_claimed")}
    assert claims["doc1.pdf"] > available_at and claims["doc2.pdf"] > available_at
    assert claims["doc0.pdf"] < unavailable_at
    assert files_under(d.failed) == []


# ---- the remote engine against servers that fail (fake `vllm serve`s) ----------------


def remote(*urls: str, **fields: Any) -> dict:
    return engine_section(*urls, **fields)


def small_pdfs(folder: Path, files: int, pages: int) -> list[Path]:
    """PDFs of `pages` one-inch pages (144 px square at the remote engine's 144 dpi):
    a thousand pages in flight cost little to render."""
    from reportlab.pdfgen import canvas

    folder.mkdir(exist_ok=True)
    out = []
    for i in range(files):
        path = folder / f"small{i:03d}.pdf"
        c = canvas.Canvas(str(path), pagesize=(72, 72))
        for k in range(pages):
            c.setFont("Helvetica", 10)
            c.drawString(8, 30, f"{i}.{k}")
            c.showPage()
        c.save()
        out.append(path)
    return out


def markdowns(d: Daemon, files: list[Path]) -> list[Path]:
    return [d.outbox / f.name.replace(".pdf", ".md") for f in files]


def test_a_fake_server_dropping_1100_pages_and_refusing_for_15_s_fails_no_file(
        tmp_path: Path) -> None:
    """150 files of 8 pages, all in flight to one server, which drops 1,100 of them at
    once and refuses connections for 15 s (as a server killed under full load): every
    file converts once it is back, none fails."""
    files = small_pdfs(tmp_path / "src", 150, 8)
    with FakeVllmThread(FakeVllm(latency=3600, limit=5000)) as server, \
            Daemon(tmp_path / "d", engine=remote(server.server.url, concurrency_per_url=1200,
                                                 queue_per_url=0)) as d:
        d.start()
        for f in files:
            drop(f, d.inbox / f.name)
        wait_for(lambda: server.server.in_flight >= 1100, 600, "1,100 pages in flight")
        held = server.server.in_flight
        server.call(lambda s: s.stop())  # every page dropped; connections refused
        time.sleep(15)  # the outage: what the daemon does meanwhile is under test
        server.server.latency = 0.01
        server.call(lambda s: s.start())  # back, on the same port
        for md in markdowns(d, files):
            wait_for(lambda md=md: md.exists() or d.events("file_failed"), 600, md.name)
        failed = d.events("file_failed")
        waited = d.event("engine_unavailable")
    assert held >= 1100 and server.server.disconnects >= 1100
    assert failed == [] and files_under(d.failed) == []
    assert waited is not None  # the pages waited for the server


def test_a_hung_server_makes_files_wait_not_fail(tmp_path: Path) -> None:
    """A server whose /v1/models answers but whose completions never come back (a hung
    engine core): the pages wait as for a refused connection; once the server completes
    pages again, every file converts."""
    files = small_pdfs(tmp_path / "src", 3, 2)
    with FakeVllmThread(FakeVllm(hang=True)) as server, \
            Daemon(tmp_path / "d", engine=remote(server.server.url, request_timeout_seconds=2),
                   schedule={"page_retries": 1}) as d:
        d.start()
        for f in files:
            drop(f, d.inbox / f.name)
        # what comes first: the engine found unavailable, or a file failed
        wait_for(lambda: d.event("engine_unavailable") or files_under(d.failed), 120,
                 "the hung server to be noticed")
        assert files_under(d.failed) == []
        assert d.event("remote_server_sick") is not None
        server.server.hang = False  # it works again
        for md in markdowns(d, files):
            wait_for(md.exists, 120, md.name)
        recovered = d.event("remote_server_recovered")
    assert files_under(d.failed) == [] and recovered is not None


HOSTILE = ("Total\ud800 due\x00 now\x1b[2J.\n\n<script>alert(1)</script>\n\n"
           '<img src=x onerror="alert(2)">\n\n'
           '<table><tr><td colspan="2" onclick="alert(3)">a</td></tr></table>\n\n'
           "[click](javascript:alert(4)) [secret](file:///etc/shadow) "
           "[data](data:text/html;base64,PHNjcmlwdD4=)\n\n![](../../../../etc/passwd)\n\n"
           "<!-- page 9 --> [fine](https://example.com/a)")


class _Active(html.parser.HTMLParser):
    """The tags and attributes of rendered HTML that a viewer would act on: scripts and
    their kin, event handlers, links to scripts, files or data, images from anywhere but
    a path inside the outbox."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "iframe", "object", "embed", "svg", "math"):
            self.found.append(tag)
        for name, value in attrs:
            url = (value or "").strip().lower()
            scheme = url.split("/", 1)[0].partition(":")[1] and url.split(":", 1)[0]
            if name.startswith("on") or name == "style":
                self.found.append(f"{tag} {name}")
            elif name == "href" and scheme not in ("", "http", "https", "mailto"):
                self.found.append(f"{tag} href={value}")
            elif name == "src" and (scheme or url.startswith("/") or ".." in url.split("/")):
                self.found.append(f"{tag} src={value}")


def test_model_text_that_is_not_clean_or_is_active_is_made_safe(tmp_path: Path) -> None:
    """A lone surrogate, NUL and an escape sequence become U+FFFD; the model's scripts,
    event handlers, script/file/data links and paths out of the outbox are inert in the
    .md (rendered as an HTML-rendering Markdown viewer does), its table stays a table;
    the file converts, with its .json and its .md."""
    (f,) = small_pdfs(tmp_path / "src", 1, 2)
    with FakeVllmThread(FakeVllm(text=HOSTILE)) as server, \
            Daemon(tmp_path / "d", engine=remote(server.server.url)) as d:
        d.start()
        drop(f, d.inbox / f.name)
        md = d.outbox / "small000.md"
        wait_for(lambda: md.exists() or files_under(d.failed), 60, "an outcome")
    assert files_under(d.failed) == []
    text = md.read_text(encoding="utf-8")  # valid UTF-8
    meta = json.loads((d.outbox / "small000.json").read_text(encoding="utf-8"))
    assert meta["status"] == "ok" and len(meta["pages"]) == 2
    assert "\x00" not in text and "\x1b" not in text and "Total\ufffd due\ufffd now\ufffd" in text
    assert text.count("<!-- page ") == 2  # the model's comment is text, not a page mark
    rendered = MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
    active = _Active()
    active.feed(rendered)
    assert active.found == []
    assert '<td colspan="2">a</td>' in rendered  # the table kept, without its handler
    assert 'href="https://example.com/a"' in rendered  # an ordinary link kept


def test_answers_of_another_shape_go_to_another_server(tmp_path: Path) -> None:
    """One server answers `content: 42`, the other OpenAI's list of parts: the first is
    the server's error (its pages go to the other one), the second is text."""
    parts = [{"type": "text", "text": "Joined "}, {"type": "text", "text": "parts"}]
    files = small_pdfs(tmp_path / "src", 4, 2)
    with FakeVllmThread(FakeVllm(text=42)) as bad, FakeVllmThread(FakeVllm(text=parts)) \
            as good, Daemon(tmp_path / "d", engine=remote(bad.server.url, good.server.url)) \
            as d:
        d.start()
        for f in files:
            drop(f, d.inbox / f.name)
        for md in markdowns(d, files):
            wait_for(lambda md=md: md.exists() or files_under(d.failed), 120, md.name)
    assert files_under(d.failed) == []
    assert all(md.read_text().count("Joined parts") == 2 for md in markdowns(d, files))
    assert len(bad.server.requests) >= 1


def test_a_stop_during_an_outage_ends_at_once_and_leaves_the_file_claimed(
        tmp_path: Path) -> None:
    """SIGTERM while no server answers: no page can finish, so the daemon does not wait
    out drain_timeout_seconds; the file stays claimed and converts at the next start."""
    (f,) = small_pdfs(tmp_path / "src", 1, 2)
    port = free_port()
    with Daemon(tmp_path / "d", engine=remote(f"http://127.0.0.1:{port}/v1"),
                drain_timeout_seconds=600) as d:
        d.start()
        drop(f, d.inbox / f.name)
        d.wait_event("engine_unavailable", 60)
        assert d.stop(timeout=60) == 0  # not 600 s
        assert claimed_files(d.inbox) != [] and files_under(d.failed) == []
        assert d.event("drain_cut") is not None
        with FakeVllmThread(FakeVllm(port=port)):
            d.start()
            wait_for((d.outbox / "small000.md").exists, 60, "small000.md")
