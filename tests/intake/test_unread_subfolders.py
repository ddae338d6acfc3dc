"""Files in the subfolders of an inbox that does not read them (recursive: false) are
not ignored without a word: `ocrd status` and the console say how many wait there, one
by name, and why they are not read; a log line says so once."""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

import pytest
from daemon_process import ocrd_command, ocrd_env
from helpers import Daemon, free_port, wait_for

from ocrd.config.settings import InboxConfig
from ocrd.intake import watch
from ocrd.intake.watch import Ignore, UnreadFiles, scan
from ocrd.safefs import Dir


def status(d: Daemon) -> str:
    res = subprocess.run([*ocrd_command(), "status", "-c", str(d.config_path)],
                         capture_output=True, text=True, timeout=60, env=ocrd_env())
    assert res.returncode == 0, res.stderr
    return res.stdout


def plant(inbox: Path) -> None:
    (inbox / "sub" / "deeper").mkdir(parents=True)
    (inbox / "sub" / "a.pdf").write_bytes(b"%PDF-1.4 a")
    (inbox / "sub" / "deeper" / "b.pdf").write_bytes(b"%PDF-1.4 b")
    (inbox / "sub" / ".hidden.pdf").write_bytes(b"%PDF-1.4 h")  # ignored: not counted
    (inbox / "sub" / "Thumbs.db").write_bytes(b"x")


@pytest.mark.e2e
def test_status_and_console_say_how_many_files_wait_in_subfolders_and_why(
        tmp_path: Path) -> None:
    port = free_port()
    with Daemon(tmp_path / "d", web={"listen": f"127.0.0.1:{port}"}) as d:
        plant(d.inbox)
        d.start()
        event = wait_for(lambda: d.event("files_in_subfolders"), 30, "files_in_subfolders")
        assert event["files"] == 2 and event["first"] in ("sub/a.pdf", "sub/deeper/b.pdf")
        said = status(d)
        assert "waiting " not in said  # nothing waits in the inbox itself, but:
        line = next(x for x in said.splitlines() if "PROBLEM" in x)
        assert f"Inbox {d.inbox}: 2 files wait in its subfolders (such as sub/" in line
        assert "are not read: the inbox is not recursive" in line, line
        assert "recursive: true" in line, line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            page = r.read().decode()
        assert 'id="inbox-subfolders"' in page and "2 files wait in its subfolders" in page
        assert "+ 2 in subfolders, not read" in page
        # the console off: `ocrd status` says it from the daemon's metrics
        d.stop()
        d.config["web"] = {"listen": None}
        d.start()
        wait_for(lambda: d.metric("ocrd_rescans_total"), 30, "a scan")
        said = wait_for(lambda: "subfolders" in (s := status(d)) and s, 30, "the count")
        assert f"inbox {d.inbox}: 2 file(s) in its subfolders are not read (the inbox is " \
               "not recursive)" in said, said
        # moved up into the inbox: converted, and the note is gone
        (d.inbox / "sub" / "a.pdf").unlink()
        (d.inbox / "sub" / "deeper" / "b.pdf").unlink()
        wait_for(lambda: d.event("files_in_subfolders_gone"), 30, "files_in_subfolders_gone")
        assert "subfolders" not in status(d)


def test_the_count_is_bounded_and_says_so(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(watch, "SUBFOLDER_LOOK", 5)
    (tmp_path / "sub").mkdir()
    for i in range(10):
        (tmp_path / "sub" / f"{i}.pdf").write_bytes(b"x")
    (tmp_path / "top.pdf").write_bytes(b"x")
    box = InboxConfig(path=tmp_path, outbox=tmp_path / "o", failed=tmp_path / "f")
    unread = UnreadFiles()
    got = list(scan(tmp_path, False, Ignore(box), open_top=lambda: Dir.open_root(tmp_path),
                    unread=unread))
    assert [e.relpath for e in got] == ["top.pdf"]
    assert unread.files == 5 and not unread.complete
    unread = UnreadFiles()
    list(scan(tmp_path, True, Ignore(box), unread=unread))  # recursive: nothing unread
    assert unread.files == 0 and unread.complete
