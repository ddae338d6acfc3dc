"""Shared test helpers: documents with known text, and the daemon as a subprocess."""

from __future__ import annotations

import os
import re
import socket
import zipfile
from pathlib import Path
from typing import Any

import yaml
from daemon_process import DaemonProcess
from daemon_process import wait_for as wait_for  # the tests take it from here

from bench.corpus import recall as word_recall

WORDS = ("invoice payment customer account balance report quarter revenue "
         "shipment delivery warehouse contract signature address number total").split()


def sentence_lines(seed: int, n: int = 8) -> list[str]:
    """Deterministic lines of ordinary words, different per seed."""
    out = []
    for i in range(n):
        words = [WORDS[(seed * 7 + i * 3 + k * 5) % len(WORDS)] for k in range(7)]
        out.append(" ".join(words).capitalize() + f" {seed}{i}.")
    return out


def make_pdf(path: Path, pages: list[list[str]], encrypt: str | None = None) -> Path:
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    c = canvas.Canvas(str(path), pagesize=A4, encrypt=encrypt)
    for lines in pages:
        c.setFont("Helvetica", 13)
        y = 780
        for line in lines:
            c.drawString(60, y, line)
            y -= 22
        c.showPage()
    c.save()
    return path


def text_image(lines: list[str], size: tuple[int, int] = (1400, 700)) -> Any:
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.truetype("DejaVuSans.ttf", 30)
    y = 40
    for line in lines:
        draw.text((40, y), line, fill="black", font=font)
        y += 48
    return img


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def recall(expected: list[str], got: str) -> float:
    """Share of expected words found in the output (multiset)."""
    return word_recall(words(" ".join(expected)), words(got)) or 0.0


def without_read_override() -> list[str]:
    """A command prefix under which this user cannot read a file the file's mode denies
    it: nothing for an ordinary user; for root, setpriv dropping CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH from the bounding set (root reads everything otherwise)."""
    if os.geteuid() != 0:
        return []
    import shutil

    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to test unreadable files as root"
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon(DaemonProcess):
    """`ocrd run` as a real subprocess (daemon_process.py), with the tests' defaults: one
    inbox under root, tesseract, quick rescans, debug logs, /metrics on a free port."""

    def __init__(self, root: Path, inboxes: list[dict] | None = None,
                 engine: dict | None = None, env: dict | None = None,
                 prefix: list[str] | None = None, **top: Any) -> None:
        """`prefix`: a command that runs the daemon (e.g. setpriv with fewer
        capabilities)."""
        self.inbox = root / "inbox"
        self.outbox = root / "outbox"
        self.failed = root / "failed"
        self.archive = root / "archive"
        self.inbox.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config = {
            "state_dir": str(root / "state"),
            "rescan_seconds": 5,
            "poll_seconds": 0.5,
            "engine": engine or {"kind": "tesseract"},
            "metrics": {"listen": f"127.0.0.1:{self.port}"},
            # the console off unless a test asks for it (web=...): daemons of tests run
            # side by side must not meet on its default port
            "web": {"listen": None},
            "log": {"level": "debug", "format": "json"},
            "inboxes": inboxes or [{
                "path": str(self.inbox), "outbox": str(self.outbox),
                "failed": str(self.failed), "archive": str(self.archive),
                "quiet_seconds": 1.0, "incomplete_seconds": 4.0,
            }],
            **top,
        }
        super().__init__(root, config, env=env, prefix=prefix)

    def write_config(self) -> None:
        """The config, and the destination folders of each inbox that does not say
        whether ocrd may create them (`create_folders`): made here, as an admin makes
        them (ocrd creates a missing one only when the config says so)."""
        for box in self.config.get("inboxes") or []:
            if "create_folders" not in box:
                for key in ("outbox", "failed", "archive"):
                    if box.get(key):  # a relative one: beside the config file
                        (self.config_path.parent / box[key]).mkdir(parents=True,
                                                                   exist_ok=True)
        super().write_config()

    def start(self, wait_ready: bool = True, timeout: float = 60,
              systemd: dict[str, str] | None = None) -> Daemon:
        super().start(wait_ready, timeout, systemd)
        return self

    def metric(self, name: str) -> float | None:
        """One unlabelled sample of the daemon's /metrics (None if not there)."""
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                        timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def __enter__(self) -> Daemon:
        return self


def drop(src: Path, dest: Path) -> Path:
    """Put a finished file into an inbox the way a careful writer does: write under a
    temporary name, then rename."""
    tmp = dest.with_name(dest.name + ".part")
    tmp.write_bytes(src.read_bytes() if isinstance(src, Path) else src)
    os.rename(tmp, dest)
    return dest


def files_under(root: Path) -> list[str]:
    if not root.exists():
        return []
    # os.walk, not rglob: a daemon removing folders meanwhile must not break the walk
    out = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            p = Path(folder) / name
            if p.is_file():
                out.append(str(p.relative_to(root)))
    return sorted(out)


def claimed_files(inbox: Path) -> list[str]:
    """Claimed files in an inbox's work areas (.ocrd-work/<instance>/<job>/…), without
    the owner mark each work area carries (.ocrd-work/<instance>/.owner)."""
    work = inbox / ".ocrd-work"
    return [f for f in files_under(work) if not (f.count("/") == 1 and f.endswith("/.owner"))]


def fill(folder: Path) -> Path:
    """Fill the filesystem holding folder; returns the filler file (remove it to free)."""
    filler = folder / "filler.bin"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def write_config(root: Path, **top: object) -> Path:
    for folder in ("inbox", "outbox", "failed"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    cfg = {"state_dir": str(root / "state"), "engine": {"kind": "tesseract"},
           "metrics": {"listen": f"127.0.0.1:{free_port()}"},
           "log": {"format": "json"},
           "inboxes": [{"path": str(root / "inbox"), "outbox": str(root / "outbox"),
                        "failed": str(root / "failed"), "on_success": "delete"}], **top}
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def office_open_xml(path: Path, part: str) -> Path:
    """A package as Word/Excel/PowerPoint write one: content types, relationships, the
    main part under word/, xl/ or ppt/, document properties last."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", '<?xml version="1.0"?><Types xmlns="http://'
                   'schemas.openxmlformats.org/package/2006/content-types"/>')
        z.writestr("_rels/.rels", "<Relationships/>")
        z.writestr(f"{part}/document.xml", "<document>" + "words " * 2000 + "</document>")
        z.writestr("docProps/app.xml", "<Properties/>")
    return path
