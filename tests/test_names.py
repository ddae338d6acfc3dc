"""ocrd/names.py and the places a name leaves Python: names are bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from PIL import Image

from ocrd import names
from ocrd.outputs import destinations
from ocrd.outputs.markdown import grounding_to_markdown
from ocrd.work.journal import Journal

BAD = os.fsdecode(b"caf\xe9 \xff.pdf")


def test_shown_is_readable_and_valid_utf8() -> None:
    assert names.shown(BAD) == "caf\\xe9 \\xff.pdf"
    assert names.shown("résumé.pdf") == "résumé.pdf"
    names.shown(BAD).encode("utf-8")


def test_json_bytes_is_valid_utf8_and_reads_back_the_same_name() -> None:
    data = names.json_bytes({"path": BAD, "ok": "résumé"})
    text = data.decode("utf-8")  # strict: valid UTF-8
    assert json.loads(text) == {"path": BAD, "ok": "résumé"}


def test_journal_stores_and_finds_names_that_are_not_utf8(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite3")
    job = j.begin_claim("/in", BAD, "/in/.ocrd-work/x/1/" + BAD, 10, 20)
    j.claimed(job)
    j.done(job, "/out/" + BAD, BAD)
    got = j.get(job)
    assert got is not None and got.relpath == BAD and got.output == "/out/" + BAD
    assert j.is_kept("/in", BAD, 10, 20)
    assert not j.is_kept("/in", "caf\\xe9 \\xff.pdf", 10, 20)
    # UTF-8 names stay TEXT (what older journals hold, and readable in sqlite3).
    plain = j.begin_claim("/in", "plain.pdf", "", 1, 1)
    kind = j.db.execute("SELECT typeof(relpath) FROM jobs WHERE id=?", (plain,)).fetchone()
    assert kind == ("text",)
    j.close()


def test_fit_name_shortens_names_that_are_not_utf8_by_bytes() -> None:
    long_bad = os.fsdecode(b"\xff" * 300)
    fitted = destinations.fit_name(long_bad, ".md")
    assert names.nbytes(fitted) <= destinations.NAME_MAX
    assert os.fsencode(fitted).startswith(b"\xff" * 100) and fitted.endswith(".md")
    # A UTF-8 name is cut at a character boundary, never into escaped bytes.
    fitted = destinations.fit_name("é" * 200, ".md")
    assert names.utf8(fitted) and names.nbytes(fitted) <= destinations.NAME_MAX


def test_asset_links_of_a_name_that_is_not_utf8_are_percent_escaped() -> None:
    img = Image.new("RGB", (100, 100), "white")
    out = grounding_to_markdown("<|ref|>image<|/ref|><|det|>[[10, 10, 500, 500]]<|/det|>",
                                img, 1, os.fsdecode(b"caf\xe9.assets"))
    assert "caf%E9.assets/" in out.markdown, out.markdown
    out.markdown.encode("utf-8")
