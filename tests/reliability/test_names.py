"""File names are bytes. A name that is not valid UTF-8 (Latin-1 from old SMB clients and
scanners, random bytes) must neither crash the daemon — at the first scan, on an inotify
event, at every restart — nor stop the files beside it; it converts like any other, its
outputs keep its bytes, and the sidecar, the error file, the journal, the logs and
`ocrd status` all carry it without error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import Daemon, make_pdf, sentence_lines, wait_for

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]

LATIN1 = b"r\xe9sum\xe9 bad\xff.pdf"  # not UTF-8
BROKEN_TAIL = b"cut \xe2\x82.pdf"  # a UTF-8 sequence cut short


def bpath(folder: Path, name: bytes) -> Path:
    return Path(os.fsdecode(os.fsencode(folder) + b"/" + name))


def bnames(folder: Path) -> set[bytes]:
    return set(os.listdir(os.fsencode(folder))) if folder.exists() else set()


@pytest.mark.parametrize("watch", ["inotify", "polling"])
def test_names_that_are_not_utf8_convert_and_survive_restarts(tmp_path: Path,
                                                              watch: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    good = make_pdf(src / "good.pdf", [sentence_lines(3, 3)]).read_bytes()
    with Daemon(tmp_path / "d") as d:
        box = d.config["inboxes"][0]
        box.update(watch=watch, on_success="keep")
        box.pop("archive")
        # Before the first start: the startup scan meets them.
        bpath(d.inbox, LATIN1).write_bytes(good)
        bpath(d.inbox, b"junk \xff\xfe.pdf").write_bytes(b"not a document\n" * 20)
        d.start()
        # While running: an event (inotify) or a poll meets these.
        bpath(d.inbox, BROKEN_TAIL).write_bytes(good)
        (d.inbox / "plain.pdf").write_bytes(good)
        wait_for(lambda: {b"r\xe9sum\xe9 bad\xff.md", b"cut \xe2\x82.md", b"plain.md"}
                 <= bnames(d.outbox) and
                 b"junk \xff\xfe.pdf.error.json" in bnames(d.failed) and
                 # kept in the inbox (on_success: keep) once the outputs are durable
                 {LATIN1, BROKEN_TAIL, b"plain.pdf"} <= bnames(d.inbox) and
                 len(d.events("file_converted")) == 3, 90, "all four handled")
        assert d.proc.poll() is None

        side = json.loads(bpath(d.outbox, b"r\xe9sum\xe9 bad\xff.json").read_bytes())
        # The sidecar is valid UTF-8 JSON, and its path reads back as the same name.
        assert os.fsencode(side["source"]["path"]) == LATIN1, side["source"]
        err = json.loads(bpath(d.failed, b"junk \xff\xfe.pdf.error.json").read_bytes())
        assert err["reason"] == "unsupported_format"
        assert os.fsencode(err["source"]["path"]) == b"junk \xff\xfe.pdf"
        # The logs name it, readably.
        claimed = [e["file"] for e in d.events("file_claimed")]
        assert "r\\xe9sum\\xe9 bad\\xff.pdf" in claimed, claimed
        d.stop()

        # A restart scans the same names again (and asks the journal whether each was
        # converted already): no crash, nothing converted twice.
        d.start()
        (d.inbox / "after.pdf").write_bytes(good)
        wait_for(lambda: b"after.md" in bnames(d.outbox), 60, "after.md")
        # its log line comes just after its outputs are durable
        d.wait_event("file_converted", 30)
        assert d.proc.poll() is None
        # Nothing converted twice: the journal knew the kept names.
        assert len(d.events("file_converted")) == 1, d.events("file_converted")
        status = subprocess.run([sys.executable, "-m", "ocrd", "status", "-c",
                                 str(d.config_path)], capture_output=True, text=True,
                                timeout=60)
        assert status.returncode == 0, status.stderr
        assert "junk \\xff\\xfe.pdf" in status.stdout, status.stdout
