"""The journal's queries for the console: states in the user's words, filters, paging,
pages per time bucket; an older journal gains the new column at open, and a read-only
open of one still works."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from ocrd.work.journal import SCHEMA, FileFilter, Journal


def _journal(tmp_path: Path) -> Journal:
    j = Journal(tmp_path / "j.sqlite3")
    names = ["a.pdf", "b 100%.pdf", "c_d.pdf", "sub/e.pdf", "F.PDF"]
    for i, name in enumerate(names):
        job = j.begin_claim("/in", name, "", 10, i)
        j.claimed(job)
        if i < 3:
            j.start(job)
            j.done(job, f"/out/{name}.md", None, pages=i + 1, degraded=1 if i == 1 else 0)
    j.failed(4, "encrypted", "needs a password", "/failed/sub/e.pdf")
    other = j.begin_claim("/other", "a.pdf", "", 1, 1)
    j.claimed(other)
    return j


def test_filters_by_state_inbox_and_name(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    ids = lambda **kw: [x.id for x in j.find(FileFilter(**kw), limit=100)]  # noqa: E731
    assert ids() == [6, 5, 4, 3, 2, 1]  # newest first
    assert ids(state="done") == [3, 1]
    assert ids(state="degraded") == [2]
    assert ids(state="failed") == [4]
    assert ids(state="queued") == [6, 5]  # claimed; "waiting" is the inbox's, not a row's
    assert ids(inbox="/other") == [6]
    assert ids(name="f.pdf") == [5]  # case-insensitive
    assert ids(name="%") == [2] and ids(name="_") == [3]  # literal, not wildcards
    assert ids(state="failed", reason="encrypted") == [4]
    assert j.count(FileFilter(inbox="/in")) == 5
    assert [x.id for x in j.find(FileFilter(), limit=2, offset=2)] == [4, 3]
    assert j.failures_by_reason() == {"encrypted": 1}
    assert j.open_by_inbox() == {"/in": {"claimed": 1}, "/other": {"claimed": 1}}
    assert j.recent("done", 1)[0].id == 3


def test_pages_per_bucket(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    now = time.time()
    buckets = j.pages_per_bucket(now - 600, 600)
    assert sum(buckets.values()) == 1 + 2 + 3
    assert j.pages_per_bucket(now + 600, 600) == {}


def test_an_older_journal_gets_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    db.execute("INSERT INTO jobs (inbox, relpath, claim_path, size, mtime_ns, state, created)"
               " VALUES ('/in', 'x.pdf', '', 1, 1, 'done', 1.0)")
    db.commit()
    db.close()
    ro = Journal(path, readonly=True)  # `ocrd status` on a journal of an older daemon
    assert ro.get(1).degraded is None and ro.counts() == {"done": 1}
    ro.close()
    rw = Journal(path)
    assert rw.get(1).degraded is None
    rw.done(1, "/out/x.md", None, pages=3, degraded=2)
    assert (rw.get(1).pages, rw.get(1).degraded) == (3, 2)
    assert [x.id for x in rw.find(FileFilter(state="degraded"))] == [1]
