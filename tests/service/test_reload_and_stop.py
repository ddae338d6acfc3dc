"""Reloads never strand a claimed file; `drain_timeout_seconds: 0` stops at once; a file
moved into a local inbox is claimed without waiting the quiet period."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from helpers import Daemon, claimed_files, make_pdf, sentence_lines, wait_for
from simulated_engines import SIMULATED

pytestmark = pytest.mark.e2e

SLOW = {"kind": SIMULATED, "options": {"max_batch": 1, "step_seconds": 0.04,
                                           "decode_steps": 10, "decode_jitter": 0}}


def slow_daemon(tmp_path: Path, **top) -> Daemon:  # noqa: ANN003
    d = Daemon(tmp_path / "d", engine=SLOW, render={"dpi": 36},
               schedule={"max_active_documents": 1, "pages_in_flight": 1}, **top)
    d.config["inboxes"][0]["quiet_seconds"] = 0.2
    return d


def reload_and_finish(d: Daemon, n: int, event: str) -> None:
    """SIGHUP with d.config; then every one of doc0..doc{n-1} converts."""
    d.write_config()
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: d.event(event), 30, event)
    wait_for(lambda: all((d.outbox / f"doc{i}.md").exists() for i in range(n)), 90,
             f"all {n} claimed files converted after the reload")
    # the .md appears before the original leaves the work area (outputs first): wait
    # for that, as long as a stranded file would need to show itself
    wait_for(lambda: claimed_files(d.inbox) == [], 30, "the work area empty")


def test_a_reload_that_changes_an_inbox_keeps_its_queued_files(tmp_path: Path) -> None:
    with slow_daemon(tmp_path) as d:
        d.start()
        for i in range(6):
            make_pdf(d.inbox / f"doc{i}.pdf", [sentence_lines(i, 2)] * 2)
        wait_for(lambda: len(d.events("file_claimed")) == 6, 60, "six claimed")
        d.config["inboxes"][0]["quiet_seconds"] = 0.7  # a changed inbox
        reload_and_finish(d, 6, "reloaded")


def test_fifty_reloads_in_five_seconds_strand_nothing(tmp_path: Path) -> None:
    with slow_daemon(tmp_path) as d:
        d.start()
        for i in range(60):
            make_pdf(d.inbox / f"doc{i}.pdf", [sentence_lines(i, 1)])
        wait_for(lambda: len(d.events("file_claimed")) >= 20, 60, "claims under way")
        base = dict(d.config["inboxes"][0])
        for n in range(50):
            box = dict(base, quiet_seconds=0.2 + 0.1 * (n % 2))  # half of them a change
            d.config_path.write_text(yaml.safe_dump({**d.config, "inboxes": [box]}))
            d.proc.send_signal(signal.SIGHUP)
            time.sleep(0.1)
        wait_for(lambda: all((d.outbox / f"doc{i}.md").exists() for i in range(60)), 180,
                 "all sixty converted")
        assert d.proc.poll() is None
        # the .md appears before the original leaves the work area (outputs first):
        # wait for that, as long as a stranded file would need to show itself
        wait_for(lambda: claimed_files(d.inbox) == [], 30, "the work area empty")


def test_a_removed_inbox_finishes_what_it_claimed(tmp_path: Path) -> None:
    with slow_daemon(tmp_path) as d:
        d.start()
        for i in range(4):
            make_pdf(d.inbox / f"doc{i}.pdf", [sentence_lines(i, 2)] * 2)
        wait_for(lambda: len(d.events("file_claimed")) == 4, 60, "four claimed")
        other = tmp_path / "other"
        other.mkdir()
        d.config["inboxes"] = [{"path": str(other), "outbox": str(tmp_path / "o2"),
                                "failed": str(tmp_path / "f2"), "on_success": "delete"}]
        reload_and_finish(d, 4, "inbox_removed")


def test_drain_timeout_zero_stops_now_and_leaves_pages_claimed(tmp_path: Path) -> None:
    """drain_timeout_seconds: 0 means stop now (it meant 'wait forever'): SIGTERM during
    a 60-page document returns within seconds; the document stays claimed and the next
    start converts it."""
    with slow_daemon(tmp_path, drain_timeout_seconds=0) as d:
        d.start()
        make_pdf(d.inbox / "long.pdf", [sentence_lines(i, 1) for i in range(60)])
        wait_for(lambda: d.events("page_done"), 60, "the document under way")
        t0 = time.monotonic()
        assert d.stop(timeout=30) == 0
        stopped_in = time.monotonic() - t0
        assert not (d.outbox / "long.md").exists()
        assert len(claimed_files(d.inbox)) == 1
        assert stopped_in < 20, stopped_in  # 60 pages take ~30 s at one at a time
        d.start()
        wait_for(lambda: (d.outbox / "long.md").exists(), 120, "long.md after restart")


def test_a_file_moved_into_a_local_inbox_skips_the_quiet_period(tmp_path: Path) -> None:
    """The atomic "write elsewhere, then mv": complete when it appears (IN_MOVED_TO),
    claimed at once although quiet_seconds is 60; the completeness check still runs."""
    with Daemon(tmp_path / "d", engine={"kind": SIMULATED, "options": {"instant": True}},
                render={"dpi": 36}, rescan_seconds=600) as d:
        d.config["inboxes"][0].update(quiet_seconds=60, watch="inotify")
        d.start()
        staged = tmp_path / "staged.pdf"
        make_pdf(staged, [sentence_lines(1, 2)])
        os.rename(staged, d.inbox / "moved.pdf")
        cut = tmp_path / "cut.pdf"  # moved in, but incomplete: not claimed
        cut.write_bytes(make_pdf(tmp_path / "x.pdf", [sentence_lines(2, 2)]).read_bytes()[:300])
        os.rename(cut, d.inbox / "cut.pdf")
        wait_for(lambda: (d.outbox / "moved.md").exists(), 30, "moved.md well before 60 s")
        assert [e["file"] for e in d.events("file_claimed")] == ["moved.pdf"]
        assert d.event("file_incomplete")["file"] == "cut.pdf"
