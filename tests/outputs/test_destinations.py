"""Outbox and safefs: paths stay inside their roots and never through a link, writes are
atomic, names never collide, nothing ocrd did not write is replaced."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ocrd import safefs
from ocrd.outputs import destinations
from ocrd.outputs.destinations import Perms, Reservations, fit_name
from ocrd.safefs import Blocked, Dir


def d(path: Path) -> Dir:
    path.mkdir(parents=True, exist_ok=True)
    return Dir.open_root(path)


@pytest.mark.parametrize("rel", ["../x.md", "/etc/passwd", "a/../../x", "", "a//b/../.."])
def test_split_refuses_escapes(rel: str) -> None:
    with pytest.raises(ValueError):
        safefs.split(rel)


def test_split_keeps_odd_but_harmless_names() -> None:
    for rel in ["-rf x.pdf", "line\nbreak.pdf", "ünïcödé/名前.pdf", " spaced .pdf", "..x.pdf"]:
        dirs, name = safefs.split(rel)
        assert "/".join((*dirs, name)) == rel


def test_fit_name_respects_the_name_limit() -> None:
    stem = "ä" * 200  # 400 bytes
    name = fit_name(stem, ".error.json", reserve=40)
    assert len(name.encode()) <= 255 - 40 and name.endswith(".error.json")
    assert fit_name(stem, ".md") != fit_name("ä" * 199 + "b", ".md")  # hash keeps them apart
    assert fit_name("short", ".md") == "short.md"


def test_write_atomic_sets_mode_and_leaves_no_temporaries(tmp_path: Path) -> None:
    with d(tmp_path) as folder:
        destinations.write_atomic(folder, "a.md", b"one", Perms(0o640))
        destinations.write_atomic(folder, "a.md", b"two", Perms(0o640))
        with pytest.raises(FileExistsError):
            destinations.write_atomic(folder, "a.md", b"three", Perms(0o640), replace=False)
    assert (tmp_path / "a.md").read_bytes() == b"two"
    assert oct((tmp_path / "a.md").stat().st_mode & 0o777) == "0o640"
    assert os.listdir(tmp_path) == ["a.md"]


def test_reservations_never_overwrite_another_documents_results(tmp_path: Path) -> None:
    res = Reservations()
    with d(tmp_path) as folder:
        a = res.choose(folder, "scan", "sha-a", "scan.pdf")
        b = res.choose(folder, "scan", "sha-b", "scan.png")  # written at the same time
        assert (a, b) == ("scan", "scan-2")
        res.release(folder, a)
        res.release(folder, b)
        (tmp_path / "scan.md").write_text("x")
        (tmp_path / "scan.json").write_text(json.dumps({"source": {"sha256": "sha-a",
                                                                  "path": "scan.pdf"}}))
        # the same document again replaces its own results
        assert res.choose(folder, "scan", "sha-a", "scan.pdf") == "scan"
        # a different document with the same name does not
        assert res.choose(folder, "scan", "sha-c", "scan.pdf") == "scan-2"
        # a folder (or a link) where ocrd writes NAME.md is someone else's
        (tmp_path / "other.md").mkdir()
        (tmp_path / "other.json").write_text(json.dumps({"source": {"sha256": "s",
                                                                   "path": "other.pdf"}}))
        assert res.choose(folder, "other", "s", "other.pdf") == "other-2"


def test_move_unique_never_replaces(tmp_path: Path) -> None:
    with d(tmp_path / "dest") as dest, d(tmp_path / "src") as src:
        (tmp_path / "dest" / "x.pdf").write_text("old")
        (tmp_path / "src" / "x.pdf").write_text("new")
        moved = destinations.move_unique(src, "x.pdf", dest, "x.pdf")
    assert moved == "x-2.pdf" and (tmp_path / "dest" / moved).read_text() == "new"
    assert (tmp_path / "dest" / "x.pdf").read_text() == "old"
    assert not (tmp_path / "src" / "x.pdf").exists()


def test_move_unique_keeps_a_users_error_json_apart(tmp_path: Path) -> None:
    """A user's file named x.pdf.error.json is in failed/: when x.pdf fails, the pair
    becomes x-2.pdf + x-2.pdf.error.json, and the user's file is untouched."""
    with d(tmp_path / "failed") as failed, d(tmp_path / "work") as work:
        (tmp_path / "failed" / "x.pdf.error.json").write_text("the user's own")
        (tmp_path / "work" / "x.pdf").write_text("doc")
        name = destinations.move_unique(work, "x.pdf", failed, "x.pdf",
                                  siblings=(destinations.ERROR_SUFFIX,))
        written = destinations.write_error(failed, name, b"{}", Perms())
    assert (name, written) == ("x-2.pdf", "x-2.pdf.error.json")
    assert (tmp_path / "failed" / "x.pdf.error.json").read_text() == "the user's own"


def test_write_error_never_replaces(tmp_path: Path) -> None:
    with d(tmp_path) as folder:
        (tmp_path / "x.pdf.error.json").write_text("the user's own")
        assert destinations.write_error(folder, "x.pdf", b"{}", Perms()) == "x.pdf.error-2.json"
    assert (tmp_path / "x.pdf.error.json").read_text() == "the user's own"


def test_move_file_moves_a_symlink_itself_not_its_target(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("do not touch")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "link.pdf").symlink_to(secret)
    with d(tmp_path / "in") as src, d(tmp_path / "failed") as dest:
        moved = destinations.move_unique(src, "link.pdf", dest, "link.pdf")
    assert (tmp_path / "failed" / moved).is_symlink()
    assert secret.read_text() == "do not touch"


def test_sweep_removes_only_this_daemons_temporaries(tmp_path: Path) -> None:
    mine = Perms(tag="aaaa").tmp_name("x.md")
    theirs = Perms(tag="bbbb").tmp_name("x.md")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / mine).write_text("partial")
    (tmp_path / theirs).write_text("someone else's write in progress")
    (tmp_path / "keep.md").write_text("result")
    outside = tmp_path.parent / (tmp_path.name + "-outside")
    outside.mkdir()
    (outside / mine).write_text("not under the root")
    (tmp_path / "link").symlink_to(outside)
    assert destinations.sweep_temporaries(tmp_path, "aaaa") == 1
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        [theirs, "keep.md"])
    assert (outside / mine).exists()  # never through the link


def test_mirror_never_leaves_its_root_nor_follows_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    with d(tmp_path / "out") as root:
        with pytest.raises(ValueError):
            destinations.mirror(root, ("a", "..", "..", "escape"), Perms())
        made, used = destinations.mirror(root, ("2024", "March"), Perms())
        with made:
            assert used == ("2024", "March")
        assert (tmp_path / "out" / "2024" / "March").is_dir()
        # a link where a subfolder goes is not followed: the next free name is used
        (tmp_path / "out" / "sub").symlink_to(outside)
        made, used = destinations.mirror(root, ("sub", "x"), Perms())
        made.close()
    assert used == ("sub-2", "x") and not (outside / "x").exists()


def test_mirror_takes_the_next_name_where_a_file_has_the_folders_name(tmp_path: Path) -> None:
    """An inbox file named `x.md` converted to outbox/x.md; then a folder `x.md/` in the
    inbox: its files go to outbox/x.md-2/, nothing is blocked or replaced."""
    (tmp_path / "x.md").write_text("an earlier result")
    (tmp_path / "x.md-2").write_text("another file")
    with d(tmp_path) as root:
        made, used = destinations.mirror(root, ("x.md",), Perms())
        made.close()
        made, again = destinations.mirror(root, ("x.md",), Perms())
        made.close()
    assert used == again == ("x.md-3",)
    assert (tmp_path / "x.md").read_text() == "an earlier result"


def test_walk_refuses_a_link_in_any_component(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (tmp_path / "in" / "a").mkdir(parents=True)
    (tmp_path / "in" / "a" / "b").symlink_to(outside)
    with d(tmp_path / "in") as root:
        with pytest.raises(Blocked):
            root.walk(("a", "b", "deep"))
        with root.walk(("a",)) as a, pytest.raises(OSError):
            a.open_file("b")
