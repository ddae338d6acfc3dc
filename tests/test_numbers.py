"""Numbers read from what a person, a browser or another program wrote — a form field, a
header, an argument, a file name — are ASCII digits or nothing: `str.isdigit()` says yes
to "²" (which int() refuses) and int() refuses more than 4,300 digits, and neither may
become a traceback or a 500."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlencode

import pytest
from console_site import build

from ocrd.config import listen
from ocrd.names import MAX_DIGITS, number

HOSTILE = ["²", "٣", "1²", " 1", "1 ", "-1", "+1", "", "1_000", "0x10", "९०",
           "9" * (MAX_DIGITS + 1)]


def test_number_reads_ascii_digits_only() -> None:
    assert [number(t) for t in ("0", "90", "007", "9" * 30)] == [0, 90, 7, int("9" * 30)]
    assert number("9" * MAX_DIGITS) == int("9" * MAX_DIGITS)
    assert [number(t) for t in HOSTILE] == [None] * len(HOSTILE)


@pytest.mark.parametrize("text", HOSTILE)
def test_a_listen_port_that_is_not_ascii_digits_is_a_sentence(text: str) -> None:
    with pytest.raises(ValueError, match="must be HOST:PORT"):
        listen.parse(f"127.0.0.1:{text}")


def test_console_numbers_that_are_not_ascii_digits_are_refused_not_500(tmp_path: Path) -> None:
    site = build(tmp_path)
    try:
        csrf = site.json("/api/status")["csrf"]
        done = site.ids["done"]
        for rotation in ["²", "९०", "9" * (MAX_DIGITS + 1), "45"]:
            status, headers, _ = site.request(
                "POST", f"/files/{done}/pages/1/turn",
                body=urlencode({"csrf": csrf, "rotation": rotation}).encode())
            assert status == 303, (rotation, status)  # back to the page, with a message
            assert headers["location"] == f"/files/{done}/pages/1"
        endless = "9" * (MAX_DIGITS + 400)  # past int()'s digits: names no route
        for path in (f"/files/{endless}", f"/api/files/{endless}",
                     f"/files/{done}/pages/{endless}"):
            assert site.get(path)[0] == 404, path[:20]
        assert site.request("POST", f"/api/files/{endless}/retry",
                            headers={"X-CSRF-Token": csrf})[0] == 404
        for length in ["\xb2", "9" * (MAX_DIGITS + 1)]:
            status, _, body = site.request(
                "POST", "/upload", headers={
                    "Content-Length": length, "X-CSRF-Token": csrf,
                    "Content-Type": "multipart/form-data; boundary=x"})
            assert status in (400, 411, 413), (length[:8], status, body[:200])
    finally:
        site.stop()


@pytest.mark.e2e
@pytest.mark.parametrize("text", ["²", "9" * (MAX_DIGITS + 1)])
def test_ocrd_retry_takes_a_name_made_of_digit_signs_as_a_name(tmp_path: Path,
                                                               text: str) -> None:
    """Not an id: a path that matches no failed file (exit 1, a sentence)."""
    site = build(tmp_path, start=False)
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {site.cfg.state_dir}\ninboxes:\n"
                      f"  - path: {site.cfg.inboxes[0].path}\n"
                      f"    outbox: {site.cfg.inboxes[0].outbox}\n"
                      f"    failed: {site.cfg.inboxes[0].failed}\n")
    r = subprocess.run([sys.executable, "-m", "ocrd", "retry", "-c", str(config), text],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "NO_COLOR": "1"})
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "nothing to retry" in r.stderr


@pytest.mark.parametrize("text", ["²", "0", "9" * (MAX_DIGITS + 1)])
def test_a_count_argument_that_is_not_a_whole_number_is_a_usage_error(text: str) -> None:
    import argparse

    from ocrd.cli import _positive
    with pytest.raises(argparse.ArgumentTypeError, match="whole number of 1 or more"):
        _positive(text)


def test_an_inbox_group_of_digit_signs_is_no_group_id(tmp_path: Path) -> None:
    """`group: "²"` is a group name (there is none such), not a group id to crash on."""
    from ocrd.config.load import parse_config
    from ocrd.config.settings import ConfigError

    with pytest.raises(ConfigError, match="no such group"):
        parse_config({"state_dir": str(tmp_path / "state"), "inboxes": [
            {"path": str(tmp_path / "in"), "outbox": str(tmp_path / "out"),
             "group": "²"}]}, tmp_path)


def test_shared_page_files_of_an_owner_that_is_not_a_number_are_left_alone() -> None:
    """A file in the shared memory folder (anyone may write there) named like ocrd's page
    files but for an owner of digit signs: the sweep of dead owners' files steps past it."""
    from ocrd.render.pixels import SHARED_DIR, SHARED_PREFIX, _remove_shared

    planted = Path(SHARED_DIR) / f"{SHARED_PREFIX}²{os.getpid()}-planted"
    planted.write_bytes(b"x")
    try:
        _remove_shared(SHARED_PREFIX, only_dead_owners=True)
        assert planted.exists()
    finally:
        planted.unlink(missing_ok=True)
