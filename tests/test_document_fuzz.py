"""Mutated documents (tests/document_fuzz.py: a seeded byte-level mutator over the seeds
in tests/real_files/: real PDFs, a TIFF scan, a PNG and a JPEG, and the kinds made here
that once went wrong) through one real `ocrd convert`: every file exactly one outcome, a
documented exit code, never a traceback, no internal_error, no process left behind. A
fixed seed and count: the same files every run, about 30-60 s on two busy cores. Longer
runs: see document_fuzz.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from document_fuzz import download_like_tessdata, run

pytestmark = [pytest.mark.slow]

SEED = 20261203
COUNT = 40


@pytest.mark.e2e
def test_mutated_real_documents_each_get_exactly_one_outcome(tmp_path: Path) -> None:
    report = run(tmp_path, COUNT, SEED, jobs=2, timeout=300)
    assert report.problems == [], (report.problems, report.stderr[-3000:])
    assert len(report.outcomes) == COUNT
    # the mutants are not all alike: some convert, some fail
    assert report.reasons and sum(report.reasons.values()) < COUNT, report.summary


@pytest.mark.e2e
def test_mutants_read_with_language_data_as_downloaded(tmp_path: Path) -> None:
    """tesseract's language data without its configs/ folder (a download of
    tessdata_best): the same promises, and the pages that read still have their words
    (every page was "blank" and the run "ok")."""
    report = run(tmp_path, 12, SEED + 1, jobs=2, timeout=300,
                 tessdata=download_like_tessdata(tmp_path / "tessdata"))
    assert report.problems == [], (report.problems, report.stderr[-3000:])
    texts = [md.read_text() for md in (tmp_path / "out").glob("*.md")]
    assert any(len(t.split()) > 20 for t in texts), texts
