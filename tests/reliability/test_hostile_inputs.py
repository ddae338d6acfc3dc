"""Everything a person, a phone or a scanner can put into a folder. Each file ends
converted or in failed/ with a reason; the daemon never crashes or hangs; nothing is
written outside the configured folders."""

from __future__ import annotations

import io
import json
import os
import socket
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from helpers import Daemon, claimed_files, make_pdf, sentence_lines, text_image, wait_for
from PIL import Image

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]


def snapshot(root: Path, skip: set[Path]) -> dict[str, tuple[int, int]]:
    out = {}
    for folder, dirs, files in os.walk(root):
        if Path(folder) in skip:
            dirs[:] = []
            continue
        for name in files:
            p = Path(folder) / name
            st = p.lstat()
            out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


def hostile_files(src: Path) -> dict[str, bytes | None]:
    """name → content (None: made specially below). Expected outcome is decided by the
    test: converted if it is a readable document, else failed with a reason."""
    good = make_pdf(src / "good.pdf", [sentence_lines(50, 3)]).read_bytes()
    png = src / "p.png"
    text_image(sentence_lines(51, 3)).save(png)
    files: dict[str, bytes | None] = {
        "empty.pdf": b"",
        "truncated.pdf": good[: len(good) // 3],
        "text named.pdf": b"just text\n" * 50,
        "image.pdf": png.read_bytes(),  # a PNG with a .pdf name: converted by content
        "doc.png": good,  # a PDF with a .png name
        "garbage.jpg": os.urandom(5000),
        "html.pdf": b"<html><body>404 Not Found</body></html>",
        "zip.pdf": b"PK\x03\x04" + os.urandom(200),
        "spaces  in   name.pdf": good,
        unicodedata.normalize("NFC", "résumé.pdf"): good,
        unicodedata.normalize("NFD", "naïve.pdf"): good,
        "new\nline.pdf": good,
        "-rf --leading-dash.pdf": good,
        ("x" * 251) + ".pdf": good,  # a 255-byte name
        "日本語の文書.pdf": good,
        "semi;colon $(touch pwned) `id`.pdf": good,
    }
    return files


def drop_image(img: Image.Image, path: Path, **params: Any) -> None:
    """Encoded first, then written in one go: Pillow writes its file as the encoder's
    output comes, and a 12000×12000 bomb deflates to a few KB that reach the file only at
    the end — a 0-byte file for as long as the encoding takes, which on a busy machine
    outlasted the test's incomplete_seconds and was (rightly) failed as empty."""
    buf = io.BytesIO()
    img.save(buf, format=Image.registered_extensions()[path.suffix.lower()], **params)
    path.write_bytes(buf.getvalue())


def make_images(inbox: Path) -> list[str]:
    names = []
    base = text_image(sentence_lines(52, 2), (600, 300))
    variants = {
        "cmyk.jpg": base.convert("CMYK"),
        "alpha.png": base.convert("RGBA"),
        "palette.png": base.convert("P"),
        "gray16.png": base.convert("I").point(lambda v: v * 256).convert("I;16"),
        "thin.png": Image.new("L", (20000, 3), 255),
        "long.png": Image.new("L", (3, 20000), 255),
        "tiny.png": Image.new("RGB", (1, 1), "white"),
    }
    for name, img in variants.items():
        drop_image(img, inbox / name)
        names.append(name)
    frames = [base.convert("P"), base.convert("L").convert("P")]
    drop_image(frames[0], inbox / "animated.gif", save_all=True, append_images=frames[1:],
               duration=100, loop=0)
    drop_image(frames[0].convert("RGB"), inbox / "multi.tif", save_all=True,
               append_images=[frames[1].convert("RGB")])
    names += ["animated.gif", "multi.tif"]
    return names


def test_hostile_and_careless_input(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    root = tmp_path / "d"
    outside_dir = tmp_path / "outside"
    outside_dir.mkdir()
    secret = outside_dir / "secret.pdf"
    secret.write_bytes(make_pdf(src / "s.pdf", [["secret"]]).read_bytes())
    with Daemon(root, limits={"max_pixels": 50_000_000, "max_pages": 50}) as d:
        d.config["inboxes"][0]["incomplete_seconds"] = 3
        files = hostile_files(src)
        d.start()
        before = snapshot(tmp_path, {root})
        for name, data in files.items():
            (d.inbox / name).write_bytes(data or b"")
        names = list(files) + make_images(d.inbox)
        # decompression bomb: a small PNG that claims to be huge
        drop_image(Image.new("1", (12000, 12000), 1), d.inbox / "bomb.png", optimize=True)
        names.append("bomb.png")
        (d.inbox / "link-out.pdf").symlink_to(secret)
        (d.inbox / "link-dir.pdf").symlink_to(outside_dir)
        (d.inbox / "dangling.pdf").symlink_to(tmp_path / "nothing-here")
        os.mkfifo(d.inbox / "fifo.pdf")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(d.inbox / "socket.pdf"))
        (d.inbox / "folder.pdf").mkdir()
        names += ["link-out.pdf", "link-dir.pdf", "dangling.pdf", "fifo.pdf", "socket.pdf"]

        def settled() -> bool:
            left = {p.name for p in d.inbox.iterdir()} - {".ocrd-work", "folder.pdf"}
            return not left and d.proc.poll() is None

        wait_for(settled, 120, "every hostile file handled", every=0.5)
        wait_for(lambda: not claimed_files(d.inbox), 120,
                 "work area empty")
        assert d.proc.poll() is None, "daemon died"
        sock.close()

    outcome = {}
    for name in names:
        stem = name.rpartition(".")[0]
        md = d.outbox / (stem + ".md")
        err = d.failed / (name + ".error.json")
        if len(name.encode()) > 200:  # shortened with a hash: look it up by prefix
            mds = [p for p in d.outbox.glob("x*.md")]
            errs = [p for p in d.failed.glob("x*.error.json")]
            md = mds[0] if mds else md
            err = errs[0] if errs else err
        if md.exists():
            outcome[name] = "converted"
        elif err.exists():
            outcome[name] = json.loads(err.read_text())["reason"]
        else:
            outcome[name] = "MISSING"
    assert "MISSING" not in outcome.values(), outcome
    expect = {
        "empty.pdf": "empty", "truncated.pdf": "truncated",
        "text named.pdf": "unsupported_format", "html.pdf": "unsupported_format",
        "zip.pdf": "unsupported_format", "garbage.jpg": "unsupported_format",
        "image.pdf": "converted", "doc.png": "converted", "bomb.png": "too_large",
        "link-out.pdf": "not_a_regular_file", "link-dir.pdf": "not_a_regular_file",
        "dangling.pdf": "not_a_regular_file", "fifo.pdf": "not_a_regular_file",
        "socket.pdf": "not_a_regular_file", "multi.tif": "converted",
        "animated.gif": "converted", "cmyk.jpg": "converted", "alpha.png": "converted",
        "palette.png": "converted", "gray16.png": "converted", "thin.png": "converted",
        "long.png": "converted", "tiny.png": "converted",
    }
    for name in files:
        expect.setdefault(name, "converted")
    assert outcome == expect
    # nothing written or changed outside the daemon's folders
    assert snapshot(tmp_path, {root}) == before
    assert secret.read_bytes().startswith(b"%PDF")
    assert not (Path.cwd() / "pwned").exists() and not (tmp_path / "pwned").exists()
    # the converted names with odd characters kept their names
    assert (d.outbox / "new\nline.md").exists()
    assert (d.outbox / "-rf --leading-dash.md").exists()
    assert (d.outbox / unicodedata.normalize("NFD", "naïve.md")).exists()
    multi = json.loads((d.outbox / "multi.json").read_text())
    assert multi["page_count"] == 2
