"""The daemon short of something that is not the file's: file descriptors (its
RLIMIT_NOFILE reached), or space in the outbox for a while. No file fails for it and
no output is lost: the work waits, and resumes when the shortage ends. Real limits
(prlimit on the running daemon) and a real full filesystem (the tiny_fs tmpfs)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import (
    Daemon,
    claimed_files,
    drop,
    files_under,
    fill,
    make_pdf,
    sentence_lines,
    wait_for,
)
from PIL import Image
from simulated_engines import SIMULATED

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]


def open_fds(pid: int) -> set[int]:
    return {int(n) for n in os.listdir(f"/proc/{pid}/fd")}


def nofile(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no 'Max open files' in /proc/PID/limits")


def set_nofile(pid: int, soft: int, hard: int) -> None:
    subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={soft}:{hard}"], check=True)


def test_no_descriptor_to_spare_fails_no_file(tmp_path: Path) -> None:
    """The daemon's descriptor table is full while one file converts and another waits
    in the queue, long enough for several tries: neither fails nor loses its name (the
    old code counted EMFILE as the file's own fault: plain names after three tries,
    `output_failed` after six, `unreadable: Too many open files` when opening the
    claimed file); once descriptors are free again, both convert."""
    names = {"report a.pdf": 6, "report b.pdf": 1}
    pdfs = {name: make_pdf(tmp_path / f"src{i}.pdf",
                           [sentence_lines(i * 5 + p, 3) for p in range(n)])
            for i, (name, n) in enumerate(names.items())}
    d = Daemon(tmp_path / "d", engine={"kind": SIMULATED,
                                       "options": {"decode_steps": 150,
                                                     "step_seconds": 0.02}},
               render={"dpi": 36}, schedule={"max_active_documents": 1})
    d.config["inboxes"][0].update(quiet_seconds=0.2, on_success="delete")
    with d:
        d.start()
        drop(pdfs["report a.pdf"], d.inbox / "report a.pdf")
        wait_for(lambda: d.event("file_claimed"), 30, "report a.pdf claimed")
        drop(pdfs["report b.pdf"], d.inbox / "report b.pdf")
        wait_for(lambda: len(d.events("file_claimed")) == 2, 30, "report b.pdf claimed")
        assert not (d.outbox / "report a.md").exists()  # still converting
        soft, hard = nofile(d.pid)

        def no_descriptor_to_spare() -> bool:
            """The soft limit at the lowest free descriptor number, again and again
            (what the daemon closes would otherwise be free for its next open)."""
            used = open_fds(d.pid)
            set_nofile(d.pid, min(set(range(len(used) + 1)) - used), hard)
            tries = sum(e.get("file") == "report a.pdf" and "Too many open files" in
                        str(e.get("error")) for e in d.events())
            return tries >= 3 or bool(files_under(d.failed))

        wait_for(no_descriptor_to_spare, 120, "three tries of the converting file")
        set_nofile(d.pid, soft, hard)
        wait_for(lambda: all((d.outbox / n.replace(".pdf", ".md")).exists() for n in names)
                 or files_under(d.failed), 180, "both converted (or one failed)")
        assert files_under(d.failed) == [], (files_under(d.failed), d.events("file_failed"))
        assert d.proc.poll() is None
        assert d.events("file_failed") == []
        assert "Too many open files" in d.events("resources_short")[0]["error"]
        wait_for(lambda: claimed_files(d.inbox) == [], 30, "nothing left claimed")
    assert sorted(files_under(d.outbox)) == ["report a.json", "report a.md",
                                             "report b.json", "report b.md"]
    for name, n in names.items():
        meta = json.loads((d.outbox / name.replace(".pdf", ".json")).read_text())
        assert meta["page_count"] == n and meta["status"] == "ok"


def scan_pdf(path: Path, seed: int) -> Path:
    """A one-page PDF carrying a photo-like JPEG of ~50 KB (its searchable copy does not
    fit into the space the test leaves in the outbox; its Markdown does; the three
    files' outputs fit into the whole 256 KiB)."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    photo = path.with_suffix(".jpg")
    Image.frombytes("RGB", (240, 240), os.urandom(240 * 240 * 3)).save(photo, quality=90)
    c = canvas.Canvas(str(path), pagesize=A4)
    c.drawImage(str(photo), 60, 300, 360, 360)
    c.setFont("Helvetica", 13)
    for k, line in enumerate(sentence_lines(seed, 3)):
        c.drawString(60, 780 - 22 * k, line)
    c.showPage()
    c.save()
    return path


def test_a_briefly_full_outbox_costs_no_searchable_pdf(tmp_path: Path, tiny_fs: Path) -> None:
    """outputs: [markdown, pdf], and the outbox too full for the PDFs (but not for the
    Markdown) for a while: every file waits and gets both outputs, under its own name
    (waiting is no reason for plain names), and nothing is failed."""
    names = ["Scan 1 ä.pdf", "Scan 2 ö.pdf", "Scan 3.pdf"]
    srcs = [scan_pdf(tmp_path / f"src{i}.pdf", i) for i in range(len(names))]
    assert all(p.stat().st_size > 45_000 for p in srcs)
    out = tiny_fs / "out"
    out.mkdir()
    box = {"path": str(tmp_path / "d" / "inbox"), "outbox": str(out),
           "failed": str(tmp_path / "d" / "failed"), "on_success": "delete",
           "quiet_seconds": 0.3, "outputs": ["markdown", "pdf"],
           "pdf_text_layer": "add"}
    d = Daemon(tmp_path / "d", inboxes=[box], render={"dpi": 36},
               engine={"kind": SIMULATED, "options": {"instant": True}})
    filler = fill(tiny_fs)
    os.truncate(filler, filler.stat().st_size - 32 * 1024)  # room for Markdown only
    with d:
        d.start()
        for src, name in zip(srcs, names, strict=True):
            drop(src, d.inbox / name)
        # three tries each (2 + 4 + 8 s of backoff): the old code gave plain names then
        wait_for(lambda: len([e for e in d.events("output_unwritable")
                              if e["file"] == names[0]]) >= 3, 120,
                 "the full outbox met three times")
        assert d.events("output_failed") == []
        assert files_under(d.failed) == []
        filler.unlink()  # space returns
        wait_for(lambda: all((out / n.replace(".pdf", ".md")).exists() for n in names),
                 120, "every Markdown file")
    assert files_under(d.failed) == []
    for name in names:
        base = name.removesuffix(".pdf")
        meta = json.loads((out / f"{base}.json").read_text())
        assert meta["outputs"]["pdf"] == f"{base}.pdf", meta["outputs"]
        assert meta["outputs"]["pdf_failed"] is None
        assert (out / f"{base}.pdf").stat().st_size > 45_000
    assert sorted(files_under(out)) == sorted(
        f"{n.removesuffix('.pdf')}{s}" for n in names for s in (".json", ".md", ".pdf"))
