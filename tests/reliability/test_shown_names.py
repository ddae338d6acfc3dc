"""A file name is whatever its author typed, terminal escapes included: ESC sequences
that retitle or clear the operator's terminal, BEL, newlines that forge a line of
output, bidirectional overrides that turn `exe.pdf` round. Wherever a person sees a name
— `ocrd status`, `ocrd retry`, `ocrd check-config`, the console's pages and its API —
control characters show escaped (`\\x1b`, `\\n`), as undecodable bytes do (`\\xff`)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers import Daemon, free_port, wait_for

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]

# retitles an xterm, rings the bell, starts a forged status line, reverses the rest
HOSTILE = "\x1b]0;owned\x07\x1b[2Jscan\nfiles: done 999\u202efdp.exe"
ESCAPED = "\\x1b]0;owned\\x07\\x1b[2Jscan\\nfiles: done 999\\u202efdp.exe"
RAW = ("\x1b", "\x07", "\u202e")


def clean(text: str) -> None:
    """No raw control character in what a person would see."""
    for ch in RAW:
        assert ch not in text, f"raw {ch!r} in {text!r}"


def ocrd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ocrd", *args], capture_output=True,
                          text=True, timeout=60)


def test_names_with_control_characters_are_shown_escaped(tmp_path: Path) -> None:
    port = free_port()
    with Daemon(tmp_path / "d", web={"listen": f"127.0.0.1:{port}"}) as d:
        d.start()
        # not a document: it fails quickly, and lands in `ocrd status`
        (d.inbox / HOSTILE).write_bytes(b"just some text, no document\n" * 10)
        wait_for(lambda: d.event("file_failed"), 60, "the file failed")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/files", timeout=10) as r:
            api = json.loads(r.read())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/failed", timeout=10) as r:
            page = r.read().decode()
        status = ocrd("status", "-c", str(d.config_path))
    assert status.returncode == 0, status.stderr
    clean(status.stdout)
    assert ESCAPED in status.stdout, status.stdout
    # one line per failure: the newline in the name forged no line of its own
    assert not any(line.startswith("files: done 999") for line in status.stdout.splitlines())
    [row] = api["files"]
    assert row["file"] == ESCAPED and row["name"] == ESCAPED, row
    clean(json.dumps(row, ensure_ascii=False))
    clean(page)
    assert "scan\\nfiles: done 999" in page

    retry = ocrd("retry", "-c", str(d.config_path), "--all")
    assert retry.returncode == 0, retry.stderr
    clean(retry.stdout + retry.stderr)
    assert ESCAPED in retry.stdout, retry.stdout
    assert (d.inbox / HOSTILE).exists()  # the file itself is back under its own name


def test_check_config_shows_names_with_control_characters_escaped(tmp_path: Path) -> None:
    """The config file's own name (in the OK line) and a folder's (in a problem)."""
    folder = tmp_path / "in\x1b[2J\nbox\x07"
    for there in ("out", "failed"):  # the destinations are there: only the inbox is not
        (tmp_path / there).mkdir()
    config = {"state_dir": str(tmp_path / "state"), "metrics": {"listen": None},
              "web": {"listen": None},
              "inboxes": [{"path": str(folder), "outbox": str(tmp_path / "out"),
                           "failed": str(tmp_path / "failed"), "on_success": "delete"}]}
    path = tmp_path / "site\x1b]0;owned\x07.yaml"
    path.write_text(yaml.safe_dump(config))
    res = ocrd("check-config", "-c", str(path))
    assert res.returncode == 2, res
    clean(res.stdout + res.stderr)
    lines = [line for line in res.stderr.splitlines() if "does not exist" in line]
    assert len(lines) == 1 and "in\\x1b[2J\\nbox\\x07" in lines[0], res.stderr
    folder.mkdir()
    res = ocrd("check-config", "-c", str(path))
    assert res.returncode == 0, res
    clean(res.stdout + res.stderr)
    assert "site\\x1b]0;owned\\x07.yaml" in res.stdout and ": OK (1 inbox(es)" in res.stdout
