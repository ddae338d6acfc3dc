"""A full or read-only outbox: the daemon pauses with a clear error, loses nothing, and
resumes when space or write permission returns. Real filesystems: a tiny tmpfs
(the tiny_fs fixture, tests/reliability/conftest.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import (
    Daemon,
    claimed_files,
    drop,
    files_under,
    make_pdf,
    sentence_lines,
    wait_for,
)

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]


def daemon_with_outbox(tmp_path: Path, outbox: Path) -> Daemon:
    """A daemon whose inbox is on the normal disk and whose outbox is `outbox`."""
    inbox = {"path": str(tmp_path / "d" / "inbox"), "outbox": str(outbox),
             "failed": str(tmp_path / "d" / "failed"), "on_success": "delete",
             "quiet_seconds": 0.3}
    return Daemon(tmp_path / "d", inboxes=[inbox])


def test_full_outbox_pauses_then_resumes(tmp_path: Path, tiny_fs: Path) -> None:
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(60, 4)])
    filler = tiny_fs / "filler.bin"
    with open(filler, "wb", buffering=0) as f:  # fill the outbox's filesystem up
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        except OSError:
            pass
    with daemon_with_outbox(tmp_path, tiny_fs / "out") as d:
        d.start()
        drop(src, d.inbox / "a.pdf")
        wait_for(lambda: d.event("output_unwritable"), 60, "the full outbox to be reported")
        ev = d.event("output_unwritable")
        assert "No space" in ev["error"] and ev["file"] == "a.pdf"
        assert not (tiny_fs / "out" / "a.md").exists()
        assert files_under(d.failed) == []  # not the file's fault
        assert len(claimed_files(d.inbox)) == 1  # still claimed, safe
        filler.unlink()  # space returns
        wait_for(lambda: (tiny_fs / "out" / "a.md").exists(), 90, "a.md after space returned")
    assert files_under(tiny_fs / "out") == ["a.json", "a.md"]
    assert json.loads((tiny_fs / "out" / "a.json").read_text())["page_count"] == 1
    assert claimed_files(d.inbox) == [] and [p.name for p in d.inbox.iterdir()] == [".ocrd-work"]


def test_read_only_outbox_pauses_then_resumes(tmp_path: Path, tiny_fs: Path) -> None:
    src = make_pdf(tmp_path / "b.pdf", [sentence_lines(61, 4)])
    (tiny_fs / "out").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    with daemon_with_outbox(tmp_path, tiny_fs / "out") as d:
        d.start()
        drop(src, d.inbox / "b.pdf")
        wait_for(lambda: d.event("output_unwritable"), 60, "the read-only outbox reported")
        assert "Read-only" in d.event("output_unwritable")["error"]
        subprocess.run(["mount", "-o", "remount,rw", str(tiny_fs)], check=True)
        wait_for(lambda: (tiny_fs / "out" / "b.md").exists(), 90, "b.md after remount rw")
    assert files_under(tiny_fs / "out") == ["b.json", "b.md"]
