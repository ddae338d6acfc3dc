"""The `ocrd` command as a newcomer meets it: bare `ocrd` shows the help, every command's
help says what it does, a typo in a retry reason is an error that lists the reasons, and a
reader that stops early (`ocrd status | head -3`) gets no traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from console_site import build
from daemon_process import ocrd_command, ocrd_env

from ocrd import errors
from ocrd.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def ocrd(*args: str, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run([*ocrd_command(), *args], capture_output=True, text=True,
                          timeout=120, env=ocrd_env(), **kw)


@pytest.mark.e2e
def test_bare_ocrd_prints_the_help() -> None:
    r = ocrd()
    assert r.returncode == 2
    assert r.stdout.startswith("usage: ocrd") and "check-config" in r.stdout
    assert "the following arguments are required" not in r.stderr


@pytest.mark.e2e
def test_every_command_says_what_it_does() -> None:
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) == {"run", "convert", "check-config", "status", "retry"}
    for name in commands:
        r = ocrd(name, "--help")
        assert r.returncode == 0
        body = r.stdout.split("\n\n")
        assert len(body) > 2 and len(body[1].split()) >= 10, (name, r.stdout[:400])


@pytest.mark.e2e
def test_retry_with_an_unknown_reason_fails_and_lists_the_reasons(tmp_path: Path) -> None:
    r = ocrd("retry", "--reason", "emtpy", "-c", str(tmp_path / "never-read.yaml"))
    assert r.returncode == 2
    assert "'emtpy'" in r.stderr and "did you mean 'empty'?" in r.stderr
    assert all(reason in r.stderr for reason in errors.REASONS)


def test_the_reasons_are_those_the_error_file_schema_documents() -> None:
    schema = json.loads((ROOT / "schemas" / "error.schema.json").read_text())
    described = schema["properties"]["reason"]["description"]
    listed = re.search(r"\): (.*)\.$", described).group(1).split(", ")  # type: ignore[union-attr]
    assert tuple(listed) == errors.REASONS
    raised = {c.reason for c in errors.OcrdError.__subclasses__()}
    assert raised <= set(errors.REASONS) | set(errors.PAGE_REASONS)


@pytest.fixture
def config_with_failures(tmp_path: Path) -> Path:
    """A config over a journal with a converted and a failed file (console_site's)."""
    site = build(tmp_path, start=False)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "state_dir": str(site.cfg.state_dir), "metrics": {"listen": None},
        "inboxes": [{"path": str(b.path), "outbox": str(b.outbox), "failed": str(b.failed),
                     "archive": str(b.archive), "recursive": True}
                    for b in site.cfg.inboxes]}))
    return path


@pytest.mark.e2e
def test_status_into_a_closed_pipe_stops_without_a_traceback(config_with_failures: Path) -> None:
    """As `ocrd status | head -0`: the reader is gone before ocrd writes."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([*ocrd_command(), "status", "-c", str(config_with_failures)],
                           stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
                           env=ocrd_env())
    finally:
        os.close(write)
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert r.returncode == 1


@pytest.mark.e2e
def test_status_json_counts_are_whole_numbers_and_times_iso_8601(
        config_with_failures: Path) -> None:
    r = ocrd("status", "--json", "-c", str(config_with_failures))
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert status["counts"] == {"done": 4, "failed": 2}
    assert all(type(n) is int for n in status["counts"].values())
    finished = [f["finished"] for f in status["recent_failures"]]
    assert finished and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", t)
                            for t in finished), finished
    text = ocrd("status", "-c", str(config_with_failures)).stdout
    assert re.search(r"^  \d{4}-\d\d-\d\d \d\d:\d\d \S+  sub/broken.pdf", text, re.M), text


@pytest.mark.e2e
def test_the_help_names_every_command_that_reads_the_config() -> None:
    """`retry` reads -c / $OCRD_CONFIG like run, status and check-config; the help says
    so, and what --json's counts mean."""
    said = " ".join(ocrd("--help").stdout.split())
    assert "run, status, retry and check-config read -c FILE, else $OCRD_CONFIG" in said
    status_help = " ".join(ocrd("status", "--help").stdout.split())
    assert "`failed`: in a failed folder now" in status_help
    assert "`files_failed_since_start` counts every failure of this run" in status_help
