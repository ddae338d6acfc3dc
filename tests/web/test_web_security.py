"""The console's defences, against the real server (uvicorn on 127.0.0.1): no URL reaches
a file except through a journal row and the folders configured for its inbox; a token
off loopback (or whenever one is set); POST-only actions with a CSRF token; a Host check
against DNS rebinding; a Content-Security-Policy on every answer."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlencode

import pytest
import yaml
from console_site import build, token_file, write_preview

from ocrd.config.settings import ConfigError, WebConfig
from ocrd.web.auth import CSP, load_token

TRAVERSALS = [
    "/files/../../etc/passwd",
    "/files/%2e%2e/%2e%2e/etc/passwd",
    "/files/..%2f..%2fetc%2fpasswd",
    "/files/{done}/assets/..%2f..%2f..%2f..%2fetc%2fpasswd",
    "/files/{done}/assets/%2e%2e",
    "/files/{done}/assets/../report.md",
    "/files/{done}/download/..%2f..%2fetc%2fpasswd",
    "/files/{done}/download/%2e%2e",
    "/files/{done}/pages/..%2f1.jpg",
    "/files/{done}/pages/-1.jpg",
    "/static/../../../../etc/passwd",
    "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/static/..%2f..%2fconfig.py",
    "/api/files/../../../etc/passwd",
    "//etc/passwd",
]


@pytest.fixture
def site(tmp_path: Path):
    s = build(tmp_path)
    yield s
    s.stop()


def test_traversal_urls_are_refused(site) -> None:
    secret = Path("/etc/passwd").read_bytes()[:20]
    for raw in TRAVERSALS:
        path = raw.format(**site.ids)
        status, _, body = site.get(path)
        assert status == 404, (path, status, body[:100])
        assert secret not in body and b"ocrd.config.settings" not in body, path


def test_files_of_a_row_are_served_only_through_the_row(site) -> None:
    done = site.ids["done"]
    status, headers, body = site.get(f"/files/{done}/download/md")
    assert status == 200 and b"The quarterly report says hello." in body
    assert site.get(f"/files/{done}/download/json")[0] == 200
    assert site.get(f"/files/{done}/download/original")[2].startswith(b"%PDF-1.4 pretend")
    assert site.get(f"/files/{done}/assets/p0001-1.png")[1]["content-type"] == "image/png"
    # a figure the sidecar does not list is not served, even when the file exists
    assets = site.cfg.inboxes[0].outbox / "sub" / "report.assets"
    (assets / "extra.png").write_bytes(b"x")
    assert site.get(f"/files/{done}/assets/extra.png")[0] == 404
    assert site.get(f"/files/{done}/pages/1.jpg")[0] == 404  # no preview written yet
    write_preview(site, 1)
    assert site.get(f"/files/{done}/pages/1.jpg")[0] == 200
    assert site.get("/files/999999")[0] == 404
    assert site.get("/files/999999/download/md")[0] == 404


def test_rows_of_other_inboxes_serve_nothing(site) -> None:
    # a row whose inbox is no longer configured
    for gone in (site.ids["unknown_inbox"], site.ids["unknown_inbox_done"]):
        for path in (f"/files/{gone}", f"/api/files/{gone}", f"/files/{gone}/download/md",
                     f"/files/{gone}/download/json", f"/files/{gone}/download/original",
                     f"/files/{gone}/assets/p0001-1.png", f"/files/{gone}/pages/1.jpg"):
            assert site.get(path)[0] == 404, path
    # a row of inbox a whose output lies in inbox b's outbox: not a's folder, refused
    cross = site.ids["cross"]
    for kind in ("md", "json", "original"):
        assert site.get(f"/files/{cross}/download/{kind}")[0] == 404, kind
    # b's own row serves its own file
    assert b"Inbox b's own words." in site.get(
        f"/files/{site.ids['other_inbox']}/download/md")[2]


def test_a_symlink_in_the_outbox_is_not_followed(site, tmp_path: Path) -> None:
    out = site.cfg.inboxes[0].outbox / "sub"
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    (out / "report.md").unlink()
    os.symlink(secret, out / "report.md")
    status, _, body = site.get(f"/files/{site.ids['done']}/download/md")
    assert status == 404 and b"top secret" not in body
    # a linked folder on the way is refused too
    (out / "report.assets" / "p0001-1.png").unlink()
    os.rmdir(out / "report.assets")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "p0001-1.png").write_text("top secret")
    os.symlink(tmp_path / "elsewhere", out / "report.assets")
    status, _, body = site.get(f"/files/{site.ids['done']}/assets/p0001-1.png")
    assert status == 404 and b"top secret" not in body


ABSURD_IDS = ["99999999999999999999", str(2**63), str(2**64), "1" * 300]


def test_absurd_ids_and_offsets_are_refused_without_a_traceback(
        site, caplog: pytest.LogCaptureFixture) -> None:
    """Ids past SQLite's 64 bits name no row: 404, as any unknown id; offsets past them
    are a bad number (400). Nothing reaches the log."""
    caplog.set_level(logging.INFO)
    csrf = {"X-CSRF-Token": site.json("/api/status")["csrf"]}
    for big in ABSURD_IDS:
        for path in (f"/files/{big}", f"/api/files/{big}", f"/files/{big}/download/md",
                     f"/files/{big}/open/original", f"/files/{big}/assets/p0001-1.png",
                     f"/files/{big}/pages/1.jpg", f"/files/{big}/pages/1"):
            assert site.get(path)[0] == 404, path
        for path in (f"/api/files/{big}/retry", f"/api/files/{big}/dismiss"):
            assert site.request("POST", path, headers=csrf)[0] == 409, path
        for path in (f"/files/{big}/retry", f"/files/{big}/dismiss"):
            status, headers, _ = site.request("POST", path, body=b"", headers=csrf)
            assert status == 303 and headers["location"] == "/failed", path
        for path in (f"/api/files?offset={big}", f"/api/search?q=hello&offset={big}"):
            assert site.get(path)[0] == 400, path
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert loud == [], [r.getMessage() for r in loud]


def test_every_answer_has_the_security_headers(site) -> None:
    for path in ("/", "/files", "/failed", f"/files/{site.ids['done']}", "/api/status",
                 "/nope", "/static/console.js"):
        _, headers, _ = site.get(path)
        assert headers["content-security-policy"] == CSP, path
        assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"


def test_a_foreign_host_name_is_refused_on_loopback(site) -> None:
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 must not read us."""
    assert site.get("/api/status", Host="evil.example:9465")[0] == 421
    assert site.get("/api/status", Host="localhost")[0] == 200
    assert site.get("/api/status", Host="[::1]:9465")[0] == 200


def test_retry_needs_post_and_the_csrf_token(site) -> None:
    failed = site.ids["failed"]
    original = site.cfg.inboxes[0].failed / "sub" / "broken.pdf"
    put_back = site.cfg.inboxes[0].path / "sub" / "broken.pdf"
    assert site.get(f"/files/{failed}/retry")[0] == 405
    assert site.get(f"/api/files/{failed}/retry")[0] == 405
    for headers, body in (({}, b""), ({}, b"csrf=wrong"),
                          ({"X-CSRF-Token": "wrong"}, None)):
        status, _, _ = site.request("POST", f"/files/{failed}/retry", body=body or b"",
                                    headers=headers)
        assert status == 403
        status, _, _ = site.request("POST", f"/api/files/{failed}/retry", headers=headers)
        assert status == 403
    assert original.exists() and not put_back.exists()
    csrf = site.json("/api/status")["csrf"]
    # unsupported_format: the same file fails the same way, unless the cause is gone
    status, headers, _ = site.request("POST", f"/files/{failed}/retry",
                                      body=urlencode({"csrf": csrf}).encode())
    assert status == 303 and headers["location"] == "/failed" and original.exists()
    status, headers, _ = site.request("POST", f"/files/{failed}/retry",
                                      body=urlencode({"csrf": csrf, "cause_gone": "1"}).encode())
    assert status == 303 and headers["location"] == "/failed"  # the message: in a cookie
    assert put_back.read_bytes() == b"junk" and not original.exists()
    assert site.json(f"/api/files/{failed}")["file"]["state"] == "retried"


def test_with_a_token_everything_but_healthz_needs_it(tmp_path: Path) -> None:
    token = "s3cret-token-0123456789"
    site = build(tmp_path, web={"token_file": str(token_file(tmp_path, token))})
    try:
        done = site.ids["done"]
        assert site.get("/healthz")[0] == 200
        assert site.get("/api/status")[0] == 401
        assert site.get(f"/api/files/{done}")[0] == 401
        assert site.get(f"/files/{done}/download/md")[0] == 303  # to /login
        status, headers, _ = site.get("/")
        assert status == 303 and headers["location"] == "/login"
        assert site.get("/api/status", Authorization="Bearer wrong-token-0123456789")[0] == 401
        assert site.get("/api/status", Authorization=f"Bearer {token}")[0] == 200
        # a browser signs in once and gets a cookie (not the token itself)
        status, _, _ = site.request("POST", "/login", body=b"token=wrong")
        assert status == 403
        status, headers, _ = site.request("POST", "/login",
                                          body=urlencode({"token": token}).encode())
        assert status == 303
        cookie = headers["set-cookie"].split(";")[0]
        assert token not in cookie and "HttpOnly" in headers["set-cookie"]
        assert "SameSite=strict" in headers["set-cookie"]
        assert site.get(f"/files/{done}", Cookie=cookie)[0] == 200
        # scripts with the bearer token may act without a CSRF token; a cookie may not
        failed = site.ids["failed"]
        assert site.request("POST", f"/api/files/{failed}/retry",
                            headers={"Cookie": cookie})[0] == 403
        assert site.request("POST", f"/api/files/{failed}/retry?cause_gone=1",
                            headers={"Authorization": f"Bearer {token}"})[0] == 200
    finally:
        site.stop()


def test_off_loopback_without_a_token_is_refused() -> None:
    for listen in ("0.0.0.0:9465", "192.0.2.7:9465", "[::]:9465"):
        with pytest.raises(ValueError, match="not a loopback address"):
            WebConfig(listen=listen)
    with pytest.raises(ValueError, match="not an IP address"):  # names are not guessed
        WebConfig(listen="nas.local:9465", token_file=Path("t"))
    for listen in ("127.0.0.1:9465", "127.0.0.5:1", "[::1]:9465", "localhost:9465"):
        assert WebConfig(listen=listen).loopback


def test_a_missing_or_weak_token_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        load_token(WebConfig(listen="0.0.0.0:1", token_file=tmp_path / "nope"))
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(ConfigError, match="at least 16"):
        load_token(WebConfig(listen="0.0.0.0:1", token_file=short))


def test_token_from_systemd_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "ocrd-web-token").write_text("from-load-credential-0123\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    cfg = WebConfig(listen="0.0.0.0:1", token_file=Path("ocrd-web-token"))
    assert load_token(cfg) == "from-load-credential-0123"


@pytest.mark.e2e
def test_ocrd_run_and_check_config_refuse_without_a_token(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    # metrics off: the default port may be taken by another daemon on this machine
    config = {"state_dir": str(tmp_path / "state"), "engine": {"kind": "tesseract"},
              "web": {"listen": "0.0.0.0:0"}, "metrics": {"listen": None},
              "inboxes": [{"path": str(tmp_path / "in"), "outbox": str(tmp_path / "out"),
                           "failed": str(tmp_path / "failed"), "on_success": "delete"}]}
    path = tmp_path / "c.yaml"

    def refused(words: list[str]) -> None:
        path.write_text(yaml.safe_dump(config))
        for command in ("check-config", "run"):
            proc = subprocess.run([sys.executable, "-m", "ocrd", command, "-c", str(path)],
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 2, (command, proc.stderr)
            for word in words:
                assert word in proc.stderr, (command, proc.stderr)

    refused(["web.listen = '0.0.0.0:0': not a loopback", "web.token_file"])
    config["web"] = {"listen": "0.0.0.0:0", "token_file": str(tmp_path / "missing")}
    refused(["web.token_file", "cannot be read"])
