"""The sidecar and the error file against their JSON Schemas (schemas/), as a real daemon
and `ocrd convert` write them: schema_version, ISO-8601 UTC timestamps, and one shape of
`source` in both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers import Daemon, drop, make_pdf, sentence_lines, wait_for
from record_schemas import ERROR, SIDECAR, valid

from ocrd.outputs import records


@pytest.mark.e2e
def test_daemon_sidecar_and_error_files_match_their_schemas(tmp_path: Path) -> None:
    good = make_pdf(tmp_path / "good.pdf", [sentence_lines(1, 3), sentence_lines(2, 3)])
    cut = tmp_path / "cut.pdf"
    # no trailer, and cut before its pages' objects: qpdf cannot repair it, truncated
    cut.write_bytes(good.read_bytes()[:len(good.read_bytes()) // 3])
    with Daemon(tmp_path / "d") as d:
        d.start()
        drop(good, d.inbox / "good.pdf")
        drop(cut, d.inbox / "cut.pdf")
        (d.inbox / "link.pdf").symlink_to(good)
        wait_for(lambda: (d.outbox / "good.md").exists()
                 and (d.failed / "cut.pdf.error.json").exists()
                 and (d.failed / "link.pdf.error.json").exists(), 60, "all three handled")
    side = json.loads((d.outbox / "good.json").read_text())
    cut_err = json.loads((d.failed / "cut.pdf.error.json").read_text())
    link_err = json.loads((d.failed / "link.pdf.error.json").read_text())
    valid(SIDECAR, side)
    valid(ERROR, cut_err)
    valid(ERROR, link_err)
    assert side["schema_version"] == 1 and cut_err["schema_version"] == 1
    # the same `source` in both: the same keys, and for a regular file the same facts
    assert side["source"].keys() == cut_err["source"].keys() == link_err["source"].keys()
    assert side["source"]["inbox"] == cut_err["source"]["inbox"] == str(d.inbox)
    assert cut_err["source"]["path"] == "cut.pdf"
    assert cut_err["source"]["size"] == len(cut.read_bytes())
    assert link_err["source"]["size"] is None  # a link is never followed, nor measured
    assert cut_err["reason"] == "truncated" and link_err["reason"] == "not_a_regular_file"
    # timestamps: ISO 8601 in UTC, and they mean what they say
    now = datetime.now(UTC)
    for stamp in [side["timings"]["claimed_at"], side["timings"]["finished_at"],
                  cut_err["time"], *(p["finished_at"] for p in side["pages"])]:
        t = datetime.fromisoformat(stamp)
        assert t.utcoffset().total_seconds() == 0 and 0 <= (now - t).total_seconds() < 120


@pytest.mark.e2e
def test_convert_sidecar_matches_the_schema(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "a.pdf", [sentence_lines(3, 2)])
    r = subprocess.run([sys.executable, "-m", "ocrd", "convert", str(pdf), "-o",
                        str(tmp_path / "out"), "--engine", "tesseract", "--quiet"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OCRD_CONFIG": ""})
    assert r.returncode == 0, r.stderr
    side = json.loads((tmp_path / "out" / "a.json").read_text())
    valid(SIDECAR, side)
    assert side["source"]["inbox"] is None and side["source"]["path"] == "a.pdf"


def test_the_schemas_refuse_what_readers_would_trip_on() -> None:
    """A schema that accepted anything would prove nothing: drift is caught."""
    src = records.source("a.pdf", "/in", 10, "0" * 64)
    body = json.loads(records.error_json("truncated", "cut short", src, 1.7e9))
    valid(ERROR, body)
    assert body["time"] == "2023-11-14T22:13:20.000Z"
    for broken in ({**body, "source": "a.pdf"},  # the old string form
                   {k: v for k, v in body.items() if k != "schema_version"},
                   {**body, "time": 1.7e9},
                   {**body, "time": "yesterday"},
                   {**body, "surprise": 1},
                   {**body, "source": {**src, "sha256": "xyz"}}):
        assert not ERROR.is_valid(broken), broken
    assert records.iso(None) is None
    assert records.page({"started_at": 0.0, "finished_at": 1.7e9, "markdown": "x"}) == {
        "started_at": None, "finished_at": "2023-11-14T22:13:20.000Z"}
