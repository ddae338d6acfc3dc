"""`ocrd retry` and the console's Retry: the failed original goes back into its inbox
under its original relative path (a free name if that is taken, never replacing a file),
its .error.json goes, its journal row becomes `retried`; only paths inside the inbox's
failed folder are touched. Works without a running daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from console_site import build

from ocrd.work.journal import FileFilter, Journal
from ocrd.work.retry import RetryError, retry_job, select


@pytest.fixture
def site(tmp_path: Path):
    return build(tmp_path, start=False)


def test_retry_puts_the_original_back_under_its_path(site) -> None:
    box = site.cfg.inboxes[0]
    journal = Journal(site.cfg.state_dir / "journal.sqlite3")
    job = journal.get(site.ids["failed"])
    dest = retry_job(site.cfg, journal, job)
    assert dest == box.path / "sub" / "broken.pdf" and dest.read_bytes() == b"junk"
    assert not (box.failed / "sub" / "broken.pdf").exists()
    assert not (box.failed / "sub" / "broken.pdf.error.json").exists()
    row = journal.get(job.id)
    assert row.state == "retried" and row.output == str(dest) and row.reason == job.reason
    with pytest.raises(RetryError, match="has not failed"):
        retry_job(site.cfg, journal, row)


def test_a_taken_name_is_never_replaced(site) -> None:
    box = site.cfg.inboxes[0]
    (box.path / "sub").mkdir()
    (box.path / "sub" / "broken.pdf").write_bytes(b"someone else's new file")
    journal = Journal(site.cfg.state_dir / "journal.sqlite3")
    dest = retry_job(site.cfg, journal, journal.get(site.ids["failed"]))
    assert dest.name == "broken-2.pdf" and dest.read_bytes() == b"junk"
    assert (box.path / "sub" / "broken.pdf").read_bytes() == b"someone else's new file"


def test_paths_outside_the_failed_folder_are_refused(site, tmp_path: Path) -> None:
    journal = Journal(site.cfg.state_dir / "journal.sqlite3")
    job = journal.get(site.ids["failed"])
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    for where in (str(outside), str(site.cfg.inboxes[1].failed / "x.pdf"),
                  str(site.cfg.inboxes[0].failed / ".." / ".." / "precious.txt")):
        job.output = where
        with pytest.raises(RetryError, match="not inside the failed folder"):
            retry_job(site.cfg, journal, job)
    assert outside.read_text() == "keep me"
    # a symlink in the failed folder is not followed
    link = site.cfg.inboxes[0].failed / "link.pdf"
    os.symlink(outside, link)
    job.output = str(link)
    with pytest.raises(RetryError, match="not a regular file"):
        retry_job(site.cfg, journal, job)
    assert outside.read_text() == "keep me" and link.is_symlink()


def test_gone_original_and_unknown_inbox_say_why(site) -> None:
    journal = Journal(site.cfg.state_dir / "journal.sqlite3")
    with pytest.raises(RetryError, match="no longer in the configuration"):
        retry_job(site.cfg, journal, journal.get(site.ids["unknown_inbox"]))
    job = journal.get(site.ids["failed"])
    (site.cfg.inboxes[0].failed / "sub" / "broken.pdf").unlink()
    with pytest.raises(RetryError, match="no longer in the failed folder"):
        retry_job(site.cfg, journal, job)
    assert journal.get(job.id).state == "failed"


def test_select_by_path_reason_and_all(site) -> None:
    journal = Journal(site.cfg.state_dir / "journal.sqlite3")
    failed = site.cfg.inboxes[0].failed / "sub" / "broken.pdf"
    ids = {site.ids["failed"]}
    assert {j.id for j in select(journal, paths=["sub/broken.pdf"])} == ids
    assert {j.id for j in select(journal, paths=[str(failed)])} == ids
    assert {j.id for j in select(journal, reason="unsupported_format")} == ids
    assert {j.id for j in select(journal, everything=True)} == ids | {site.ids["unknown_inbox"]}
    assert journal.count(FileFilter(state="failed")) == 2


def _config(site, tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "state_dir": str(site.cfg.state_dir),
        "inboxes": [{k: str(v) for k, v in b.model_dump().items()
                     if k in ("path", "outbox", "failed", "archive")} | {"recursive": True}
                    for b in site.cfg.inboxes]}))
    return path


@pytest.mark.e2e
def test_cli_retry_without_a_daemon(site, tmp_path: Path) -> None:
    config = _config(site, tmp_path)
    run = [sys.executable, "-m", "ocrd", "retry", "-c", str(config)]
    proc = subprocess.run([*run, "--reason", "unsupported_format"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "sub/broken.pdf [unsupported_format] →" in proc.stdout
    assert (site.cfg.inboxes[0].path / "sub" / "broken.pdf").read_bytes() == b"junk"
    # nothing left to retry by that name; --all meets the row of a removed inbox
    proc = subprocess.run([*run, "sub/broken.pdf"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no failed file matches" in proc.stderr
    proc = subprocess.run([*run, "--all"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no longer in the configuration" in proc.stderr
    proc = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2  # FILE, --all or --reason is required


@pytest.mark.e2e
def test_cli_retry_with_nothing_to_retry_exits_1_however_it_was_asked(site,
                                                                       tmp_path: Path) -> None:
    """A FILE, --reason and --all that match no failed file (and a config whose daemon
    never ran) all end the same way: exit 1, "nothing to retry", and why."""
    config = _config(site, tmp_path)
    run = [sys.executable, "-m", "ocrd", "retry", "-c", str(config)]
    first = subprocess.run([*run, "--reason", "unsupported_format"], capture_output=True,
                           text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    for asked, why in ((["sub/broken.pdf"], "no failed file matches"),
                       (["--reason", "unsupported_format"],
                        "no failed file has the reason 'unsupported_format'"),
                       (["--reason", "encrypted"], "no failed file has the reason")):
        proc = subprocess.run([*run, *asked], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1, (asked, proc.stderr)
        assert f"ocrd: nothing to retry: {why}" in proc.stderr, (asked, proc.stderr)
    never = tmp_path / "never.yaml"
    never.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "no-state"), "inboxes": []}))
    proc = subprocess.run([sys.executable, "-m", "ocrd", "retry", "-c", str(never), "--all"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "nothing to retry: no journal" in proc.stderr, proc.stderr
    helped = subprocess.run([sys.executable, "-m", "ocrd", "retry", "--help"],
                            capture_output=True, text=True, timeout=60).stdout
    assert "1 nothing to retry" in " ".join(helped.split())
