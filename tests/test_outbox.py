"""Outbox: paths stay inside their roots, writes are atomic, names never collide."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ocrd import outbox
from ocrd.outbox import Perms, Reservations, UnsafePath, fit_name, safe_join


@pytest.mark.parametrize("rel", ["../x.md", "/etc/passwd", "a/../../x", "", "a//b/../.."])
def test_safe_join_refuses_escapes(tmp_path: Path, rel: str) -> None:
    with pytest.raises(UnsafePath):
        safe_join(tmp_path, rel)


def test_safe_join_keeps_odd_but_harmless_names(tmp_path: Path) -> None:
    for rel in ["-rf x.pdf", "line\nbreak.pdf", "ünïcödé/名前.pdf", " spaced .pdf", "..x.pdf"]:
        p = safe_join(tmp_path, rel)
        assert str(p).startswith(str(tmp_path) + "/")


def test_fit_name_respects_the_name_limit() -> None:
    stem = "ä" * 200  # 400 bytes
    name = fit_name(stem, ".error.json", reserve=40)
    assert len(name.encode()) <= 255 - 40 and name.endswith(".error.json")
    assert fit_name(stem, ".md") != fit_name("ä" * 199 + "b", ".md")  # hash keeps them apart
    assert fit_name("short", ".md") == "short.md"


def test_write_atomic_sets_mode_and_leaves_no_temporaries(tmp_path: Path) -> None:
    target = tmp_path / "a.md"
    outbox.write_atomic(target, b"one", Perms(0o640))
    outbox.write_atomic(target, b"two", Perms(0o640))
    assert target.read_bytes() == b"two"
    assert oct(target.stat().st_mode & 0o777) == "0o640"
    assert os.listdir(tmp_path) == ["a.md"]


def test_reservations_never_overwrite_another_documents_results(tmp_path: Path) -> None:
    res = Reservations()
    a = res.choose(tmp_path, "scan", "sha-a", "scan.pdf")
    b = res.choose(tmp_path, "scan", "sha-b", "scan.png")  # written at the same time
    assert (a.name, b.name) == ("scan", "scan-2")
    res.release(a)
    res.release(b)
    (tmp_path / "scan.md").write_text("x")
    (tmp_path / "scan.json").write_text(json.dumps({"source": {"sha256": "sha-a",
                                                              "path": "scan.pdf"}}))
    # the same document again replaces its own results
    assert res.choose(tmp_path, "scan", "sha-a", "scan.pdf").name == "scan"
    # a different document with the same name does not
    assert res.choose(tmp_path, "scan", "sha-c", "scan.pdf").name == "scan-2"


def test_move_unique_never_replaces(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "x.pdf").write_text("old")
    src = tmp_path / "x.pdf"
    src.write_text("new")
    moved = outbox.move_unique(src, dest, "x.pdf")
    assert moved.name == "x-2.pdf" and moved.read_text() == "new"
    assert (dest / "x.pdf").read_text() == "old" and not src.exists()


def test_move_file_moves_a_symlink_itself_not_its_target(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("do not touch")
    link = tmp_path / "link.pdf"
    link.symlink_to(secret)
    dest = tmp_path / "failed"
    dest.mkdir()
    moved = outbox.move_unique(link, dest, "link.pdf")
    assert moved.is_symlink() and secret.read_text() == "do not touch"


def test_sweep_removes_only_this_daemons_temporaries(tmp_path: Path) -> None:
    mine = Perms(tag="aaaa").tmp_name("x.md")
    theirs = Perms(tag="bbbb").tmp_name("x.md")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / mine).write_text("partial")
    (tmp_path / theirs).write_text("someone else's write in progress")
    (tmp_path / "keep.md").write_text("result")
    assert outbox.sweep_temporaries(tmp_path, "aaaa") == 1
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        [theirs, "keep.md"])


def test_makedirs_refuses_to_leave_its_root(tmp_path: Path) -> None:
    from pathlib import PurePosixPath

    with pytest.raises(UnsafePath):
        outbox.makedirs(tmp_path / "out", PurePosixPath("a/../../escape"), Perms())
    assert not (tmp_path / "escape").exists()
    made = outbox.makedirs(tmp_path / "out", PurePosixPath("2024/March"), Perms())
    assert made == tmp_path / "out" / "2024" / "March" and made.is_dir()
