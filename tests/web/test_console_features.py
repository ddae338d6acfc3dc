"""The console's features through the real server (no browser): full-text search (the
index, its query language, CJK and Latin text), upload with hostile names, retry only
where it helps, retry-all by reason, dismiss, one-time messages that are not in the URL,
banners, waiting files in words, and the small things (favicon, readable API page,
pager jump, an unknown state answered clearly)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from console_site import build
from helpers import wait_for

from ocrd import names
from ocrd.config.load import parse_config
from ocrd.intake.readiness import Tracker
from ocrd.intake.waiting import waiting_files
from ocrd.intake.watch import Entry
from ocrd.live import InboxLive, Live
from ocrd.web.pages import banners
from ocrd.web.search import Indexer, Query, SearchIndex, plain_text, snippet
from ocrd.web.upload import UploadError, save, upload_name


@pytest.fixture
def site(tmp_path: Path):
    s = build(tmp_path)
    yield s
    s.stop()


# -- search -----------------------------------------------------------------------------------

def _index(tmp_path: Path) -> SearchIndex:
    index = SearchIndex(tmp_path / "search.sqlite3")
    index.add(1, "in", "a.md", 1.0, [
        (1, plain_text("# Rechnung\n\nHerr **Müller** bestellt eine Tonerkassette.")),
        (2, plain_text("| item | price |\n|---|---|\n| toner cartridge | 89.00 |")),
    ])
    index.add(2, "in", "b.md", 2.0, [(1, "東京都の請求書です。合計金額は一万円。"),
                                     (2, "서울 사무실 토너 주문")])
    return index


def test_search_latin_words_accents_phrases_prefixes(tmp_path: Path) -> None:
    index = _index(tmp_path)

    def found(q: str) -> list[tuple[int, int]]:
        return [(h.job_id, h.page) for h in index.search(Query.parse(q))[0]]

    assert found("toner") == [(1, 2)]
    assert found("TONER Cartridge") == [(1, 2)]
    assert found("muller") == [(1, 1)] and found("MÜLLER") == [(1, 1)]
    assert found('"toner cartridge"') == [(1, 2)]
    assert found('"cartridge toner"') == []
    assert found("toner*") == [(1, 1), (1, 2)] or found("toner*") == [(1, 2), (1, 1)]
    assert found("tonerkassette") == [(1, 1)]
    assert found("toner missing") == []
    # the query language cannot be used to break the MATCH expression
    for hostile in ('" OR *', "NEAR(", "a AND", "-toner", "toner)", "^toner", "col:toner"):
        index.search(Query.parse(hostile))
    assert Query.parse("  \" * ").match == ""


def test_search_cjk_text_by_any_run_of_characters(tmp_path: Path) -> None:
    index = _index(tmp_path)

    def found(q: str) -> list[tuple[int, int]]:
        return [(h.job_id, h.page) for h in index.search(Query.parse(q))[0]]

    assert found("東京") == [(2, 1)]  # two characters, inside 東京都
    assert found("請求書") == [(2, 1)]
    assert found("京") == [(2, 1)]  # one character
    assert found("京東") == []  # order matters: adjacent characters
    assert found("토너") == [(2, 2)]
    hit = index.search(Query.parse("合計"))[0][0]
    assert "<mark>合計</mark>" in hit.snippet


def test_snippet_marks_hits_and_escapes_the_text() -> None:
    text = "A <script>alert(1)</script> note about toner " + "x " * 200 + "end"
    out = snippet(text, Query.parse("toner").terms)
    assert "<mark>toner</mark>" in out and "<script>" not in out and "&lt;script&gt;" in out
    assert len(out) < 400


def test_a_converted_again_document_replaces_its_pages(tmp_path: Path) -> None:
    index = _index(tmp_path)
    index.add(3, "in", "a.md", 3.0, [(1, "only paper now")])
    assert index.search(Query.parse("toner"))[1] == 0
    assert [h.job_id for h in index.search(Query.parse("paper"))[0]] == [3]


def test_a_damaged_index_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "search.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    index = SearchIndex.open_or_rebuild(path)
    index.add(1, "in", "a.md", 1.0, [(1, "toner")])
    assert index.search(Query.parse("toner"))[1] == 1


def test_the_indexer_fills_the_index_and_the_console_answers(site) -> None:
    def indexed() -> bool:  # 400 "being built" until the indexer has made the index
        status, _, body = site.get("/api/search?q=quarterly")
        return status == 200 and json.loads(body)["total"] == 1

    wait_for(indexed, 30, "indexed")
    hit = site.json("/api/search?q=quarterly")["hits"][0]
    assert hit["page"] == 1 and hit["file"]["id"] == site.ids["done"]
    assert "<mark>quarterly</mark>" in hit["snippet"]
    status, _, html = site.get("/search?q=quarterly+hello")
    assert status == 200 and b"<mark>quarterly</mark>" in html and b"page 1" in html
    # the review marks the words on the page
    status, _, html = site.get(f"/files/{site.ids['done']}?q=quarterly")
    assert b"<mark>quarterly</mark>" in html
    assert site.get("/api/search?q=")[0] == 400
    assert site.get("/api/search?q=x&limit=0")[0] == 400


def _open_deleted(path: Path) -> list[str]:
    """This process's descriptors on a deleted file that was at path (or its -wal)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(path)) and target.endswith(" (deleted)"):
                out.append(target)
    return out


def test_a_deleted_index_comes_back_frees_its_space_and_every_thread_sees_it(
        tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from console_site import _done

    from ocrd.work.journal import Journal

    site = build(tmp_path)
    try:
        path = site.cfg.state_dir / "search.sqlite3"
        wait_for(lambda: site.json("/api/search?q=quarterly")["total"] == 1, 30, "indexed")
        with ThreadPoolExecutor(8) as pool:  # several console threads hold a connection
            assert all(t == 1 for t in pool.map(
                lambda _: site.json("/api/search?q=quarterly")["total"], range(32)))
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                path.with_name(path.name + suffix).unlink()
        journal = Journal(site.cfg.state_dir / "journal.sqlite3")
        _done(journal, site.cfg.inboxes[0], "later.pdf", "A zeppelin arrived afterwards.")
        journal.close()
        # within an indexer round (2 s): a new index, filled from the journal again (its
        # path exists again; its inode number may be the deleted one's, reused)
        wait_for(path.exists, 15, "the index made anew")
        wait_for(lambda: site.json("/api/search?q=zeppelin")["total"] == 1, 15,
                 "the new index filled")
        with ThreadPoolExecutor(8) as pool:
            totals = list(pool.map(lambda w: site.json(f"/api/search?q={w}")["total"],
                                   ["zeppelin", "quarterly"] * 16))
        assert totals == [1] * 32, totals
        # the deleted file is let go of: its space comes back (the indexer's round
        # closes the idle threads' connections to it)
        wait_for(lambda: not _open_deleted(path), 40, "no descriptor on the deleted index")
    finally:
        site.stop()


def test_threads_that_stay_alive_and_idle_let_go_of_a_deleted_index(tmp_path: Path) -> None:
    """Console threads that searched and then wait (alive, not searching again) hold no
    descriptor on an index file deleted meanwhile once the indexer has had a round: its
    space comes back without a restart and without waiting for them."""
    import threading

    site = build(tmp_path)
    assert site.console is not None
    store = site.console.ctx.store
    path = site.cfg.state_dir / "search.sqlite3"
    release = threading.Event()
    searched = threading.Barrier(5)

    def reader() -> None:
        assert store.search(Query.parse("quarterly"), 10, 0) is not None
        searched.wait(30)
        release.wait(60)  # alive and idle, its connection kept in its thread

    threads = [threading.Thread(target=reader) for _ in range(4)]
    try:
        wait_for(lambda: site.json("/api/search?q=quarterly")["total"] == 1, 30, "indexed")
        for t in threads:
            t.start()
        searched.wait(30)
        assert _open_deleted(path) == []
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                path.with_name(path.name + suffix).unlink()
        assert _open_deleted(path)  # the readers (and the indexer) hold it now
        wait_for(lambda: not _open_deleted(path), 20, "no descriptor on the deleted index")
        assert all(t.is_alive() for t in threads)  # let go of while alive, not by ending
    finally:
        release.set()
        for t in threads:
            t.join(30)
        site.stop()


def test_the_indexer_steps_past_rows_it_cannot_read(tmp_path: Path) -> None:
    """A done row whose Markdown is gone is skipped; the rest are indexed once."""
    from ocrd.work.journal import Job

    def job(i: int, finished: float) -> Job:
        return Job(i, "in", f"f{i}.pdf", "", 1, 1, "done", 1, output=f"f{i}.md",
                   finished=finished)

    rows = [job(1, 1.0), job(2, 2.0), job(3, 2.0), job(4, 3.0)]
    texts = {1: "<!-- page 1 -->\nalpha", 3: "<!-- page 1 -->\ngamma",
             4: "<!-- page 1 -->\ndelta\n\n<!-- page 2 -->\nepsilon"}
    indexer = Indexer(tmp_path / "s.sqlite3",
                      lambda after, n: [r for r in rows if (r.finished, r.id) > after][:n],
                      lambda j: texts.get(j.id), batch=2)
    index = SearchIndex(tmp_path / "s.sqlite3")
    while indexer.step(index):
        pass
    assert indexer.indexed == 3
    assert index.search(Query.parse("epsilon"))[0][0].page == 2
    assert index.search(Query.parse("gamma"))[1] == 1
    indexer.step(index)
    assert indexer.indexed == 3  # nothing twice


def test_the_indexer_leaves_a_nearly_full_state_folder_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index is optional: with the state folder short of space it writes nothing
    (the journal needs that space), says so once, and goes on once space is back."""
    import structlog

    from ocrd.web import search
    from ocrd.work.journal import Job

    rows = [Job(1, "in", "f1.pdf", "", 1, 1, "done", 1, output="f1.md", finished=1.0)]
    indexer = Indexer(tmp_path / "s.sqlite3", lambda after, n: [r for r in rows
                                                                if (r.finished, r.id) > after],
                      lambda j: "<!-- page 1 -->\nalpha", every=0.05)
    free = [0]
    monkeypatch.setattr(search, "free_bytes", lambda folder: free[0])
    with structlog.testing.capture_logs() as logs:
        indexer.start()
        try:
            wait_for(lambda: any(e["event"] == "search_index_paused" for e in logs), 10,
                     "the pause said")
            time.sleep(0.3)  # several turns of the loop: still nothing written, said once
            assert not (tmp_path / "s.sqlite3").exists() and indexer.indexed == 0
            assert [e["event"] for e in logs].count("search_index_paused") == 1
            free[0] = 10 * search.MIN_FREE_BYTES
            wait_for(lambda: indexer.indexed == 1, 10, "indexed once space is back")
        finally:
            indexer.stop()
    assert any(e["event"] == "search_index_resumed" for e in logs)


# -- upload -----------------------------------------------------------------------------------

def test_upload_names_are_tamed(tmp_path: Path) -> None:
    box = parse_config({"state_dir": str(tmp_path / "s"), "inboxes": [{
        "path": str(tmp_path / "in"), "outbox": str(tmp_path / "out"),
        "failed": str(tmp_path / "f"), "on_success": "delete"}]}, tmp_path).inboxes[0]
    assert upload_name("../../etc/passwd.pdf", box) == "passwd.pdf"
    assert upload_name("C:\\Users\\me\\scan.pdf", box) == "scan.pdf"
    assert upload_name("..hidden.pdf", box) == "hidden.pdf"
    assert upload_name("a\x00b\nc.pdf", box) == "abc.pdf"
    assert len(upload_name("x" * 400 + ".pdf", box).encode()) <= 200
    assert upload_name("x" * 400 + ".pdf", box).endswith(".pdf")
    for bad in ("", "..", "/", "scan.pdf.part", "~$lock.pdf", "Thumbs.db"):
        with pytest.raises(UploadError):
            upload_name(bad, box)


def test_upload_never_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    box = parse_config({"state_dir": str(tmp_path / "s"), "inboxes": [{
        "path": str(inbox), "outbox": str(tmp_path / "out"),
        "failed": str(tmp_path / "f"), "on_success": "delete"}]}, tmp_path).inboxes[0]
    (inbox / "scan.pdf").write_bytes(b"theirs")
    (tmp_path / "outside.pdf").write_bytes(b"outside")
    os.symlink(tmp_path / "outside.pdf", inbox / "link.pdf")
    assert save(box, "scan.pdf", io.BytesIO(b"%PDF-mine"), 1000) == "scan-2.pdf"
    assert save(box, "link.pdf", io.BytesIO(b"%PDF-mine"), 1000) == "link-2.pdf"
    assert (inbox / "scan.pdf").read_bytes() == b"theirs"
    assert (tmp_path / "outside.pdf").read_bytes() == b"outside"
    with pytest.raises(UploadError, match="larger"):
        save(box, "big.pdf", io.BytesIO(b"x" * 1001), 1000)
    with pytest.raises(UploadError, match="empty"):
        save(box, "nothing.pdf", io.BytesIO(b""), 1000)
    assert sorted(p.name for p in inbox.iterdir()) == ["link-2.pdf", "link.pdf", "scan-2.pdf",
                                                       "scan.pdf"]


def _multipart(fields: dict[str, str], filename: str, data: bytes) -> tuple[bytes, str]:
    boundary = "ocrdtestboundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
             .encode() for k, v in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                 f'filename="{filename}"\r\nContent-Type: application/pdf\r\n\r\n'.encode()
                 + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), \
        f"multipart/form-data; boundary={boundary}"


def test_upload_form_needs_csrf_and_writes_into_the_inbox_only(site) -> None:
    inbox = site.cfg.inboxes[0].path
    csrf = site.json("/api/status")["csrf"]
    body, ctype = _multipart({"inbox": str(inbox)}, "../../../escape.pdf", b"%PDF-1.4 x")
    assert site.request("POST", "/upload", body, {"Content-Type": ctype})[0] == 403
    body, ctype = _multipart({"csrf": csrf, "inbox": str(inbox)}, "../../../escape.pdf",
                             b"%PDF-1.4 x")
    status, headers, _ = site.request("POST", "/upload", body, {"Content-Type": ctype})
    assert status == 303 and "?" in headers["location"] and "escape" not in headers["location"]
    assert (inbox / "escape.pdf").read_bytes() == b"%PDF-1.4 x"
    assert not (site.root / "escape.pdf").exists()
    body, ctype = _multipart({"csrf": csrf, "inbox": "/etc"}, "x.pdf", b"%PDF-1.4 x")
    status, headers, _ = site.request("POST", "/upload", body, {"Content-Type": ctype})
    assert status == 303 and not Path("/etc/x.pdf").exists()


def test_an_upload_name_is_shown_by_the_one_escaping_rule(site) -> None:
    """A right-to-left override turns "invoice\u202efdp.exe" into "invoiceexe.pdf" on
    screen: an upload's name loses what names.printable escapes, and the confirmation
    shows names through printable, as every other page does."""
    inbox = site.cfg.inboxes[0].path
    csrf = site.json("/api/status")["csrf"]
    hostile = "invoice\u202efdp\u2066.pdf"
    body, ctype = _multipart({"csrf": csrf, "inbox": str(inbox)}, hostile, b"%PDF-1.4 x")
    status, headers, _ = site.request("POST", "/upload", body, {"Content-Type": ctype})
    assert status == 303 and headers["location"] == "/files?state=waiting"
    text = _flash(headers)["text"]
    assert "\u202e" not in text and "\u2066" not in text, text
    assert names.printable(text) == text
    [saved] = [p.name for p in inbox.iterdir()]
    assert saved == "invoicefdp.pdf" and saved in text
    cookie = headers["set-cookie"].split(";")[0]
    _, _, page = site.get("/files?state=waiting", Cookie=cookie)
    assert "invoicefdp.pdf" in page.decode() and "\u202e" not in page.decode()


def test_upload_larger_than_the_limit_is_refused_before_reading(tmp_path: Path) -> None:
    site = build(tmp_path, web={"upload_max_bytes": 1000})
    try:
        csrf = site.json("/api/status")["csrf"]
        body, ctype = _multipart({"csrf": csrf, "inbox": str(site.cfg.inboxes[0].path)},
                                 "big.pdf", b"x" * 200_000)
        status, headers, _ = site.request("POST", "/upload", body, {"Content-Type": ctype})
        assert status == 303 and headers["location"] == "/upload"
        assert "larger" in _flash(headers)["text"]
        assert not (site.cfg.inboxes[0].path / "big.pdf").exists()
    finally:
        site.stop()


# -- actions ---------------------------------------------------------------------------------------

def _flash(headers: dict[str, str]) -> dict:
    import base64

    cookie = headers["set-cookie"].split(";")[0]
    name, _, value = cookie.partition("=")
    assert name == "ocrd_flash"
    return json.loads(base64.urlsafe_b64decode(value.strip('"')))


def test_retry_only_where_it_helps_or_the_cause_is_gone(site) -> None:
    failed = site.ids["failed"]  # unsupported_format
    csrf = {"X-CSRF-Token": site.json("/api/status")["csrf"]}
    status, _, body = site.request("POST", f"/api/files/{failed}/retry", headers=csrf)
    assert status == 409 and b"fails the same way" in body
    facts = site.json(f"/api/files/{failed}")["file"]
    assert facts["retry_helps"] is False and "PDFs and images" in facts["cause"]
    status, _, html = site.get("/failed")
    assert b'name="cause_gone"' in html and b'aria-label="Retry sub/broken.pdf' in html
    assert site.request("POST", f"/api/files/{failed}/retry?cause_gone=1",
                        headers=csrf)[0] == 200


def test_retry_all_of_a_reason_and_dismiss(tmp_path: Path) -> None:
    from ocrd.work.journal import Journal

    site = build(tmp_path)
    try:
        box = site.cfg.inboxes[0]
        journal = Journal(site.cfg.state_dir / "journal.sqlite3")
        ids = []
        for name in ("e1.pdf", "e2.pdf", "e3.pdf"):
            job = journal.begin_claim(str(box.path), name, "", 3, 1)
            journal.claimed(job)
            (box.failed / name).write_bytes(b"pdf")
            journal.failed(job, "engine_failed", "the engine failed", str(box.failed / name))
            ids.append(job)
        journal.close()
        csrf = site.json("/api/status")["csrf"]
        status, headers, _ = site.request("POST", f"/files/{ids[0]}/dismiss",
                                          body=urlencode({"csrf": csrf}).encode())
        assert status == 303 and headers["location"] == "/failed"
        assert "dismissed" in _flash(headers)["text"]
        assert site.json(f"/api/files/{ids[0]}")["file"]["state"] == "dismissed"
        assert (box.failed / "e1.pdf").exists()
        status, headers, _ = site.request(
            "POST", "/failed/retry", body=urlencode({"csrf": csrf,
                                                     "reason": "engine_failed"}).encode())
        assert status == 303 and _flash(headers)["text"].startswith("2 file(s)")
        assert (box.path / "e2.pdf").exists() and (box.path / "e3.pdf").exists()
        assert not (box.path / "e1.pdf").exists()
        # a reason a retry cannot change needs the person's word, for all of them too
        status, _, body = site.request(
            "POST", "/api/failed/retry?reason=unsupported_format",
            headers={"X-CSRF-Token": csrf})
        assert status == 409
    finally:
        site.stop()


def test_the_message_after_an_action_is_shown_once_and_not_in_the_url(site) -> None:
    failed = site.ids["failed"]
    csrf = site.json("/api/status")["csrf"]
    status, headers, _ = site.request("POST", f"/files/{failed}/retry",
                                      body=urlencode({"csrf": csrf}).encode())
    assert status == 303 and headers["location"] == "/failed"
    cookie = headers["set-cookie"].split(";")[0]
    assert "HttpOnly" in headers["set-cookie"]
    status, headers, html = site.get("/failed", Cookie=cookie)
    assert b'id="flash"' in html and b"fails the same way" in html
    assert 'ocrd_flash=""' in headers["set-cookie"] or "Max-Age=0" in headers["set-cookie"]
    assert b'id="flash"' not in site.get("/failed")[2]  # the reload, without the cookie
    # a forged cookie is shown as text, never as markup
    import base64

    forged = base64.urlsafe_b64encode(json.dumps(
        {"kind": "good", "text": "<script>x()</script>"}).encode()).decode()
    html = site.get("/failed", Cookie=f"ocrd_flash={forged}")[2]
    assert b"<script>x()" not in html and b"&lt;script&gt;" in html


# -- banners and waiting ---------------------------------------------------------------------------

def _live(**kw: object) -> Live:
    base = dict(state="ready", engine_kind="remote", engine_model="m", engine_ready=True,
                pages_done=0, pages_per_second=0.0, pages_in_flight=0, queued=0,
                converting=0)
    return Live(**{**base, **kw})  # type: ignore[arg-type]


def test_banners_say_what_is_wrong(site) -> None:
    ctx = site.console.ctx
    assert banners(ctx, _live()) == []
    down = banners(ctx, _live(engine_ready=False))
    assert [b["id"] for b in down] == ["engine-down"]
    missing = banners(ctx, _live(inboxes=(InboxLive("/srv/share", "polling", False, 0),)))
    assert missing[0]["id"] == "inbox-missing" and "/srv/share" in missing[0]["text"]
    assert banners(ctx, None)[0]["id"] == "daemon-state"
    # and on every page
    ctx.live = lambda: _live(engine_ready=False)
    for path in ("/", "/files", "/failed", "/search?q=x", "/upload", "/api",
                 f"/files/{site.ids['done']}"):
        assert b'id="engine-down"' in site.get(path)[2], path


def test_waiting_files_say_why_and_until_when(tmp_path: Path) -> None:
    from ocrd.intake.inboxes import Inbox

    cfg = parse_config({"state_dir": str(tmp_path / "s"), "inboxes": [{
        "path": str(tmp_path / "in"), "outbox": str(tmp_path / "out"),
        "failed": str(tmp_path / "f"), "on_success": "delete", "quiet_seconds": 5,
        "incomplete_seconds": 600}]},
        tmp_path)
    clock = [1000.0]
    tracker = Tracker(5, False, clock=lambda: clock[0])
    from ocrd.config.roots import Roots
    from ocrd.intake.watch import Ignore
    from ocrd.outputs.destinations import Perms

    box = cfg.inboxes[0]
    inbox = Inbox(box, Ignore(box), tracker, "inotify", "x", Perms(0o640, 0o750, None),
                  Roots())

    def entry(name: str, size: int) -> Entry:
        return Entry(tmp_path / "in" / name, name, size, 1, hash(name), True)

    tracker.observe(entry("new.pdf", 10))
    empty = tracker.observe(entry("empty.pdf", 0))
    # as the intake loop records its check's decision (readiness.Wait)
    empty.why, empty.until, empty.fails_then = "empty", clock[0] + 600, True
    wall = time.time()
    got = {w.name: w for w in waiting_files(inbox, True, clock[0] + 1, wall)}
    assert got["new.pdf"].reason == "changing" and abs(got["new.pdf"].until - (wall + 4)) < 1
    assert got["empty.pdf"].why.startswith("empty — fails at ")
    assert got["empty.pdf"].fails_then and abs(got["empty.pdf"].until - (wall + 599)) < 1
    assert waiting_files(inbox, False, clock[0] + 1, wall)[0].reason == "engine_down"


# -- small things ----------------------------------------------------------------------------

def test_small_things(site) -> None:
    status, headers, body = site.get("/favicon.ico")
    assert status == 200 and headers["content-type"].startswith("image/svg+xml")
    assert b"<svg" in body
    status, _, html = site.get("/api")
    assert status == 200 and b"<code>GET /api/search</code>" in html
    assert b"<code>GET /api</code>" not in html and b"<code>GET /files" not in html
    assert b"Full-text search" in html
    status, _, html = site.get("/files?state=bogus")
    assert status == 400 and b"There is no state" in html
    assert site.get("/api/files?state=bogus")[0] == 400
    assert site.json("/api/files?state=waiting")["waiting"] == []  # no daemon: none known


def test_the_pager_can_jump(tmp_path: Path) -> None:
    site = build(tmp_path, start=False)
    db = sqlite3.connect(site.cfg.state_dir / "journal.sqlite3")
    inbox = str(site.cfg.inboxes[0].path)
    db.executemany("INSERT INTO jobs (inbox, relpath, claim_path, size, mtime_ns, state, "
                   "created) VALUES (?, ?, '', 1, 1, 'failed', 0)",
                   [(inbox, f"f{i}.pdf") for i in range(160)])
    db.commit()
    db.close()
    from ocrd.web import Console

    site.console = Console.start(site.cfg, None)
    try:
        html = site.get("/files?page=2")[2].decode()
        assert "page 2 of 4" in html and 'name="page"' in html and 'max="4"' in html
        assert "last »" in html and 'href="/files?page=4"' in html
        assert "page 4 of 4" in site.get("/files?page=4")[2].decode()
    finally:
        site.stop()


def test_the_chart_caption_agrees_with_the_running_bar(tmp_path: Path) -> None:
    """The last bar is still running: its pages are divided by the time it has had, not
    by a whole bar's ten minutes (which made the caption's figure a fraction of the
    rate shown above it)."""
    import re

    from ocrd.web.app import CHART_BUCKET
    from ocrd.work.journal import Journal

    site = build(tmp_path, start=False)
    journal = Journal(site.cfg.state_dir / "journal.sqlite3")
    job = journal.begin_claim(str(site.cfg.inboxes[0].path), "fresh.pdf", "", 1, 1)
    journal.claimed(job)
    journal.done(job, str(site.cfg.inboxes[0].outbox / "fresh.md"), None, pages=120)
    journal.close()
    from ocrd.web import Console

    site.console = Console.start(site.cfg, None)
    try:
        # (a request that straddles a bar's boundary is asked again: the file's pages
        # then belong to the bar before)
        for _ in range(3):
            before = time.time()
            html = site.get("/")[2].decode()
            if before // CHART_BUCKET == time.time() // CHART_BUCKET:
                break
        elapsed = max(60.0, before - before // CHART_BUCKET * CHART_BUCKET)
        finished = site.json(f"/api/files/{job}")["file"]["finished"]
        expected = 120 / elapsed if finished // CHART_BUCKET == before // CHART_BUCKET else 0
        since = time.strftime("%H:%M", time.localtime(before // CHART_BUCKET * CHART_BUCKET))
        shown = float(re.search(rf"the last bar, since {since}: ([0-9.]+)\)", html).group(1))
        assert abs(shown - expected) < 0.05 + expected * 0.1, (shown, expected)
        # two figures, two spans, each named: no "now" beside "over the last minute"
        assert "pages/s in each 10 minutes of the last 6 hours" in html
        caption = re.search(r'id="chart-caption">([^<]*)<', html).group(1)
        assert "pages/s over the last minute" in html and "now" not in caption, caption
    finally:
        site.stop()


@pytest.mark.e2e
def test_ocrd_status_names_the_queued_files(tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    from ocrd.work.journal import Journal

    inbox = tmp_path / "in"
    inbox.mkdir()
    config = {"state_dir": str(tmp_path / "state"), "metrics": {"listen": None},
              "web": {"listen": None}, "inboxes": [{
                  "path": str(inbox), "outbox": str(tmp_path / "out"),
                  "failed": str(tmp_path / "failed"), "on_success": "delete"}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    journal = Journal(tmp_path / "state" / "journal.sqlite3")
    journal.claimed(journal.begin_claim(str(inbox), "sub/next in line.pdf", "", 1, 1))
    journal.close()
    out = subprocess.run([sys.executable, "-m", "ocrd", "status", "-c",
                          str(tmp_path / "c.yaml")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"queued      sub/next in line.pdf  [{inbox}]" in out.stdout, out.stdout


def test_a_damaged_index_is_a_message_not_an_error(site) -> None:
    site.console.indexer.stop()  # so that it does not rebuild it under the test
    path = site.cfg.state_dir / "search.sqlite3"
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            path.with_name(path.name + suffix).unlink()
    path.write_bytes(b"not a database any more" * 500)
    status, _, body = site.get("/api/search?q=quarterly")
    assert status == 400 and b"being rebuilt" in body
    assert b"being rebuilt" in site.get("/search?q=quarterly")[2]
