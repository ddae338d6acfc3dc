"""An engine that raises, hangs, returns garbage, dies or cannot be reached: bounded
retries, pages re-queued, never a silent drop. The simulated engine with injected faults
(engine.testing_faults) stands in for a GPU engine; the faults are deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import Daemon, drop, files_under, make_pdf, sentence_lines, wait_for

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]

FAST = {"kind": "simulated", "simulated": {"step_seconds": 0.01, "decode_steps": 5}}


def docs(tmp_path: Path, n: int, pages: int = 2) -> list[Path]:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    return [make_pdf(src / f"doc{i}.pdf", [sentence_lines(90 + i, 2)] * pages)
            for i in range(n)]


def test_errors_hangs_and_garbage_are_retried_and_every_page_kept(tmp_path: Path) -> None:
    engine = {**FAST, "testing_faults": {"error_every": 3, "hang_every": 7, "garbage_every": 5}}
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
    engine = {**FAST, "testing_faults": {"error_every": 1}}
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
    d = Daemon(tmp_path / "d", engine={**FAST, "testing_faults": {"die_after": 3}})
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
    engine = {**FAST, "testing_faults": {"unavailable_seconds": 5}}
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
