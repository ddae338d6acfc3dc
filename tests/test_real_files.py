"""Real files nobody here made (tests/real_files/, sources and licences in its README),
through the real `ocrd convert` and the real daemon: no file ends a run or stalls the
daemon, each gets the right reason, and a page that cannot be read costs that page only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import Daemon, wait_for

REAL = Path(__file__).resolve().parent / "real_files"
SUMMARY = re.compile(r"^\d+ converted( \(\d+ with degraded pages\))?(, \d+ failed: .+)?$")


def convert(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ocrd", "convert", *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "OCRD_CONFIG": ""})


def copies(tmp_path: Path, *names: str) -> list[Path]:
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    return [Path(shutil.copy(REAL / n, folder / n)) for n in names]


def lines_for(stderr: str, path: Path) -> list[str]:
    """The progress lines about one file."""
    return [line for line in stderr.splitlines() if f" {path}: " in f" {line}"]


def sidecar(out: Path, stem: str) -> dict:
    return json.loads((out / f"{stem}.json").read_text())


@pytest.mark.e2e
def test_a_file_that_raises_outside_the_error_mapping_fails_alone(tmp_path: Path) -> None:
    """poppler-937-0-fuzzed.pdf made PDFium raise while its pages were counted, and
    boundingBox_invalid.pdf made pypdfium2 raise ValueError while rendering page 3: each
    ended the whole call with a traceback, and the other files got no result."""
    good, fuzzed, crop = copies(tmp_path, "opt_demo.pdf", "poppler-937-0-fuzzed.pdf",
                                "boundingBox_invalid.pdf")
    r = convert(good, fuzzed, crop, "-o", "out", "-j", "1", cwd=tmp_path)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 3, r.stderr  # one bad input, nothing else
    (bad,) = lines_for(r.stderr, fuzzed)
    assert "FAILED [damaged]" in bad
    for path in (good, crop):
        (line,) = lines_for(r.stderr, path)
        assert ": ok → " in line, line
    assert sidecar(tmp_path / "out", "boundingBox_invalid")["page_count"] == 3
    assert "Radio" in (tmp_path / "out" / "opt_demo.md").read_text()
    assert r.stderr.splitlines()[-1] == "2 converted, 1 failed: 1 damaged"


@pytest.mark.e2e
def test_a_damaged_pdf_after_an_encrypted_one_is_damaged(tmp_path: Path) -> None:
    """One render worker (-j 1) opens the encrypted file, then the damaged one: PDFium's
    last error ("password") came over from the first file, and the damaged file was
    reported as encrypted (exit 4). Each file now has workers of its own."""
    locked, damaged = copies(tmp_path, "issue6010_1.pdf", "poppler-395-0-fuzzed.pdf")
    r = convert(locked, damaged, "-o", "out", "-j", "1", cwd=tmp_path)
    (first,) = lines_for(r.stderr, locked)
    (second,) = lines_for(r.stderr, damaged)
    assert "FAILED [encrypted]" in first
    assert "FAILED [damaged]" in second and "password" not in second, second
    assert r.returncode == 1, r.stderr  # failures of several kinds
    assert r.stderr.splitlines()[-1] == "0 converted, 2 failed: 1 damaged, 1 encrypted"


@pytest.mark.e2e
def test_a_scan_without_its_eof_marker_that_reads_is_converted(tmp_path: Path) -> None:
    """scan-bad.pdf ends without %%EOF but every renderer opens it: it converts (with a
    warning in the sidecar) instead of failing as truncated."""
    (scan,) = copies(tmp_path, "scan-bad.pdf")
    r = convert(scan, "-o", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    meta = sidecar(tmp_path / "out", "scan-bad")
    assert meta["status"] == "ok" and meta["page_count"] == 1
    assert [w for w in meta["warnings"] if "%%EOF" in w], meta["warnings"]
    assert "pdf.js" in (tmp_path / "out" / "scan-bad.md").read_text()


@pytest.mark.e2e
def test_a_pdf_qpdf_cannot_rewrite_gets_its_searchable_pdf_from_its_pages(tmp_path: Path
                                                                          ) -> None:
    """issue18986.pdf renders, but qpdf finds no /Root: with --pdf the call exited 0 and
    only a warning said that the PDF was missing; then the file failed as output_failed.
    Pages-tree-refs.pdf's page tree loops (qpdf refuses it; page 1 renders). Both now get
    a searchable PDF made from their rendered pages, the sidecar saying so and why."""
    doc, loop, good = copies(tmp_path, "issue18986.pdf", "Pages-tree-refs.pdf", "opt_demo.pdf")
    r = convert(doc, loop, good, "-o", "out", "--pdf", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    assert "/Root" in sidecar(out, "issue18986")["outputs"]["pdf_rebuilt"]
    meta = sidecar(out, "Pages-tree-refs")
    assert "Loop detected" in meta["outputs"]["pdf_rebuilt"]
    assert "/proc/" not in meta["outputs"]["pdf_rebuilt"]  # no descriptor paths
    assert meta["pages"][0]["text_layer"] == {"placement": "words", "layer": "added"}
    assert "pdf_rebuilt" not in sidecar(out, "opt_demo")["outputs"]  # the original
    text = subprocess.run(["pdftotext", str(out / "Pages-tree-refs.pdf"), "-"],
                          capture_output=True, text=True, check=True).stdout
    assert "Pages" in text and "loop" in text, text
    pages = subprocess.run(["pdfinfo", str(out / "Pages-tree-refs.pdf")], capture_output=True,
                           text=True, check=True).stdout
    assert re.search(r"^Pages:\s+2$", pages, re.MULTILINE), pages  # every page, in order
    assert r.stderr.splitlines()[-1] == "3 converted (1 with degraded pages)"


@pytest.mark.e2e
def test_one_unreadable_page_costs_that_page(tmp_path: Path) -> None:
    """Pages-tree-refs.pdf's page tree loops: page 1 reads, page 2 does not. The file
    failed whole; now page 2 is marked degraded and page 1 is kept."""
    (loop,) = copies(tmp_path, "Pages-tree-refs.pdf")
    r = convert(loop, "-o", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "out" / "Pages-tree-refs.md").read_text()
    assert "Pages loop" in md
    assert "<!-- page 2 (degraded: unreadable) -->" in md
    meta = sidecar(tmp_path / "out", "Pages-tree-refs")
    assert meta["status"] == "degraded" and meta["degraded_pages"] == [2]
    page2 = meta["pages"][1]
    assert page2["status"] == "degraded" and page2["degraded"] == "unreadable"
    assert "page 2" in page2["message"]
    assert r.stderr.splitlines()[-1] == "1 converted (1 with degraded pages)"


@pytest.mark.e2e
def test_a_one_point_page_is_blank_not_damaged(tmp_path: Path) -> None:
    """bug_1265.pdf's only page is 1×1 pt: it was failed as "damaged: poppler cannot
    read the PDF's pages". It is a page too small to hold text: blank, and said so."""
    (tiny,) = copies(tmp_path, "bug_1265.pdf")
    r = convert(tiny, "-o", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    page = sidecar(tmp_path / "out", "bug_1265")["pages"][0]
    assert page["status"] == "blank"
    assert "1×1 pt" in page["message"] and "damaged" not in page["message"]
    assert "<!-- page 1 (blank) -->" in (tmp_path / "out" / "bug_1265.md").read_text()


@pytest.mark.e2e
def test_daemon_gives_every_real_file_its_outcome_without_waiting(tmp_path: Path) -> None:
    """In the daemon: the file that raised while it was checked never left the inbox (a
    traceback every 30 s, nothing in failed/); the scan without %%EOF waited
    incomplete_seconds and then failed as truncated. Now each gets its outcome, and the
    others go on: the scan without %%EOF is converted, with a warning, once unchanged
    for incomplete_seconds (a close is no proof of a file's end:
    tests/intake/test_paused_writers.py)."""
    d = Daemon(tmp_path / "d")
    d.config["inboxes"][0]["incomplete_seconds"] = 10
    names = ["poppler-937-0-fuzzed.pdf", "scan-bad.pdf", "Pages-tree-refs.pdf",
             "bug_1265.pdf", "issue6010_1.pdf", "poppler-395-0-fuzzed.pdf", "opt_demo.pdf"]
    failing = {"poppler-937-0-fuzzed.pdf": "damaged", "issue6010_1.pdf": "encrypted",
               "poppler-395-0-fuzzed.pdf": "damaged"}
    with d:
        d.start()
        for name in names:  # written in place and closed, as a copy does
            shutil.copy(REAL / name, d.inbox / name)

        def outcome(name: str) -> bool:
            stem = name.rsplit(".", 1)[0]
            return (d.failed / f"{name}.error.json").exists() or \
                (d.outbox / f"{stem}.md").exists()

        wait_for(lambda: all(outcome(n) for n in names), 120, "every file's outcome")
        assert not d.died()
        assert not d.events("check_failed") and not d.events("internal_error")
    for name, reason in failing.items():
        err = json.loads((d.failed / f"{name}.error.json").read_text())
        assert err["reason"] == reason, err
    for name in set(names) - set(failing):
        assert (d.archive / name).exists(), name
    scan = json.loads((d.outbox / "scan-bad.json").read_text())
    assert scan["warnings"] and scan["status"] == "ok"
    loop = json.loads((d.outbox / "Pages-tree-refs.json").read_text())
    assert loop["degraded_pages"] == [2]


@pytest.mark.e2e
def test_a_pdf_still_being_written_waits_and_one_cut_short_fails_once_unchanged(
        tmp_path: Path) -> None:
    """A PDF whose writer still holds it open keeps waiting, however long it is quiet;
    once written and closed it converts. A PDF cut short that does not read, closed,
    fails as truncated once unchanged for incomplete_seconds — not sooner: a writer may
    close a file between chunks (tests/intake/test_paused_writers.py)."""
    whole = (REAL / "opt_demo.pdf").read_bytes()
    incomplete = 8.0
    d = Daemon(tmp_path / "d")
    d.config["inboxes"][0].update(quiet_seconds=0.5, incomplete_seconds=incomplete)
    with d:
        d.start()
        with open(d.inbox / "slow.pdf", "wb") as writer:
            writer.write(whole[:len(whole) // 2])
            writer.flush()
            wait_for(lambda: [e for e in d.events("file_incomplete")
                              if e.get("file") == "slow.pdf"], 60, "a check that waits")
            # checked, found cut short, and left waiting (quiet for longer than
            # quiet_seconds, but its writer has not closed it)
            assert not (d.failed / "slow.pdf").exists()
            assert not (d.outbox / "slow.md").exists()
            writer.write(whole[len(whole) // 2:])
        wait_for((d.outbox / "slow.md").exists, 60, "slow.md")
        (d.inbox / "cut.pdf").write_bytes(whole[:len(whole) // 2])
        written = time.monotonic()
        wait_for((d.failed / "cut.pdf.error.json").exists, 60, "cut.pdf in failed/")
        assert time.monotonic() - written >= incomplete - 0.5
    err = json.loads((d.failed / "cut.pdf.error.json").read_text())
    assert err["reason"] == "truncated", err
    assert "Radio" in (d.outbox / "slow.md").read_text()


@pytest.mark.e2e
def test_what_the_corpus_run_found(tmp_path: Path) -> None:
    """Files of the corpus run (bench/corpus_sources.txt) that got a wrong reason, and a
    mutant of the fuzz run that ended the whole call:
    - truncated_jpeg.jpg misses its last bytes but decodes: converted, with a warning
      (was failed as truncated; OCRmyPDF converts it);
    - pr6531_2.pdf: PDFium asks for a password poppler does not need: converted (was
      failed as encrypted; OCRmyPDF converts it);
    - bug_782596.pdf starts "%PDF" without the version's dash, and PDFium reads it (was
      unsupported_format);
    - rgb32-111110.bmp is a BMP variant Pillow does not read: unsupported_format (was
      truncated);
    - phototest-fuzzed.tif (tesseract's phototest.tif mutated by tests/document_fuzz.py)
      made Pillow raise TypeError: the call ended with a traceback; now damaged."""
    names = ["truncated_jpeg.jpg", "pr6531_2.pdf", "bug_782596.pdf", "rgb32-111110.bmp",
             "phototest-fuzzed.tif"]
    files = dict(zip(names, copies(tmp_path, *names), strict=True))
    r = convert(tmp_path / "in", "-o", "out", "-j", "1", cwd=tmp_path)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 3, r.stderr
    for name in names[:3]:
        (line,) = lines_for(r.stderr, files[name])
        assert ": ok → " in line, line
    (bmp,) = lines_for(r.stderr, files["rgb32-111110.bmp"])
    assert "FAILED [unsupported_format]" in bmp and "BMP" in bmp, bmp
    (tif,) = lines_for(r.stderr, files["phototest-fuzzed.tif"])
    assert "FAILED [damaged]" in tif, tif
    jpeg = sidecar(tmp_path / "out", "truncated_jpeg")
    assert [w for w in jpeg["warnings"] if "ends early" in w], jpeg
    assert sidecar(tmp_path / "out", "pr6531_2")["source"]["renderer"] == "pdf2image"
    assert r.stderr.splitlines()[-1] == "3 converted, 2 failed: 1 damaged, 1 unsupported_format"
