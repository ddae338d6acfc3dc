"""End to end: the daemon as a real subprocess with the tesseract engine, real PDFium,
real files. What a user would check: the Markdown exists, says the right words, appeared
whole, and the original went where it should."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from daemon_process import ocrd_command, ocrd_env
from helpers import (
    Daemon,
    claimed_files,
    drop,
    files_under,
    make_pdf,
    recall,
    sentence_lines,
    text_image,
    wait_for,
    without_read_override,
)
from PIL import Image

pytestmark = pytest.mark.e2e


def md_of(d: Daemon, name: str) -> Path:
    return d.outbox / name


def test_pdf_png_and_sideways_jpeg_become_markdown(tmp_path: Path) -> None:
    pdf_pages = [sentence_lines(1), sentence_lines(2)]
    png_lines = sentence_lines(3, 6)
    jpg_lines = sentence_lines(4, 6)
    src = tmp_path / "src"
    src.mkdir()
    make_pdf(src / "report.pdf", pdf_pages)
    text_image(png_lines).save(src / "scan.png")
    # A phone photo taken sideways: pixels stored rotated, EXIF says "rotate 90° CW".
    upright = text_image(jpg_lines)
    exif = Image.Exif()
    exif[0x0112] = 6
    upright.rotate(90, expand=True).save(src / "photo.jpg", quality=92, exif=exif.tobytes())

    with Daemon(tmp_path / "d") as d:
        d.start()
        for name in ("report.pdf", "scan.png", "photo.jpg"):
            drop(src / name, d.inbox / name)
        for stem in ("report", "scan", "photo"):
            wait_for(lambda s=stem: (d.outbox / f"{s}.md").exists(), 60, f"{stem}.md")

    report = (d.outbox / "report.md").read_text()
    assert recall(pdf_pages[0] + pdf_pages[1], report) >= 0.95, report
    assert report.index("<!-- page 1 -->") < report.index("<!-- page 2 -->")
    assert recall(png_lines, (d.outbox / "scan.md").read_text()) >= 0.95
    photo = (d.outbox / "photo.md").read_text()
    assert recall(jpg_lines, photo) >= 0.95, photo

    meta = json.loads((d.outbox / "report.json").read_text())
    original = (src / "report.pdf").read_bytes()
    assert meta["source"]["path"] == "report.pdf"
    assert meta["source"]["size"] == len(original)
    assert meta["source"]["sha256"] == hashlib.sha256(original).hexdigest()
    assert meta["engine"]["kind"] == "tesseract" and meta["engine"]["model"]
    assert meta["page_count"] == 2 and len(meta["pages"]) == 2
    for i, page in enumerate(meta["pages"], 1):
        assert page["page"] == i and page["status"] == "ok"
        assert page["engine_seconds"] > 0 and page["finished_at"] >= page["started_at"]
    photo_meta = json.loads((d.outbox / "photo.json").read_text())
    # EXIF applied: the page is upright (wider than tall, like the original)
    assert photo_meta["pages"][0]["width"] > photo_meta["pages"][0]["height"]
    # originals archived, inbox empty but for the work area
    assert files_under(d.archive) == ["photo.jpg", "report.pdf", "scan.png"]
    assert (d.archive / "report.pdf").read_bytes() == original
    assert [p.name for p in d.inbox.iterdir()] == [".ocrd-work"]
    assert claimed_files(d.inbox) == []


def test_preexisting_file_chunked_write_part_rename_and_junk(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    early_lines = sentence_lines(5, 4)
    make_pdf(src / "early.pdf", [early_lines])
    make_pdf(src / "slow.pdf", [sentence_lines(6, 4), sentence_lines(7, 4)])
    make_pdf(src / "renamed.pdf", [sentence_lines(8, 4)])

    d = Daemon(tmp_path / "d")
    drop(src / "early.pdf", d.inbox / "early.pdf")  # present before the daemon starts
    junk = [".DS_Store", "._early.pdf", "Thumbs.db", "~$letter.docx", "scan.pdf.part",
            "x.tmp", "download.pdf.crdownload"]
    for name in junk:
        (d.inbox / name).write_bytes(b"junk")
    with d:
        d.start()
        wait_for(lambda: (d.outbox / "early.md").exists(), 60, "early.md")
        assert recall(early_lines, (d.outbox / "early.md").read_text()) >= 0.95

        # A scanner writing over 10 s, opening and closing the file for every chunk.
        data = (src / "slow.pdf").read_bytes()
        chunks = [data[i * len(data) // 10:(i + 1) * len(data) // 10] for i in range(10)]
        t_complete = 0.0
        for chunk in chunks:
            time.sleep(1.0)
            with open(d.inbox / "slow.pdf", "ab") as f:
                f.write(chunk)
            t_complete = time.time()  # when the file became complete (last close)
        # x.pdf.part written, then renamed to x.pdf
        (d.inbox / "renamed.pdf.part").write_bytes((src / "renamed.pdf").read_bytes())
        time.sleep(1.5)
        assert not (d.outbox / "renamed.md").exists()
        os.rename(d.inbox / "renamed.pdf.part", d.inbox / "renamed.pdf")
        wait_for(lambda: (d.outbox / "slow.md").exists(), 60, "slow.md")
        wait_for(lambda: (d.outbox / "renamed.md").exists(), 60, "renamed.md")
        time.sleep(2)  # a second, wrong conversion would show up now
        claims = [e["file"] for e in d.events("file_claimed")]

    assert claims.count("slow.pdf") == 1 and claims.count("renamed.pdf") == 1
    assert claims.count("early.pdf") == 1
    slow_meta = json.loads((d.outbox / "slow.json").read_text())
    assert slow_meta["source"]["size"] == len(data) and slow_meta["page_count"] == 2
    claimed_at = datetime.fromisoformat(slow_meta["timings"]["claimed_at"]).timestamp()
    assert claimed_at >= t_complete - 0.05
    assert files_under(d.outbox) == sorted(
        f"{s}.{x}" for s in ("early", "renamed", "slow") for x in ("json", "md"))
    assert not d.failed.exists() or files_under(d.failed) == []
    for name in junk:  # untouched
        assert (d.inbox / name).read_bytes() == b"junk"


def test_sigkill_mid_conversion_then_restart_converts_exactly_once(tmp_path: Path) -> None:
    pages = [sentence_lines(10 + i, 6) for i in range(8)]
    src = tmp_path / "book.pdf"
    make_pdf(src, pages)
    d = Daemon(tmp_path / "d")
    seen_partial: list[str] = []
    stop_watch = threading.Event()

    def watch_outbox() -> None:
        # Any Markdown that is ever visible must be complete.
        while not stop_watch.is_set():
            md = d.outbox / "book.md"
            try:
                text = md.read_text()
            except (FileNotFoundError, UnicodeDecodeError):
                text = None
            if text is not None and "<!-- page 8 -->" not in text:
                seen_partial.append(text)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch_outbox, daemon=True)
    watcher.start()
    try:
        with d:
            d.start()
            drop(src, d.inbox / "book.pdf")
            wait_for(lambda: d.events("page_done"), 60, "the first page converted")
            d.kill()  # SIGKILL to the whole process group, mid-document
            assert not (d.outbox / "book.md").exists()
            work = claimed_files(d.inbox)
            assert len(work) == 1 and work[0].endswith("/book.pdf"), work
            d.start()
            wait_for(lambda: (d.outbox / "book.md").exists(), 90, "book.md after restart")
            assert d.event("file_resumed")["file"] == "book.pdf"
            time.sleep(1)
    finally:
        stop_watch.set()
        watcher.join()
    assert seen_partial == []
    text = (d.outbox / "book.md").read_text()
    assert recall([w for p in pages for w in p], text) >= 0.95
    assert files_under(d.outbox) == ["book.json", "book.md"]
    assert files_under(d.archive) == ["book.pdf"]
    assert claimed_files(d.inbox) == []
    meta = json.loads((d.outbox / "book.json").read_text())
    assert meta["page_count"] == 8 and [p["page"] for p in meta["pages"]] == list(range(1, 9))
    out = subprocess.run([*ocrd_command(), "status", "-c", str(d.config_path), "--json"],
                         capture_output=True, text=True, check=True, env=ocrd_env())
    counts = json.loads(out.stdout)["counts"]
    assert counts == {"done": 1}


def test_ctrl_c_stops_the_daemon_without_tracebacks(tmp_path: Path) -> None:
    """Ctrl-C in the terminal where `ocrd run` (or scripts/run-local) runs reaches its
    whole process group, render workers included: the daemon stops as on SIGTERM, and
    nobody prints a KeyboardInterrupt traceback."""
    d = Daemon(tmp_path / "d")
    with d:
        d.start()
        drop(make_pdf(tmp_path / "a.pdf", [sentence_lines(5, 3)]), d.inbox / "a.pdf")
        wait_for(lambda: (d.outbox / "a.md").exists(), 60, "a.md")
        assert d.events("page_rendered") or d.events("page_done")  # workers are running
        os.killpg(d.pid, signal.SIGINT)
        assert d.proc is not None and d.proc.wait(60) == 0
    log = d.log_text()
    assert d.event("stopped") is not None, log[-2000:]
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]


def _workers(pid: int) -> list[int]:
    """The daemon's render worker processes (multiprocessing's spawned children)."""
    out = []
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    out.append(int(child))
    return out


def test_ctrl_c_while_the_workers_start_stops_the_daemon_without_tracebacks(
        tmp_path: Path) -> None:
    """Ctrl-C the moment the daemon's first render worker exists (it is still starting
    Python): nothing in the group may die of it with a traceback; the daemon stops."""
    d = Daemon(tmp_path / "d")
    with d:
        d.start(wait_ready=False)
        wait_for(lambda: _workers(d.pid), 60, "the first render worker", every=0.002)
        os.killpg(d.pid, signal.SIGINT)
        assert d.proc is not None and d.proc.wait(60) == 0, d.log_text()[-3000:]
    log = d.log_text()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]


def test_bad_files_land_in_failed_with_reasons_and_daemon_keeps_going(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    good = make_pdf(src / "good.pdf", [sentence_lines(20, 4)])
    whole = good.read_bytes()
    make_pdf(src / "locked.pdf", [sentence_lines(21, 4)], encrypt="secret")
    bad = {
        "empty.pdf": b"",
        "truncated.pdf": whole[: len(whole) // 2],
        "locked.pdf": (src / "locked.pdf").read_bytes(),
        "notes.pdf": b"Dear team,\nthis is a plain text file with a .pdf name.\n" * 20,
        "photo.png": b"\x89PNG\r\n\x1a\n" + b"\x00" * 40,  # a PNG that stops after its header
    }
    expected = {"empty.pdf": "empty", "truncated.pdf": "truncated", "locked.pdf": "encrypted",
                "notes.pdf": "unsupported_format", "photo.png": "truncated"}
    with Daemon(tmp_path / "d") as d:
        d.start()
        for name, data in bad.items():
            (d.inbox / name).write_bytes(data)
        for name in expected:
            wait_for(lambda n=name: (d.failed / f"{n}.error.json").exists(), 60,
                     f"{name} in failed/")
        drop(good, d.inbox / "good.pdf")
        wait_for(lambda: (d.outbox / "good.md").exists(), 60, "good.md after the bad files")
        assert d.proc is not None and d.proc.poll() is None
        # what `ocrd status --json` says meanwhile: whole numbers, ISO 8601 times
        status = json.loads(subprocess.run(
            [*ocrd_command(), "status", "--json", "-c", str(d.config_path)],
            capture_output=True, text=True, check=True, env=ocrd_env()).stdout)
        live = status["daemon"]
        assert live["ready"] is True and live["files_ok_since_start"] == 1 and \
            live["files_failed_since_start"] == 5, live
        assert all(type(v) is int for k, v in live.items() if k != "ready"), live
        assert status["counts"] == {"done": 1, "failed": 5}
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", f["finished"])
                   for f in status["recent_failures"]), status["recent_failures"]

    for name, reason in expected.items():
        err = json.loads((d.failed / f"{name}.error.json").read_text())
        assert err["reason"] == reason, (name, err)
        assert len(err["message"]) > 10 and "b'" not in err["message"]
        assert (d.failed / name).read_bytes() == bad[name]  # the original, untouched
    assert "qpdf --decrypt" in json.loads((d.failed / "locked.pdf.error.json").read_text())[
        "message"]
    assert files_under(d.outbox) == ["good.json", "good.md"]


def test_a_file_ocrd_may_not_read_lands_in_failed_as_unreadable(tmp_path: Path) -> None:
    """A file the daemon's user has no permission to read (a scanner's account wrote it
    with mode 0600, say) is claimed by rename — the inbox folder is ocrd's — and ends in
    failed/ as `unreadable` with a message that says what to check; the original is
    kept as it was and the next file converts. A subfolder of a recursive inbox that
    ocrd may not enter is reported (scan_error, naming it) and passed over. `ocrd
    convert` exits 3 for the file."""
    prefix = without_read_override()
    src = tmp_path / "src"
    src.mkdir()
    good = make_pdf(src / "good.pdf", [sentence_lines(22, 4)])
    secret = make_pdf(src / "secret.pdf", [sentence_lines(23, 4)])
    data = secret.read_bytes()
    secret.chmod(0)
    r = subprocess.run([*prefix, "cat", str(secret)], capture_output=True)
    assert r.returncode != 0, "the prefix must take the right to read it away"
    root = tmp_path / "d"
    private = root / "inbox" / "private"
    private.mkdir(parents=True)
    private.chmod(0)
    inbox = {"path": str(root / "inbox"), "outbox": str(root / "outbox"),
             "failed": str(root / "failed"), "on_success": "delete", "recursive": True,
             "quiet_seconds": 1.0}
    with Daemon(root, inboxes=[inbox], prefix=prefix) as d:
        d.start()
        wait_for(lambda: d.event("scan_error"), 30, "scan_error for the private folder")
        assert d.event("scan_error")["folder"] == str(private)
        os.rename(secret, d.inbox / "secret.pdf")
        wait_for(lambda: (d.failed / "secret.pdf.error.json").exists(), 60,
                 "secret.pdf in failed/")
        drop(good, d.inbox / "good.pdf")
        wait_for(lambda: (d.outbox / "good.md").exists(), 60, "good.md after it")
        assert d.proc is not None and d.proc.poll() is None
    err = json.loads((d.failed / "secret.pdf.error.json").read_text())
    assert err["reason"] == "unreadable", err
    assert "permission" in err["message"] and "mode" in err["message"]
    kept = d.failed / "secret.pdf"
    assert kept.stat().st_mode & 0o777 == 0
    kept.chmod(0o600)
    assert kept.read_bytes() == data
    assert files_under(d.outbox) == ["good.json", "good.md"]
    kept.chmod(0)
    private.chmod(0o700)  # pytest's clean-up
    r = subprocess.run([*prefix, *ocrd_command(), "convert", str(kept), "-o",
                        str(tmp_path / "out"), "--engine", "tesseract"],
                       capture_output=True, text=True, timeout=120, env=ocrd_env())
    assert r.returncode == 3 and "unreadable" in r.stderr, (r.returncode, r.stderr)


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*ocrd_command(), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env=ocrd_env())


def test_check_config_names_the_bad_key_and_the_missing_inbox(tmp_path: Path) -> None:
    for folder in ("in", "out", "failed"):
        (tmp_path / folder).mkdir()
    typo = tmp_path / "typo.yaml"
    typo.write_text(f"""
state_dir: {tmp_path}/state
inboxes:
  - path: {tmp_path}/in
    outbox: {tmp_path}/out
    failed: {tmp_path}/failed
    on_success: delete
    quiet_secnds: 3
""")
    r = run_cli("check-config", "-c", str(typo))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "inboxes[0].quiet_secnds" in lines[0] and "3" in lines[0]

    missing = tmp_path / "missing.yaml"
    missing.write_text(f"""
state_dir: {tmp_path}/state
inboxes:
  - path: {tmp_path}/nowhere
    outbox: {tmp_path}/out
    failed: {tmp_path}/failed
    on_success: keep
""")
    r = run_cli("check-config", "-c", str(missing))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "inboxes[0].path" in lines[0] and f"{tmp_path}/nowhere" in lines[0]
    assert "does not exist" in lines[0]

    bad_value = tmp_path / "bad.yaml"
    bad_value.write_text(f"state_dir: {tmp_path}/s\nengine: {{kind: gpu}}\n")
    r = run_cli("check-config", "-c", str(bad_value))
    assert r.returncode == 2 and "engine.kind" in r.stderr and "'gpu'" in r.stderr


def test_convert_exit_codes(tmp_path: Path) -> None:
    good = make_pdf(tmp_path / "good.pdf", [sentence_lines(30, 4)])
    locked = make_pdf(tmp_path / "locked.pdf", [sentence_lines(31, 2)], encrypt="pw")
    junk = tmp_path / "junk.pdf"
    junk.write_text("not a pdf at all")
    out = tmp_path / "out"
    r = run_cli("convert", str(good), "-o", str(out), "--engine", "tesseract")
    assert r.returncode == 0, r.stderr
    assert recall(sentence_lines(30, 4), (out / "good.md").read_text()) >= 0.95
    r = run_cli("convert", str(locked), "-o", str(out), "--engine", "tesseract")
    assert r.returncode == 4 and "encrypted" in r.stderr
    r = run_cli("convert", str(junk), "-o", str(out), "--engine", "tesseract")
    assert r.returncode == 3 and "unsupported_format" in r.stderr
    r = run_cli("convert", str(good), str(junk), str(locked), "-o", str(out),
                "--engine", "tesseract")
    assert r.returncode == 1
    # the same document again replaces its own result instead of making good-2.md
    assert sorted(p.name for p in out.iterdir()) == ["good.json", "good.md"]


def test_subfolders_mirrored_keep_delete_modes_and_non_regular_entries(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    a = make_pdf(src / "a.pdf", [sentence_lines(40, 3)])
    b = make_pdf(src / "b.pdf", [sentence_lines(41, 3)])
    root = tmp_path / "d"
    keep_in, del_in = root / "keep-in", root / "del-in"
    keep_in.mkdir(parents=True)
    del_in.mkdir(parents=True)
    outside = tmp_path / "outside.pdf"
    outside.write_bytes(a.read_bytes())
    inboxes = [
        {"path": str(keep_in), "outbox": str(root / "out-keep"), "failed": str(root / "f"),
         "on_success": "keep", "recursive": True, "quiet_seconds": 0.5,
         "file_mode": "0640", "dir_mode": "0750"},
        {"path": str(del_in), "outbox": str(root / "out-del"), "failed": str(root / "f2"),
         "on_success": "delete", "quiet_seconds": 0.5},
    ]
    with Daemon(root, inboxes=inboxes) as d:
        d.start()
        (keep_in / "2024" / "March").mkdir(parents=True)
        drop(a, keep_in / "2024" / "March" / "a.pdf")
        drop(b, del_in / "b.pdf")
        (keep_in / "link.pdf").symlink_to(outside)
        os.mkfifo(keep_in / "pipe.pdf")
        out_a = root / "out-keep" / "2024" / "March" / "a.md"
        wait_for(out_a.exists, 60, "mirrored a.md")
        wait_for((root / "out-del" / "b.md").exists, 60, "b.md")
        wait_for(lambda: (root / "f" / "pipe.pdf.error.json").exists(), 30, "fifo rejected")
        wait_for(lambda: (root / "f" / "link.pdf.error.json").exists(), 30, "link rejected")
        # kept originals stay where they were and are not converted again on rescans
        time.sleep(6)  # > rescan_seconds
        assert (keep_in / "2024" / "March" / "a.pdf").read_bytes() == a.read_bytes()
        assert [e["file"] for e in d.events("file_claimed")].count("2024/March/a.pdf") == 1
        # ... unless they change
        drop(b, keep_in / "2024" / "March" / "a.pdf")
        wait_for(lambda: len([e for e in d.events("file_claimed")
                              if e["file"] == "2024/March/a.pdf"]) == 2, 30, "re-conversion")
    assert not (del_in / "b.pdf").exists()
    assert oct(out_a.stat().st_mode & 0o777) == "0o640"
    assert oct(out_a.parent.stat().st_mode & 0o777) == "0o750"
    assert outside.read_bytes() == a.read_bytes()  # the link target was never touched
    assert (root / "f" / "link.pdf").is_symlink()
    err = json.loads((root / "f" / "link.pdf.error.json").read_text())
    assert err["reason"] == "not_a_regular_file"
    assert files_under(root / "out-keep") == ["2024/March/a.json", "2024/March/a.md"]
