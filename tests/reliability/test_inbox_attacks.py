"""What a hostile or merely unlucky inbox user can do, done to a running daemon: links in
folder components, entries swapped while ocrd checks them, claimed files replaced in the
work area, folders named like outputs, a user's file named like ocrd's error file, files
planted in the work area, names at the length limit. Each case: the daemon lives on,
nothing outside its folders is read, moved or written, and no file is lost or replaced."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest
from helpers import (
    Daemon,
    claimed_files,
    drop,
    files_under,
    make_pdf,
    recall,
    sentence_lines,
    wait_for,
)
from simulated_engines import SIMULATED

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]

SECRET = ["Confidential salary ledger", "Never leaves its folder"]


def secret_folder(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A folder outside every configured one, with a PDF the attacker wants converted."""
    outside = tmp_path / "outside"
    outside.mkdir()
    make_pdf(outside / "secret.pdf", [SECRET])
    return outside, {p.name: p.read_bytes() for p in outside.iterdir()}


def assert_untouched(outside: Path, before: dict[str, bytes], d: Daemon) -> None:
    """The outside folder is as it was, and nothing ocrd wrote came from it: no sidecar
    names the secret's content (whatever the engine), no Markdown holds its words."""
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before
    secrets = {hashlib.sha256(data).hexdigest() for data in before.values()}
    for side in d.outbox.rglob("*.json"):
        assert json.loads(side.read_text())["source"]["sha256"] not in secrets, side
    for md in d.outbox.rglob("*.md"):
        assert recall(SECRET, md.read_text()) < 0.5, f"{md} holds the secret"


def test_a_subfolder_replaced_by_a_link_is_not_followed(tmp_path: Path) -> None:
    """sub/secret.pdf is seen in a recursive inbox; then `sub` is replaced by a link to
    a folder outside that holds a secret.pdf: when the candidate comes due, ocrd must not
    reach the outside file through the link (old code moved it into the archive)."""
    outside, before = secret_folder(tmp_path)
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(1, 3)])
    with Daemon(tmp_path / "d", rescan_seconds=600) as d:
        # inotify, no rescan meanwhile: the candidate stays tracked while `sub` changes
        box = d.config["inboxes"][0]
        box.update(recursive=True, quiet_seconds=3.0, watch="inotify")
        d.start()
        (d.inbox / "sub").mkdir()
        # written but not closed yet: seen, not due before the quiet period
        with open(d.inbox / "sub" / "secret.pdf", "wb") as f:
            f.write(src.read_bytes())
            f.flush()
            wait_for(lambda: d.metric("ocrd_candidates") == 1, 10, "the file seen")
            (d.inbox / "sub" / "secret.pdf").rename(tmp_path / "moved-away.pdf")
        (d.inbox / "sub").rmdir()
        (d.inbox / "sub").symlink_to(outside)
        wait_for(lambda: (d.failed / "sub.error.json").exists(), 60, "the link rejected")
        # and the candidate seen inside `sub` settled too (forgotten, or claimed)
        wait_for(lambda: d.metric("ocrd_candidates") == 0, 60, "no candidate left")
        assert d.proc.poll() is None
        err = json.loads((d.failed / "sub.error.json").read_text())
        assert err["reason"] == "not_a_regular_file"
        assert (d.failed / "sub").is_symlink()  # the link itself, not its target
    assert_untouched(outside, before, d)
    assert not (d.archive / "sub").exists() and not (d.outbox / "sub").exists()


def test_swapping_a_pdf_for_a_link_during_the_check_never_reaches_outside(
        tmp_path: Path) -> None:
    """A loop swaps inbox/x.pdf between a real PDF and a link to the secret, as fast as
    it can, while the daemon checks and claims it (the race window is milliseconds)."""
    outside, before = secret_folder(tmp_path)
    good = make_pdf(tmp_path / "good.pdf", [sentence_lines(2, 3)]).read_bytes()
    stop = threading.Event()
    with Daemon(tmp_path / "d", engine={"kind": SIMULATED, "options": {"instant": True}},
                render={"dpi": 36}) as d:
        d.config["inboxes"][0]["quiet_seconds"] = 0.0
        d.start()
        staging = d.inbox / ".staging"  # a dot-folder: ignored by ocrd
        staging.mkdir()

        def swap() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                pdf, link = staging / f"p{n}", staging / f"l{n}"
                pdf.write_bytes(good)
                link.symlink_to(outside / "secret.pdf")
                os.rename(pdf, d.inbox / f"x{n % 4}.pdf")
                time.sleep(0.001 * (n % 5))
                os.rename(link, d.inbox / f"x{n % 4}.pdf")
                time.sleep(0.001 * (n % 3))

        t = threading.Thread(target=swap, daemon=True)
        t.start()
        time.sleep(20)
        stop.set()
        t.join()
        for p in d.inbox.glob("x*.pdf"):
            p.unlink(missing_ok=True)  # or claimed by the daemon meanwhile
        wait_for(lambda: not claimed_files(d.inbox), 60, "every claim settled")
        assert d.proc.poll() is None
        claimed = len(d.events("file_claimed"))
        converted = len(d.events("file_converted"))
        assert claimed > 20, f"only {claimed} claims: the race was not exercised"
    assert_untouched(outside, before, d)
    # Every link that was claimed ended in failed/ as a link; every PDF converted.
    for err in d.failed.glob("*.error.json"):
        assert json.loads(err.read_text())["reason"] == "not_a_regular_file", err
    links = [p for p in d.failed.iterdir() if p.is_symlink()]
    assert converted + len(links) == claimed, (converted, len(links), claimed)


def test_a_claimed_file_replaced_by_a_link_in_the_work_area_is_not_converted(
        tmp_path: Path) -> None:
    outside, before = secret_folder(tmp_path)
    with Daemon(tmp_path / "d", engine={"kind": SIMULATED, "options": {
            "max_batch": 1, "step_seconds": 0.05, "decode_steps": 20, "decode_jitter": 0}},
            schedule={"max_active_documents": 1, "pages_in_flight": 1}) as d:
        d.start()
        slow = make_pdf(tmp_path / "slow.pdf", [sentence_lines(i, 2) for i in range(6)])
        drop(slow, d.inbox / "slow.pdf")
        wait_for(lambda: d.events("page_done") or d.events("file_claimed"), 30, "slow.pdf")
        drop(make_pdf(tmp_path / "q.pdf", [sentence_lines(3, 2)]), d.inbox / "q.pdf")
        queued = wait_for(lambda: [f for f in claimed_files(d.inbox) if f.endswith("q.pdf")],
                          30, "q.pdf claimed and queued")[0]
        claim = d.inbox / ".ocrd-work" / queued
        claim.unlink()
        claim.symlink_to(outside / "secret.pdf")
        wait_for(lambda: (d.failed / "q.pdf.error.json").exists(), 60, "q.pdf failed")
        err = json.loads((d.failed / "q.pdf.error.json").read_text())
        assert err["reason"] == "not_a_regular_file", err
        assert (d.outbox / "slow.md").exists() or wait_for(
            lambda: (d.outbox / "slow.md").exists(), 60, "slow.md")
        assert d.proc.poll() is None
    assert_untouched(outside, before, d)
    assert not (d.outbox / "q.md").exists()


def test_folders_named_like_outputs_block_nothing(tmp_path: Path) -> None:
    """x.md (a PDF of that name) converts to outbox/x.md; then a folder x.md/ with a
    file: its Markdown goes to outbox/x.md-2/. A PDF named `sub` is archived as
    archive/sub; then sub/y.pdf: its original goes to archive/sub-2/. The inbox never
    stalls, and a restart has nothing left to trip on."""
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(4, 2)])
    with Daemon(tmp_path / "d") as d:
        d.config["inboxes"][0]["recursive"] = True
        d.start()
        drop(src, d.inbox / "x.md")
        drop(src, d.inbox / "sub")
        wait_for(lambda: (d.archive / "sub").is_file() and (d.outbox / "x.md").is_file(),
                 60, "x.md and sub converted")
        (d.inbox / "x.md").mkdir()
        drop(make_pdf(tmp_path / "y.pdf", [sentence_lines(5, 2)]), d.inbox / "x.md" / "y.pdf")
        (d.inbox / "sub").mkdir()
        drop(make_pdf(tmp_path / "z.pdf", [sentence_lines(6, 2)]), d.inbox / "sub" / "z.pdf")
        for i in range(5):  # later files are not held up
            drop(src, d.inbox / f"later{i}.pdf")
        wait_for(lambda: (d.outbox / "x.md-2" / "y.md").exists() and
                 (d.archive / "sub-2" / "z.pdf").exists() and
                 all((d.outbox / f"later{i}.md").exists() for i in range(5)), 90,
                 "every file converted")
        assert not d.events("output_unwritable")
        d.stop()
        d.start()  # nothing left half-done for recovery to trip on
        assert d.proc.poll() is None
    assert (d.outbox / "x.md").is_file() and (d.archive / "sub").is_file()


def test_a_users_file_named_like_an_error_file_is_never_replaced(tmp_path: Path) -> None:
    with Daemon(tmp_path / "d") as d:
        d.start()
        (d.inbox / "x.pdf.error.json").write_bytes(b"my own notes, not JSON at all")
        wait_for(lambda: (d.failed / "x.pdf.error.json").exists(), 60, "the user's file")
        (d.inbox / "x.pdf").write_bytes(b"not a PDF either")
        wait_for(lambda: len(d.events("file_failed")) == 2, 60, "x.pdf failed")
    assert (d.failed / "x.pdf.error.json").read_bytes() == b"my own notes, not JSON at all"
    assert (d.failed / "x-2.pdf").read_bytes() == b"not a PDF either"
    err = json.loads((d.failed / "x-2.pdf.error.json").read_text())
    assert err["reason"] == "unsupported_format" and err["source"]["path"] == "x.pdf"


def test_files_planted_in_the_work_area_go_to_failed_not_beside_the_outbox(
        tmp_path: Path) -> None:
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(7, 2)])
    with Daemon(tmp_path / "d") as d:
        d.start()
        drop(src, d.inbox / "first.pdf")
        wait_for(lambda: (d.outbox / "first.md").exists(), 60, "first.md")
        d.stop()
        area = next(p for p in (d.inbox / ".ocrd-work").iterdir() if p.is_dir())
        (area / "planted.pdf").write_bytes(src.read_bytes())  # no job folder
        (area / "notajob").mkdir()
        (area / "notajob" / "deep.pdf").write_bytes(src.read_bytes())
        before = {p.name for p in tmp_path.iterdir()}
        d.start()
        wait_for(lambda: (d.failed / "planted.pdf.error.json").exists() and
                 (d.failed / "notajob.error.json").exists(), 60, "planted files failed")
        err = json.loads((d.failed / "planted.pdf.error.json").read_text())
        assert err["reason"] == "not_claimed", err
        assert (d.failed / "notajob" / "deep.pdf").exists()
        assert claimed_files(d.inbox) == []
    assert {p.name for p in tmp_path.iterdir()} == before  # nothing beside the folders
    assert files_under(d.outbox) == ["first.json", "first.md"]


def test_a_long_legal_name_keeps_its_name(tmp_path: Path) -> None:
    """A 244-byte name: the archived original keeps it exactly, and NAME.md (241 + 3
    bytes) is not shortened either."""
    name = "n" * 240 + ".pdf"
    src = make_pdf(tmp_path / "a.pdf", [sentence_lines(8, 2)])
    with Daemon(tmp_path / "d") as d:
        d.start()
        drop(src, d.inbox / name)
        wait_for(lambda: (d.archive / name).exists(), 60, "archived under its own name")
    assert (d.outbox / ("n" * 240 + ".md")).exists()
    assert (d.outbox / ("n" * 240 + ".json")).exists()
