"""Writers that close the file between chunks and pause before they append the next one
(SMB clients, some network scanners), through a real daemon watching with inotify: the
document is converted once, whole, never split into pieces that fail; a file that is
not complete (a PDF without its trailer, an image that does not decode to its end)
waits `incomplete_seconds` unchanged before it fails, and `ocrd status` says when that
is — the very time it then fails; a complete file still goes at once.

The pauses are the writers' own (what is being tested), not synchronisation: every wait
for the daemon polls with a deadline. The 60-s writer shares one daemon with nothing
else and is `slow`; the rule it proves is the 12-s writer's, with a longer pause."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from daemon_process import ocrd_command, ocrd_env
from helpers import (
    Daemon,
    files_under,
    free_port,
    make_pdf,
    recall,
    sentence_lines,
    text_image,
    wait_for,
)

pytestmark = pytest.mark.e2e


def pausing_writer(path: Path, data: bytes, chunks: int, pause: float,
                   closed_at: list[float]) -> threading.Thread:
    """Writes `data` into `path` in `chunks` pieces, each opened for appending, written
    and closed, with `pause` seconds between them; appends each close's time."""
    pieces = [data[i * len(data) // chunks:(i + 1) * len(data) // chunks]
              for i in range(chunks)]

    def write() -> None:
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(pause)
            with open(path, "ab") as f:
                f.write(piece)
            closed_at.append(time.time())

    thread = threading.Thread(target=write, name=f"writer-{path.name}")
    thread.start()
    return thread


def daemon_with(root: Path, incomplete_seconds: float, web: bool = False) -> Daemon:
    for name in ("outbox", "failed"):
        (root / name).mkdir(parents=True, exist_ok=True)
    top = {"web": {"listen": f"127.0.0.1:{free_port()}"}} if web else {}
    return Daemon(root, inboxes=[{
        "path": str(root / "inbox"), "outbox": str(root / "outbox"),
        "failed": str(root / "failed"), "on_success": "delete", "watch": "inotify",
        "quiet_seconds": 1.0, "incomplete_seconds": incomplete_seconds}], **top)


def status_json(d: Daemon) -> dict:
    out = subprocess.run([*ocrd_command(), "status", "--json", "-c", str(d.config_path)],
                         capture_output=True, text=True, timeout=60, env=ocrd_env())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_writer_pausing_12_s_between_chunks_is_not_split_and_fails_at_is_true(
        tmp_path: Path) -> None:
    """A PDF and a PNG written in chunks 12 s apart (a closed file used to be read 10 s
    after its close: split, and every piece failed), a complete PDF (goes at once), and
    a PDF cut in half that nobody finishes (fails once unchanged for incomplete_seconds,
    at the time `ocrd status` gave)."""
    src = tmp_path / "src"
    src.mkdir()
    pdf_lines, png_lines, whole_lines = sentence_lines(1, 6), sentence_lines(2, 6), \
        sentence_lines(3, 6)
    make_pdf(src / "scan.pdf", [pdf_lines])
    text_image(png_lines).save(src / "photo.png")
    make_pdf(src / "whole.pdf", [whole_lines])
    make_pdf(src / "cut.pdf", [sentence_lines(4, 6)])
    incomplete = 20.0

    with daemon_with(tmp_path / "d", incomplete, web=True) as d:
        d.start()
        closes: dict[str, list[float]] = {n: [] for n in ("scan.pdf", "photo.png",
                                                           "whole.pdf", "cut.pdf")}
        writers = [pausing_writer(d.inbox / n, (src / n).read_bytes(), 2, 12.0, closes[n])
                   for n in ("scan.pdf", "photo.png")]
        cut = (src / "cut.pdf").read_bytes()
        pausing_writer(d.inbox / "cut.pdf", cut[:len(cut) // 2], 1, 0, closes["cut.pdf"]).join()
        pausing_writer(d.inbox / "whole.pdf", (src / "whole.pdf").read_bytes(), 1, 0,
                       closes["whole.pdf"]).join()

        # what status says of the cut file: it fails incomplete_seconds after its last
        # change, not 10 s after its writer closed it
        def cut_waiting() -> dict | None:
            waiting = status_json(d).get("waiting") or []
            return next((w for w in waiting if w["name"] == "cut.pdf" and w.get("until")
                         and w["reason"] == "truncated"), None)

        said = wait_for(cut_waiting, 15, "cut.pdf waiting, with the time it fails", every=0.5)
        assert said["fails_then"], said
        expected_until = closes["cut.pdf"][-1] + incomplete
        assert abs(said["until"] - expected_until) < 3, (said, expected_until)
        assert "fails at " + time.strftime("%H:%M:%S", time.localtime(said["until"])) \
            in said["why"], said

        error_file = d.failed / "cut.pdf.error.json"
        failed_at = wait_for(lambda: error_file.exists() and time.time(), 60,
                             "cut.pdf in failed/", every=0.1)
        for w in writers:
            w.join()
        for stem in ("scan", "photo"):
            wait_for(lambda s=stem: (d.outbox / f"{s}.md").exists(), 90, f"{stem}.md")
        wait_for(lambda: (d.outbox / "whole.md").exists(), 60, "whole.md")
        time.sleep(2)  # a piece split off and failed would show up now
        claims = [e["file"] for e in d.events("file_claimed")]
        claimed_at = {e["file"]: _epoch(e["timestamp"]) for e in d.events("file_claimed")}

    # never before the time status gave (nor long after it)
    assert said["until"] - 0.5 <= failed_at <= said["until"] + 10, (failed_at, said)
    assert json.loads(error_file.read_text())["reason"] == "truncated"
    # each writer's document converted once, whole; nothing else failed
    for name in ("scan.pdf", "photo.png", "whole.pdf", "cut.pdf"):
        assert claims.count(name) == 1, (name, claims)
    assert files_under(d.failed) == ["cut.pdf", "cut.pdf.error.json"]
    mds = {p.name: p.read_text() for p in d.outbox.glob("*.md")}
    assert sorted(mds) == ["photo.md", "scan.md", "whole.md"], sorted(mds)
    for name in ("scan.pdf", "photo.png"):
        meta = json.loads((d.outbox / (name.rsplit(".", 1)[0] + ".json")).read_text())
        assert meta["source"]["size"] == (src / name).stat().st_size, name
    assert recall(pdf_lines, mds["scan.md"]) >= 0.9, mds["scan.md"]
    assert recall(png_lines, mds["photo.md"]) >= 0.9, mds["photo.md"]
    assert recall(whole_lines, mds["whole.md"]) >= 0.9
    # the complete file went at once: not after incomplete_seconds
    assert claimed_at["whole.pdf"] - closes["whole.pdf"][-1] < incomplete / 2


@pytest.mark.slow
def test_a_writer_pausing_60_s_between_chunks_is_not_split(tmp_path: Path) -> None:
    """The same writer with a minute between its chunks: with incomplete_seconds above
    the pause, the document waits, whole, and is converted once."""
    src = tmp_path / "src"
    src.mkdir()
    lines = sentence_lines(5, 6)
    make_pdf(src / "slow.pdf", [lines, sentence_lines(6, 6)])
    with daemon_with(tmp_path / "d", 75.0) as d:
        d.start()
        closes: list[float] = []
        pausing_writer(d.inbox / "slow.pdf", (src / "slow.pdf").read_bytes(), 2, 60.0,
                       closes).join()
        wait_for(lambda: (d.outbox / "slow.md").exists(), 60, "slow.md")
        time.sleep(2)
        claims = [e["file"] for e in d.events("file_claimed")]
    assert claims == ["slow.pdf"], claims
    assert files_under(d.failed) == []
    meta = json.loads((d.outbox / "slow.json").read_text())
    assert meta["page_count"] == 2
    assert meta["source"]["size"] == (src / "slow.pdf").stat().st_size
    assert recall(lines, (d.outbox / "slow.md").read_text()) >= 0.9


def _epoch(ts: str) -> float:
    """A log event's ISO 8601 time stamp, as seconds since the epoch."""
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
