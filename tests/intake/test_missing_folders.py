"""A folder ocrd would write to (outbox, failed, archive) that is not there — a share
not mounted yet, a misspelt path — is never created silently: its inbox waits, PAUSED,
with the reason in `ocrd status`, the console and a warning line, and goes on once the
folder is there; only `create_folders: true` lets ocrd create it. A folder on a
`required_mounts` mount point is used only while something is mounted there (the
empty mount point itself is not the share). `ocrd check-config` names every such
folder. Real daemons, real folders, a real tmpfs for the mount."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest
from daemon_process import ocrd_command, ocrd_env
from helpers import Daemon, drop, files_under, free_port, make_pdf, sentence_lines, wait_for

from ocrd import cli

pytestmark = pytest.mark.e2e


def inbox(root: Path, **extra: object) -> dict:
    (root / "inbox").mkdir(parents=True, exist_ok=True)
    return {"path": str(root / "inbox"), "outbox": str(root / "outbox"),
            "failed": str(root / "failed"), "archive": str(root / "archive"),
            "quiet_seconds": 0.3, **extra}


def status(d: Daemon) -> str:
    res = subprocess.run([*ocrd_command(), "status", "-c", str(d.config_path)],
                         capture_output=True, text=True, timeout=60, env=ocrd_env())
    assert res.returncode == 0, res.stderr
    return res.stdout


def overview(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
        return r.read().decode()


def test_a_missing_outbox_pauses_its_inbox_until_it_is_there(tmp_path: Path) -> None:
    root = tmp_path / "d"
    port = free_port()
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(1, 3)])
    (root / "archive").mkdir(parents=True)  # failed and outbox: not there
    with Daemon(root, inboxes=[inbox(root, create_folders=False)],
                web={"listen": f"127.0.0.1:{port}"}) as d:
        d.start()
        missing = wait_for(lambda: [e for e in d.events("folder_missing")
                                    if e["folder"] == "outbox"], 30, "folder_missing")
        assert missing[0]["level"] == "warning" and missing[0]["path"] == str(d.outbox)
        assert {e["folder"] for e in d.events("folder_missing")} == {"outbox", "failed"}
        drop(src, d.inbox / "a.pdf")
        wait_for(lambda: d.metric("ocrd_candidates") == 1, 30, "a.pdf seen")
        said = wait_for(lambda: "PAUSED" in (s := status(d)) and s, 30, "PAUSED in status")
        assert f"its outbox {str(d.outbox)!r} is not there" in said, said
        assert f"its failed folder {str(d.failed)!r} is not there" in said, said
        assert "create_folders: true" in said, said
        assert "a.pdf  the inbox is paused" in said, said
        page = overview(port)
        assert "is paused: its outbox" in page and "inbox-paused" in page
        # nothing created, nothing claimed, nothing written
        assert not d.outbox.exists() and not d.failed.exists()
        assert d.events("file_claimed") == []
        # the folders appear (the share is mounted): the inbox goes on by itself
        d.outbox.mkdir()
        d.failed.mkdir()
        wait_for((d.outbox / "a.md").exists, 60, "a.md once the outbox is there")
        assert d.events("folder_back")
        assert "PAUSED" not in status(d)
    assert files_under(d.archive) == ["a.pdf"]


def test_create_folders_true_lets_ocrd_create_them(tmp_path: Path) -> None:
    root = tmp_path / "d"
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(2, 3)])
    with Daemon(root, inboxes=[inbox(root, create_folders=True)]) as d:
        d.start()
        drop(src, d.inbox / "a.pdf")
        wait_for((d.outbox / "a.md").exists, 60, "a.md in the outbox ocrd made")
        assert d.events("folder_missing") == []
    assert files_under(d.archive) == ["a.pdf"]


def test_an_outbox_on_a_required_mount_waits_for_the_mount(tmp_path: Path) -> None:
    """The outbox is the share's mount point itself: an empty folder on the local disk
    while the share is not mounted, which only required_mounts tells from the share."""
    if os.geteuid() != 0:
        if os.environ.get("OCRD_REQUIRE_SYSTEMD") == "1":
            pytest.fail("mounting a tmpfs needs root (CI runs as root)")
        pytest.skip("needs root to mount a tmpfs")
    root = tmp_path / "d"
    share = tmp_path / "nas"
    share.mkdir()  # the empty mount point
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(3, 3)])
    box = inbox(root, outbox=str(share))
    (root / "failed").mkdir(parents=True)
    (root / "archive").mkdir()
    with Daemon(root, inboxes=[box], required_mounts=[str(share)]) as d:
        d.start()
        wait_for(lambda: d.event("folder_unmounted"), 30, "folder_unmounted")
        drop(src, d.inbox / "a.pdf")
        wait_for(lambda: d.metric("ocrd_candidates") == 1, 30, "a.pdf seen")
        said = wait_for(lambda: "PAUSED" in (s := status(d)) and s, 30, "PAUSED")
        assert f"{str(share)!r}, where no filesystem is mounted" in said, said
        assert d.events("file_claimed") == [] and list(share.iterdir()) == []
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(share)],
                       check=True)
        try:
            wait_for((share / "a.md").exists, 60, "a.md on the mounted share")
        finally:
            d.stop()
            subprocess.run(["umount", "-l", str(share)], check=False)
    assert list(share.iterdir()) == []  # nothing on the disk under the mount point


def test_check_config_names_every_folder_ocrd_would_not_create(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path
    (root / "inbox").mkdir()
    (root / "outbox").mkdir()
    (root / "nas").mkdir()  # a mount point with nothing mounted
    config = {"state_dir": str(root / "state"), "engine": {"kind": "tesseract"},
              "metrics": {"listen": None}, "web": {"listen": None},
              "required_mounts": [str(root / "nas")],
              "inboxes": [{"path": str(root / "inbox"), "outbox": str(root / "outbox"),
                           "failed": str(root / "faild"), "archive": str(root / "nas" / "a")}]}
    path = root / "c.yaml"
    path.write_text(json.dumps(config))
    assert cli.main(["check-config", "-c", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith(f"ocrd: inboxes[0].failed = {str(root / 'faild')!r}: folder "
                               "does not exist, and ocrd does not create it") and
               "inboxes[0].create_folders: true" in line for line in err), err
    assert any(f"inboxes[0].archive = {str(root / 'nas' / 'a')!r}: folder does not exist"
               in line for line in err), err
    assert any(f"required_mounts[0] = {str(root / 'nas')!r}: no filesystem is mounted there"
               in line for line in err), err
    assert not any("outbox" in line for line in err), err  # it is there
    config["inboxes"][0]["create_folders"] = True
    config["required_mounts"] = []
    path.write_text(json.dumps(config))
    assert cli.main(["check-config", "-c", str(path)]) == 0, capsys.readouterr().err
    assert not (root / "faild").exists()  # checking creates nothing
