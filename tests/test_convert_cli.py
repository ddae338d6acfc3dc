"""`ocrd convert` as OCRmyPDF users expect it: -l/--language for tesseract, -j/--jobs,
-q and -v; human progress on stderr, with log events (only with -v, or warnings) on
lines of their own — also on a terminal (a pty here), where the counter line is
redrawn in place — and a summary line at the end; a folder is walked as an inbox is."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_pdf, sentence_lines

PROGRESS = re.compile(r"^\d+/\d+ \S+: (ok → \S+ \(\d+ pages?, [\d.]+ s\)|FAILED \[\w+\] .+)$")
SUMMARY = "2 converted, 1 failed: 1 truncated"
# structlog's console renderer: timestamp, [level], event
LOG = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z \[(debug|info|warning|error)\s*\] (\w+)")


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    a = make_pdf(tmp_path / "a.pdf", [sentence_lines(1, 3), sentence_lines(2, 3)])
    b = make_pdf(tmp_path / "b.pdf", [sentence_lines(3, 3)])
    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"%PDF-1.4 and nothing more")
    return [a, b, bad]


def convert(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ocrd", "convert", *map(str, args)],
                          capture_output=True, text=True, timeout=180, cwd=cwd,
                          env={**os.environ, "OCRD_CONFIG": ""})


@pytest.mark.e2e
def test_language_and_jobs_reach_tesseract(files: list[Path], tmp_path: Path) -> None:
    r = convert(*files, "-o", "out", "-l", "eng", "-l", "deu", "-j", "1", "-v", cwd=tmp_path)
    assert r.returncode == 3, r.stderr  # bad.pdf is truncated
    side = json.loads((tmp_path / "out" / "a.json").read_text())
    assert side["engine"]["lang"] == "eng+deu" and side["engine"]["model"] == "tesseract:eng+deu"
    (ready,) = [line for line in r.stderr.splitlines() if " engine_ready " in line]
    assert "lang=eng+deu" in ready and "workers=1" in ready
    r = convert(files[0], "-o", "out2", "--language", "xyz", cwd=tmp_path)
    assert r.returncode == 6 and "tesseract has no language data for xyz" in r.stderr
    r = convert(files[0], "-o", "out3", "-j", "0", cwd=tmp_path)
    assert r.returncode == 2 and "must be a whole number of 1 or more" in r.stderr


@pytest.mark.e2e
def test_progress_alone_on_stderr_by_default(files: list[Path], tmp_path: Path) -> None:
    r = convert(*files, "-o", "out", cwd=tmp_path)
    assert r.returncode == 3
    assert r.stdout == ""
    *lines, summary = r.stderr.splitlines()
    assert len(lines) == 3 and all(PROGRESS.match(line) for line in lines), lines
    assert sorted(line.split()[1].rstrip(":") for line in lines) == [str(f) for f in files]
    assert summary == SUMMARY


@pytest.mark.e2e
def test_quiet_shows_only_the_failures(files: list[Path], tmp_path: Path) -> None:
    r = convert(*files, "-o", "out", "-q", cwd=tmp_path)
    assert r.returncode == 3
    assert r.stderr.splitlines() == [f"{files[2]}: FAILED [truncated] the PDF ends without "
                                     "its trailer (%%EOF) and qpdf cannot repair it: it is "
                                     "truncated", SUMMARY]
    r = convert(*files[:2], "-o", "out", "-q", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == ""  # nothing failed: nothing to say


@pytest.mark.e2e
def test_verbose_log_events_are_lines_of_their_own(files: list[Path], tmp_path: Path) -> None:
    r = convert(*files, "-o", "out", "-vv", cwd=tmp_path)
    lines = r.stderr.splitlines()
    progress = [line for line in lines if PROGRESS.match(line)]
    logs = [line for line in lines if LOG.match(line)]
    assert len(progress) == 3
    events = {LOG.match(line).group(2) for line in logs}  # type: ignore[union-attr]
    assert {"engine_chosen", "file_converted", "page_done"} <= events, events
    assert lines[-1] == SUMMARY
    assert len(progress) + len(logs) + 1 == len(lines), [
        line for line in lines if not (PROGRESS.match(line) or LOG.match(line))]
    assert not [line for line in lines if line.lstrip().startswith("{")]  # no JSON


@pytest.mark.e2e
def test_on_a_terminal_the_counter_line_never_runs_into_a_log_line(
        files: list[Path], tmp_path: Path) -> None:
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ocrd", "convert", *map(str, files), "-o",
                             "out", "-v"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=child,
                            env={**os.environ, "OCRD_CONFIG": "", "TERM": "xterm"})
    os.close(child)
    raw = b""
    while True:
        ready, _, _ = select.select([main], [], [], 120)
        assert ready, "no output for 120 s"
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        raw += chunk
    os.close(main)
    assert proc.wait(60) == 3
    text = re.sub(r"\x1b\[[0-9;]*m", "", raw.decode())  # the console renderer's colours
    assert "] 0/3 files" in text  # the counter line, drawn before the first file ends
    lines = text.replace("\r\n", "\n").split("\n")
    for line in lines:
        # what stays visible of each line once the terminal has applied \r + erase
        shown = line.rsplit("\r\x1b[K", 1)[-1]
        is_log, is_progress = bool(LOG.match(shown)), bool(PROGRESS.match(shown))
        is_bar = bool(re.fullmatch(r"(\[[#.]{20}\] \d/3 files)?", shown))
        assert is_log or is_progress or is_bar or shown == SUMMARY, repr(line)
    visible = [line.rsplit("\r\x1b[K", 1)[-1] for line in lines]
    assert len([v for v in visible if PROGRESS.match(v)]) == 3
    assert [v for v in visible if v][-1] == SUMMARY  # after the counter line is gone
    assert [v for v in visible if LOG.match(v) and " file_converted " in v]


@pytest.mark.e2e
def test_a_folder_is_walked_as_an_inbox_is(tmp_path: Path) -> None:
    """`ocrd convert FOLDER -o out`: every document in it and its subfolders, the
    subfolders mirrored in out; what an inbox skips (dotfiles, partial downloads, OS
    junk) skipped; the output folder, inside it, left alone; links never followed."""
    docs = tmp_path / "docs"
    (docs / "2024" / "March").mkdir(parents=True)
    make_pdf(docs / "a.pdf", [sentence_lines(5, 2)])
    make_pdf(docs / "2024" / "March" / "b.pdf", [sentence_lines(6, 2)])
    (docs / "2024" / "bad.pdf").write_bytes(b"%PDF-1.4 and nothing more")
    (docs / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (docs / "c.pdf.part").write_bytes(b"%PDF-1.4 partial")
    (docs / "@eaDir").mkdir()
    (docs / "@eaDir" / "a.pdf").write_bytes(b"synology thumbnail")
    outside = make_pdf(tmp_path / "outside.pdf", [sentence_lines(7, 2)])
    (docs / "link.pdf").symlink_to(outside)
    r = convert(docs, "-o", docs / "out", "-j", "1", cwd=tmp_path)
    assert r.returncode == 3, r.stderr  # bad.pdf (truncated) and link.pdf: bad input
    out = docs / "out"
    assert (out / "a.md").exists() and (out / "2024" / "March" / "b.md").exists()
    assert json.loads((out / "2024" / "March" / "b.json").read_text())["source"]["path"] \
        == "2024/March/b.pdf"
    *lines, summary = r.stderr.splitlines()
    shown = sorted(line.split()[1].rstrip(":") for line in lines)
    assert shown == sorted(str(docs / p) for p in ("a.pdf", "2024/March/b.pdf",
                                                    "2024/bad.pdf", "link.pdf")), lines
    assert "FAILED [not_a_regular_file]" in [x for x in lines if "link.pdf" in x][0]
    assert summary == "2 converted, 2 failed: 1 not_a_regular_file, 1 truncated"
    # a second run does not take the first run's outputs for documents
    again = convert(docs, "-o", docs / "out", "-j", "1", "-q", cwd=tmp_path)
    assert "out/" not in again.stderr and again.returncode == 3, again.stderr
    empty = tmp_path / "empty"
    (empty / ".stfolder").mkdir(parents=True)  # nothing but what an inbox skips
    r = convert(empty, "-o", "out", cwd=tmp_path)
    assert r.returncode == 0 and "no files to convert" in r.stderr
