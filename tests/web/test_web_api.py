"""The console's JSON API and pages over a laid-out state folder, through the real
server: filters and their validation, one file's facts with its sidecar, the status
(the daemon's part null when it does not answer), the OpenAPI description."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from console_site import build


@pytest.fixture
def site(tmp_path: Path):
    s = build(tmp_path)
    yield s
    s.stop()


def test_files_lists_filters_and_pages(site) -> None:
    every = site.json("/api/files")
    assert every["total"] == 6 and [f["id"] for f in every["files"]] == [6, 5, 4, 3, 2, 1]
    assert [f["id"] for f in site.json("/api/files?state=failed")["files"]] == [4, 2]
    assert [f["id"] for f in site.json("/api/files?q=REPORT")["files"]] == [5, 1]
    inbox_b = site.cfg.inboxes[1].path
    assert [f["id"] for f in site.json(f"/api/files?inbox={inbox_b}")["files"]] == [3]
    page = site.json("/api/files?limit=2&offset=2")
    assert page["total"] == 6 and [f["id"] for f in page["files"]] == [4, 3]
    for bad in ("state=nope", "limit=0", "limit=501", "offset=-1", "limit=x"):
        assert site.get(f"/api/files?{bad}")[0] == 400, bad


def test_one_file_has_journal_facts_and_sidecar(site) -> None:
    body = site.json(f"/api/files/{site.ids['done']}")
    assert body["file"]["state"] == "done" and body["file"]["pages"] == 2
    assert body["sidecar"]["engine"]["kind"] == "tesseract"
    assert body["links"]["markdown"].endswith("/download/md")
    failed = site.json(f"/api/files/{site.ids['failed']}")
    assert failed["file"]["reason"] == "unsupported_format" and failed["sidecar"] is None


def test_status_without_a_daemon_and_the_pages(site) -> None:
    status = site.json("/api/status")
    assert status["daemon"] is None  # no LiveStatus: as when the daemon's loop is stuck
    assert status["counts"] == {"done": 4, "failed": 2}
    assert len(status["csrf"]) == 64
    code, _, html = site.get("/")
    assert code == 200 and b"The daemon does not answer" in html
    code, _, html = site.get(f"/files/{site.ids['done']}")
    assert b"The quarterly report says hello." in html
    # the blank page first, marked, then page 1 with its figure in place
    assert html.index(b'id="page-2"') < html.index(b'id="page-1"')
    assert b"blank: the engine returned no text" in html
    assert f'src="/files/{site.ids["done"]}/assets/p0001-1.png"'.encode() in html
    assert b"sub/broken.pdf" in site.get("/failed")[2]
    assert b"unsupported_format" in site.get("/failed?reason=unsupported_format")[2]


def test_openapi_describes_the_api(site) -> None:
    spec = site.json("/api/openapi.json")
    assert spec["openapi"].startswith("3.")
    assert {"/api/status", "/api/files", "/api/files/{id}", "/api/files/{id}/retry"} <= \
        set(spec["paths"])
    assert "post" in spec["paths"]["/api/files/{id}/retry"]
    assert all(path.startswith("/api/") for path in spec["paths"])  # not the pages


def test_review_speaks_the_engines_words_rounds_durations_and_names_the_zone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tesseract page reads words (not tokens, no 'stop'); durations are rounded for a
    person; times say which zone they are in (the server's: here Europe/Berlin)."""
    import json
    import time

    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    site = build(tmp_path)
    try:
        sidecar = site.cfg.inboxes[0].outbox / "sub" / "report.json"
        meta = json.loads(sidecar.read_text())
        meta["timings"]["seconds"] = 2.9104
        meta["pages"][0].update(tokens=64, finish_reason="stop", engine_seconds=2.4567)
        sidecar.write_text(json.dumps(meta))
        code, _, body = site.get(f"/files/{site.ids['done']}")
        html = body.decode()
        assert code == 200
        facts = " | ".join(re.findall(r'<span class="muted page-facts">(.*?)</span>', html))
        assert "64 words" in facts and "token" not in facts and "stop" not in facts
        assert "2.5 s" in html and "2.4567" not in html
        assert "<dd>2.9 s</dd>" in html and "2.9104" not in html
        assert re.search(r"<dt>claimed</dt><dd>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d CES?T</dd>", html)

        meta["engine"] = {"kind": "vllm", "model": "deepseek-ai/DeepSeek-OCR-2"}
        meta["pages"][0].update(tokens=812, finish_reason="length", attempts=2,
                                engine_seconds=75.2)
        sidecar.write_text(json.dumps(meta))
        html = site.get(f"/files/{site.ids['done']}")[2].decode()
        assert "812 tokens · 2 attempts · cut at the length limit · 1 min 15 s" in html
    finally:
        site.stop()
        monkeypatch.delenv("TZ")
        time.tzset()
