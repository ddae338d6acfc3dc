"""A check of an inbox file that keeps failing with an exception ocrd did not foresee (a
bug) does not leave the file in the inbox for ever: after a few tries it is claimed, to
fail as internal_error with the traceback — the real intake, journal, claims and render
workers, with the readiness decision made to raise (the only fake here)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from helpers import make_pdf, sentence_lines
from record_schemas import ERROR, valid

from ocrd.config.load import parse_config
from ocrd.intake import readiness
from ocrd.intake.claims import Claims
from ocrd.intake.inboxes import Inboxes
from ocrd.intake.loop import MAX_CHECK_FAILURES, Intake
from ocrd.render.pool import RenderPool
from ocrd.service.metrics import Metrics
from ocrd.work.journal import Journal
from ocrd.work.outcomes import Outcomes


def test_fake_bug_in_a_check_fails_the_file_as_internal_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    make_pdf(inbox / "a.pdf", [sentence_lines(1, 2)])
    cfg = parse_config({"state_dir": str(tmp_path / "state"), "inboxes": [{
        "path": str(inbox), "outbox": str(tmp_path / "out"), "failed": str(tmp_path / "f"),
        "on_success": "keep", "watch": "polling", "quiet_seconds": 0}]}, tmp_path)
    for folder in ("state", "out", "f"):
        (tmp_path / folder).mkdir()
    calls = []

    def bug(*args: object, **kwargs: object) -> None:
        calls.append(args)
        raise KeyError("a bug in deciding")

    monkeypatch.setattr(readiness, "decide", bug)

    async def scenario() -> list:
        journal = Journal(tmp_path / "state" / "journal.sqlite3")
        inboxes = Inboxes("b" * 32, is_kept=lambda *_: False)
        box = inboxes.add(cfg.inboxes[0])
        pool = RenderPool(1)
        submitted: list = []
        engine_open = asyncio.Event()
        engine_open.set()
        intake = Intake(cfg, inboxes, Claims(journal, Metrics()), pool, submitted.append,
                        engine_open, Metrics(), lambda: None)
        try:
            await inboxes.scan(box, lambda: None)
            (cand,) = box.tracker.candidates.values()
            for _ in range(MAX_CHECK_FAILURES + 1):
                cand.next_check = 0.0
                await intake.check(box, cand)
            for item in submitted:  # what the daemon's jobs do with an item failed so
                await Outcomes(journal, Metrics(), resubmit=print).fail(item, item.error)
            return submitted
        finally:
            inboxes.stop()
            await pool.close()
            journal.close()

    (item,) = asyncio.run(scenario())
    assert len(calls) == MAX_CHECK_FAILURES  # tried, then given up on
    assert item.error.reason == "internal_error"
    assert "KeyError" in str(item.error) and "a bug in deciding" in item.error.details
    assert not (inbox / "a.pdf").exists()
    err = json.loads((tmp_path / "f" / "a.pdf.error.json").read_text())
    valid(ERROR, err)
    assert err["reason"] == "internal_error" and "KeyError" in err["traceback"]
    assert (tmp_path / "f" / "a.pdf").exists()
