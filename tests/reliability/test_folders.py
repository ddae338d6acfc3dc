"""A configured folder — the inbox itself, an outbox — replaced while ocrd runs, by a
symbolic link to a private folder or by another folder: whoever can write the folder
that holds it (the top of a share) can do that. Every configured folder is pinned when
the configuration is loaded; a replaced one is never used: nothing is read, moved or
written through it, its inbox pauses with one clear line (log, `ocrd status`, the
console), and goes on when the folder is back as it was, or after a reload."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from helpers import Daemon, drop, files_under, free_port, make_pdf, sentence_lines, wait_for
from test_inbox_attacks import secret_folder

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]



def untouched(private: Path, before: dict[str, bytes]) -> bool:
    """Nothing taken from the private folder, nothing put into it."""
    return {p.name: p.read_bytes() if p.is_file() else None
            for p in private.iterdir()} == before


def status(d: Daemon) -> str:
    res = subprocess.run([sys.executable, "-m", "ocrd", "status", "-c", str(d.config_path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def console_inboxes(port: int) -> list[dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10) as r:
        return json.loads(r.read())["daemon"]["inboxes"]


def test_an_inbox_replaced_by_a_link_is_never_read(tmp_path: Path) -> None:
    private, before = secret_folder(tmp_path)
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(1, 3)])
    port = free_port()
    with Daemon(tmp_path / "d", rescan_seconds=0.5, web={"listen": f"127.0.0.1:{port}"}) as d:
        d.config["inboxes"][0].update(quiet_seconds=0.3)
        d.start()
        away = tmp_path / "d" / "inbox-away"
        os.rename(d.inbox, away)
        d.inbox.symlink_to(private)  # the inbox is now a link to the private folder
        wait_for(lambda: d.event("folder_replaced") or not untouched(private, before)
                 or files_under(d.outbox), 30, "the link noticed (or followed)")
        assert untouched(private, before)
        assert files_under(d.outbox) == [] and files_under(d.archive) == []
        ev = d.event("folder_replaced")
        assert ev["folder"] == "path" and "symbolic link" in ev["why"], ev
        # one clear line, wherever an operator looks
        assert "PAUSED" in status(d) and "symbolic link" in status(d)
        [box] = console_inboxes(port)
        assert box["paused"] and "symbolic link" in box["why"], box
        # the folder back as it was: the inbox goes on
        d.inbox.unlink()
        os.rename(away, d.inbox)
        wait_for(lambda: d.event("folder_back"), 30, "the inbox back")
        drop(src, d.inbox / "a.pdf")
        wait_for((d.outbox / "a.md").exists, 60, "a.md after the inbox came back")
        assert "PAUSED" not in status(d)
        # checked every second all along, and said once
        assert len(d.events("folder_replaced")) == 1
    assert untouched(private, before)
    assert files_under(d.outbox) == ["a.json", "a.md"]


def test_an_inbox_replaced_by_another_folder_waits_for_a_reload(tmp_path: Path) -> None:
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(2, 3)])
    with Daemon(tmp_path / "d", rescan_seconds=0.5) as d:
        d.config["inboxes"][0].update(quiet_seconds=0.3)
        d.start()
        os.rename(d.inbox, tmp_path / "d" / "inbox-away")
        d.inbox.mkdir()  # someone else's folder, in the inbox's place
        make_pdf(d.inbox / "planted.pdf", [sentence_lines(3, 3)])
        wait_for(lambda: d.event("folder_replaced") or files_under(d.outbox), 30,
                 "the other folder noticed (or used)")
        assert files_under(d.outbox) == []
        ev = d.event("folder_replaced")
        assert ev and "another folder" in ev["why"], ev
        assert (d.inbox / "planted.pdf").exists()
        # the admin looks, and accepts the folder that is there now
        os.kill(d.pid, signal.SIGHUP)
        wait_for(lambda: d.event("reloaded"), 30, "the reload")
        wait_for((d.outbox / "planted.md").exists, 60, "planted.md after the reload")
        drop(src, d.inbox / "a.pdf")
        wait_for((d.outbox / "a.md").exists, 60, "a.md")


def test_a_reload_never_accepts_a_link(tmp_path: Path) -> None:
    """A reload pins what is there anew — but a link in a folder's place is never taken
    (links in a configured path are resolved once, when it enters the configuration)."""
    private, before = secret_folder(tmp_path)
    root = tmp_path / "d"
    boxes = [{"path": str(root / name), "outbox": str(root / f"{name}-out"),
              "failed": str(root / f"{name}-failed"), "on_success": "delete",
              "quiet_seconds": 0.3} for name in ("inbox", "other")]
    (root / "other").mkdir(parents=True)
    with Daemon(root, inboxes=boxes, rescan_seconds=0.5) as d:
        d.start()
        os.rename(d.inbox, root / "inbox-away")
        d.inbox.symlink_to(private)
        wait_for(lambda: d.event("folder_replaced") or not untouched(private, before),
                 30, "the link noticed (or followed)")
        os.kill(d.pid, signal.SIGHUP)
        wait_for(lambda: d.event("reloaded"), 30, "the reload")
        pinned = [e for e in d.events("folder_pinned") if e["path"] == str(d.inbox)]
        assert pinned and pinned[-1]["there"] is False, pinned  # the link was not taken
        scans = d.metric("ocrd_rescans_total") or 0
        # the other inbox scanned a few times since: the linked one had its chances
        wait_for(lambda: (d.metric("ocrd_rescans_total") or 0) >= scans + 4, 30,
                 "scans after the reload")
        assert untouched(private, before)
        assert files_under(root / "inbox-out") == [] and "PAUSED" in status(d)


def test_an_outbox_replaced_by_a_link_is_never_written(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(4, 3)])
    with Daemon(tmp_path / "d") as d:
        d.config["inboxes"][0].update(quiet_seconds=0.3)
        d.outbox.mkdir()
        d.start()
        os.rename(d.outbox, tmp_path / "d" / "outbox-away")
        d.outbox.symlink_to(elsewhere)
        wait_for(lambda: d.event("folder_replaced") or files_under(elsewhere), 30,
                 "the link noticed")
        drop(src, d.inbox / "a.pdf")
        # not claimed while paused; nothing written through the link
        wait_for(lambda: d.metric("ocrd_candidates") == 1 or files_under(elsewhere), 30,
                 "a.pdf seen")
        assert files_under(elsewhere) == [] and d.events("file_claimed") == []
        d.outbox.unlink()
        os.rename(tmp_path / "d" / "outbox-away", d.outbox)
        wait_for((d.outbox / "a.md").exists, 60, "a.md in the real outbox")
    assert files_under(elsewhere) == []
    assert files_under(d.failed) == []
