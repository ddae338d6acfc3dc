"""A console over a state folder laid out as the daemon leaves it: a journal written with
the journal's own methods, outputs and failed originals where the daemon puts them. The
console then runs for real (uvicorn on its thread, on 127.0.0.1) in the test process."""

from __future__ import annotations

import http.client
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ocrd import names
from ocrd.config.load import parse_config
from ocrd.config.settings import Config
from ocrd.web import Console
from ocrd.work.journal import Journal

SHA = "ab" * 32


@dataclass
class Site:
    root: Path
    cfg: Config
    ids: dict[str, int] = field(default_factory=dict)
    console: Console | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self.console is not None and self.console.address is not None
        host, _, port = self.console.address.rpartition(":")
        return host, int(port)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One HTTP request with the path sent exactly as given (no normalisation)."""
        host, port = self.address
        conn = http.client.HTTPConnection(host, port, timeout=10)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            sent = {"Host": f"127.0.0.1:{port}", **(headers or {})}
            if body is not None:
                sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
                sent["Content-Length"] = str(len(body))
            for k, v in sent.items():
                conn.putheader(k, v)
            conn.endheaders(body)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def get(self, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
        return self.request("GET", path, headers=headers)

    def json(self, path: str, **headers: str) -> Any:
        status, _, body = self.get(path, **headers)
        assert status == 200, (path, status, body[:200])
        return json.loads(body)

    def stop(self) -> None:
        if self.console is not None:
            self.console.stop()


def build(root: Path, web: dict | None = None, start: bool = True) -> Site:
    """Two inboxes (a, b), each with outbox/failed/archive; in the journal: a converted
    file of `a` (with figure, previews, archived original), a failed file of `a`, a
    converted file of `b`, a failed and a converted row of an inbox no longer
    configured, and a row of `a` whose output points into `b`'s outbox."""
    inboxes = []
    for name in ("a", "b"):
        base = root / name
        for sub in ("inbox", "out", "failed", "archive"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        inboxes.append({"path": str(base / "inbox"), "outbox": str(base / "out"),
                        "failed": str(base / "failed"), "archive": str(base / "archive"),
                        "recursive": True})
    cfg = parse_config({"state_dir": str(root / "state"), "inboxes": inboxes,
                        "web": {"listen": "127.0.0.1:0", **(web or {})}}, root)
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    site = Site(root, cfg)
    journal = Journal(cfg.state_dir / "journal.sqlite3")
    a, b = cfg.inboxes
    site.ids["done"] = _done(journal, a, "sub/report.pdf", "The quarterly report says hello.")
    site.ids["failed"] = _failed(journal, a, "sub/broken.pdf", b"junk", "unsupported_format",
                                 "not a PDF or a supported image")
    site.ids["other_inbox"] = _done(journal, b, "theirs.pdf", "Inbox b's own words.")
    gone = journal.begin_claim(str(root / "gone" / "inbox"), "old.pdf", "", 10, 1)
    journal.claimed(gone)
    journal.failed(gone, "engine_failed", "the engine failed", str(root / "gone" / "x.pdf"))
    site.ids["unknown_inbox"] = gone
    # converted once from an inbox since removed, its output now a's (a real file)
    gone_done = journal.begin_claim(str(root / "gone" / "inbox"), "sub/report.pdf", "", 10, 1)
    journal.claimed(gone_done)
    journal.done(gone_done, str(a.outbox / "sub" / "report.md"), None, pages=2, degraded=0)
    site.ids["unknown_inbox_done"] = gone_done
    cross = journal.begin_claim(str(a.path), "cross.pdf", "", 10, 1)
    journal.claimed(cross)
    journal.done(cross, str(b.outbox / "theirs.md"), None, pages=1, degraded=0)
    site.ids["cross"] = cross
    journal.close()
    if start:
        site.console = Console.start(cfg, None)
    return site


def _done(journal: Journal, box: Any, relpath: str, text: str) -> int:
    original = b"%PDF-1.4 pretend original " + relpath.encode()
    job = journal.begin_claim(str(box.path), relpath, "", len(original), 1)
    journal.claimed(job)
    journal.start(job)
    rel = Path(relpath)
    out = box.outbox / rel.parent
    out.mkdir(parents=True, exist_ok=True)
    stem = rel.stem
    (out / f"{stem}.assets").mkdir(exist_ok=True)
    (out / f"{stem}.assets" / "p0001-1.png").write_bytes(_png())
    md = (f"<!-- page 1 -->\n\n{text}\n\n![]({stem}.assets/p0001-1.png)\n\n"
          "<!-- page 2 (blank) -->\n")
    (out / f"{stem}.md").write_text(md)
    meta = {"source": {"path": relpath, "inbox": str(box.path), "sha256": SHA,
                       "format": "PDF", "renderer": "pypdfium2", "size": len(original)},
            "engine": {"kind": "tesseract", "model": "tesseract:eng"}, "page_count": 2,
            "status": "ok", "degraded_pages": [],
            "outputs": {"markdown": f"{stem}.md", "assets": f"{stem}.assets"},
            "timings": {"seconds": 1.5},
            "pages": [{"page": 1, "status": "ok", "tokens": 12, "attempts": 1,
                       "figures": ["p0001-1.png"]},
                      {"page": 2, "status": "blank", "tokens": 0, "attempts": 1,
                       "figures": []}]}
    (out / f"{stem}.json").write_bytes(names.json_bytes(meta))
    archive = box.archive / rel.parent
    archive.mkdir(parents=True, exist_ok=True)
    (archive / rel.name).write_bytes(original)
    journal.done(job, str(out / f"{stem}.md"), None, pages=2, degraded=0)
    return job


def _failed(journal: Journal, box: Any, relpath: str, data: bytes, reason: str,
            message: str) -> int:
    job = journal.begin_claim(str(box.path), relpath, "", len(data), 1)
    journal.claimed(job)
    dest = box.failed / relpath
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    dest.with_name(dest.name + ".error.json").write_text(
        json.dumps({"reason": reason, "message": message}))
    journal.failed(job, reason, message, str(dest))
    return job


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buf, "PNG")
    return buf.getvalue()


def write_preview(site: Site, page: int) -> Path:
    folder = site.cfg.state_dir / "previews" / SHA[:2] / SHA
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"p{page:04d}.jpg"
    path.write_bytes(b"\xff\xd8 pretend jpeg")
    return path


def token_file(root: Path, token: str = "s3cret-token-0123456789") -> Path:
    path = root / "token"
    path.write_text(token + "\n")
    os.chmod(path, 0o600)
    return path
