"""The SQLite ledger of every file ocrd has claimed: where it is, what state it is in,
how often it was tried and how it ended. It is what makes a restart lose nothing.

States: claiming (row written, rename pending) → claimed (in the work area, queued) →
converting (attempts counted) → finishing (outputs written) → done | failed. A row is
written *before* the rename that claims a file, so a crash between the two can always be
resolved at start.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ocrd.names import from_db, shown, to_db

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    inbox TEXT NOT NULL,
    relpath TEXT NOT NULL,
    claim_path TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    sha256 TEXT,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    pages INTEGER,
    reason TEXT,
    message TEXT,
    output TEXT,
    kept INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    started REAL,
    finished REAL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_path ON jobs(inbox, relpath);
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs(finished);
CREATE INDEX IF NOT EXISTS jobs_state_finished ON jobs(state, finished);
CREATE INDEX IF NOT EXISTS jobs_reason ON jobs(reason);
-- (inbox, id): an inbox's rows newest first, as the console lists them, without a sort
CREATE INDEX IF NOT EXISTS jobs_inbox ON jobs(inbox);
-- a person's turn of a page (the console's "turn this page"), by the document's content:
-- every later conversion of it reads that page turned so, clockwise
CREATE TABLE IF NOT EXISTS turns (
    sha256 TEXT NOT NULL,
    page INTEGER NOT NULL,
    rotation INTEGER NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (sha256, page)
);
"""

# Columns added after the first release; an older journal gets them at open.
_ADDED_COLUMNS = {"degraded": "INTEGER"}

OPEN_STATES = ("claiming", "claimed", "converting", "finishing")
# A failed row whose original was put back into its inbox (`ocrd retry`); the file
# then comes in again as a new row.
RETRIED = "retried"
# A failed row a person has looked at and set aside (the console's Dismiss): off the
# Failed list, its original still in failed/.
DISMISSED = "dismissed"

# SQLite's answers that mean the state folder cannot take writes now (full, read-only,
# gone, I/O errors): not a file's fault, nothing to fail a file for. The daemon backs
# off and tries again.
_UNWRITABLE = ("SQLITE_FULL", "SQLITE_READONLY", "SQLITE_IOERR", "SQLITE_CANTOPEN",
               "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_PROTOCOL")
_CORRUPT = ("SQLITE_CORRUPT", "SQLITE_NOTADB")


# SQLite's integers are 64-bit and signed: no row has an id beyond this, and a larger
# number (an id or an offset from a URL) would not even reach SQLite (OverflowError).
MAX_INTEGER = 2**63 - 1


class JournalUnwritable(OSError):
    """The journal cannot be written right now (state folder full, read-only …)."""


class JournalCorrupt(Exception):
    """The journal file is damaged (not a database, malformed)."""


def _translate(e: sqlite3.Error) -> Exception:
    name = getattr(e, "sqlite_errorname", "") or ""
    text = str(e)
    if name.startswith(_CORRUPT) or "not a database" in text or "malformed" in text:
        return JournalCorrupt(text)
    if name.startswith(_UNWRITABLE) or isinstance(e, sqlite3.OperationalError):
        return JournalUnwritable(text)
    return e


T = TypeVar("T")


def _guarded(fn: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> T:
        try:
            return fn(*args, **kw)
        except sqlite3.Error as e:
            raise _translate(e) from e
    return wrapper


@dataclass
class Job:
    id: int
    inbox: str
    relpath: str
    claim_path: str
    size: int
    mtime_ns: int
    state: str
    attempts: int
    sha256: str | None = None
    pages: int | None = None
    reason: str | None = None
    message: str | None = None
    output: str | None = None
    created: float = 0.0
    started: float | None = None
    finished: float | None = None
    degraded: int | None = None  # degraded pages of a done file (None: not recorded)


_COLUMNS = ("id, inbox, relpath, claim_path, size, mtime_ns, state, attempts, sha256, pages, "
            "reason, message, output, created, started, finished")


class Journal:
    """Every method raises JournalUnwritable when the state folder cannot take the
    write now, JournalCorrupt when the file is damaged."""

    @_guarded
    def __init__(self, path: Path, readonly: bool = False) -> None:
        self.path = path
        if readonly:
            self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, timeout=30, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            # FULL: a claim that returned must survive a power cut, or the claimed file
            # would sit in the work area with no row pointing at it.
            self.db.execute("PRAGMA synchronous=FULL")
            # A small WAL, truncated after checkpoints: a state folder on a small
            # partition must not fill up with a 4 MB log of a few hundred rows.
            self.db.execute("PRAGMA wal_autocheckpoint=16")
            self.db.execute("PRAGMA journal_size_limit=65536")
            self.db.executescript(SCHEMA)
            ok = self.db.execute("PRAGMA quick_check").fetchone()
            if not ok or ok[0] != "ok":
                self.db.close()
                raise JournalCorrupt(f"integrity check: {ok[0] if ok else 'no answer'}")
            have = {r[1] for r in self.db.execute("PRAGMA table_info(jobs)")}
            for name, kind in _ADDED_COLUMNS.items():
                if name not in have:
                    self.db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
        # Read-only, a journal from before a column was added reads it as NULL.
        have = {r[1] for r in self.db.execute("PRAGMA table_info(jobs)")}
        self._columns = _COLUMNS + "".join(
            f", {name}" if name in have else f", NULL AS {name}" for name in _ADDED_COLUMNS)

    @classmethod
    def open_or_set_aside(cls, path: Path) -> tuple[Journal, str | None]:
        """The journal at path; a damaged one is renamed aside (path.corrupt-TIME, with
        its -wal/-shm) and a new one started. Returns (journal, the aside name or None)."""
        try:
            return cls(path), None
        except JournalCorrupt:
            pass
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            src = path.with_name(path.name + suffix)
            if src.exists():
                os.replace(src, aside.with_name(aside.name + suffix))
        return cls(path), aside.name

    def make_room(self) -> None:
        """After a 'disk full': fold the WAL into the database and truncate it, which
        gives back the space the log held (errors ignored: it is an attempt)."""
        try:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass

    def close(self) -> None:
        self.db.close()

    def _one(self, sql: str, *args: object) -> Job | None:
        row = self.db.execute(f"SELECT {self._columns} FROM jobs {sql}", args).fetchone()
        return _job(row) if row else None

    def _many(self, sql: str, *args: object) -> list[Job]:
        return [_job(r) for r in self.db.execute(f"SELECT {self._columns} FROM jobs {sql}", args)]

    # -- claims ---------------------------------------------------------------------

    @_guarded
    def begin_claim(self, inbox: str, relpath: str, claim_path: str, size: int,
                    mtime_ns: int) -> int:
        cur = self.db.execute(
            "INSERT INTO jobs (inbox, relpath, claim_path, size, mtime_ns, state, created) "
            "VALUES (?, ?, ?, ?, ?, 'claiming', ?)",
            (to_db(inbox), to_db(relpath), to_db(claim_path), size, mtime_ns, time.time()))
        return int(cur.lastrowid or 0)

    @_guarded
    def open_claim(self, inbox: str, relpath: str, size: int, mtime_ns: int,
                   claim_path: Callable[[int], str]) -> int:
        """A claim's row (state `claiming`) with the path the file will have in the work
        area, which names the row's id (`claim_path(id)`): one commit, not two."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            job_id = self.begin_claim(inbox, relpath, "", size, mtime_ns)
            self.set_claim_path(job_id, claim_path(job_id))
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return job_id

    @_guarded
    def set_claim_path(self, job_id: int, claim_path: str) -> None:
        self.db.execute("UPDATE jobs SET claim_path=? WHERE id=?", (to_db(claim_path), job_id))

    @_guarded
    def claimed(self, job_id: int) -> None:
        self.db.execute("UPDATE jobs SET state='claimed' WHERE id=?", (job_id,))

    @_guarded
    def drop(self, job_id: int) -> None:
        self.db.execute("DELETE FROM jobs WHERE id=?", (job_id,))

    @_guarded
    def start(self, job_id: int) -> int:
        """Mark a job converting and count the attempt; returns the attempt number."""
        self.db.execute(
            "UPDATE jobs SET state='converting', attempts=attempts+1, started=? WHERE id=?",
            (time.time(), job_id))
        row = self.db.execute("SELECT attempts FROM jobs WHERE id=?", (job_id,)).fetchone()
        return int(row[0]) if row else 0

    @_guarded
    def requeue(self, job_id: int) -> None:
        """Back to the queue without counting the attempt (engine away, drain)."""
        self.db.execute(
            "UPDATE jobs SET state='claimed', attempts=MAX(attempts-1, 0) WHERE id=?",
            (job_id,))

    @_guarded
    def finishing(self, job_id: int, output: str) -> None:
        """Outputs are durable; what is left is archiving/deleting the original."""
        self.db.execute("UPDATE jobs SET state='finishing', output=? WHERE id=?",
                        (to_db(output), job_id))

    @_guarded
    def done(self, job_id: int, output: str, kept_relpath: str | None,
             pages: int | None = None, degraded: int | None = None) -> None:
        """Finished. With on_success=keep, the original is back in the inbox under
        kept_relpath and must not be converted again while it is unchanged. `pages` and
        `degraded` (degraded page count), when given, feed the console's lists."""
        if kept_relpath is None:
            self.db.execute(
                "UPDATE jobs SET state='done', output=?, finished=?, "
                "pages=COALESCE(?, pages), degraded=COALESCE(?, degraded) WHERE id=?",
                (to_db(output), time.time(), pages, degraded, job_id))
        else:
            self.db.execute(
                "UPDATE jobs SET state='done', output=?, kept=1, relpath=?, finished=?, "
                "pages=COALESCE(?, pages), degraded=COALESCE(?, degraded) WHERE id=?",
                (to_db(output), to_db(kept_relpath), time.time(), pages, degraded, job_id))

    @_guarded
    def failed(self, job_id: int, reason: str, message: str, output: str) -> None:
        self.db.execute(
            "UPDATE jobs SET state='failed', reason=?, message=?, output=?, finished=? "
            "WHERE id=?", (reason, shown(message), to_db(output), time.time(), job_id))

    # -- queries --------------------------------------------------------------------

    @_guarded
    def get(self, job_id: int) -> Job | None:
        """The row, or None (also for an id no row can have: a URL's id is anything)."""
        if not 0 <= job_id <= MAX_INTEGER:
            return None
        return self._one("WHERE id=?", job_id)

    @_guarded
    def open_jobs(self) -> list[Job]:
        marks = ",".join("?" * len(OPEN_STATES))
        return self._many(f"WHERE state IN ({marks}) ORDER BY id", *OPEN_STATES)

    @_guarded
    def is_kept(self, inbox: str, relpath: str, size: int, mtime_ns: int) -> bool:
        """A file converted with on_success=keep, still unchanged in its inbox."""
        row = self.db.execute(
            "SELECT 1 FROM jobs WHERE inbox=? AND relpath=? AND kept=1 AND state='done' "
            "AND size=? AND mtime_ns=? LIMIT 1",
            (to_db(inbox), to_db(relpath), size, mtime_ns)).fetchone()
        return row is not None

    @_guarded
    def kept_among(self, inbox: str, keys: list[tuple[str, int, int]]
                   ) -> set[tuple[str, int, int]]:
        """`is_kept` for many (relpath, size, mtime_ns) at once: those kept."""
        wanted = set(keys)
        found: set[tuple[str, int, int]] = set()
        for start in range(0, len(keys), 500):  # SQLite's bound parameters per statement
            chunk = [to_db(k[0]) for k in keys[start:start + 500]]
            marks = ",".join("?" * len(chunk))
            for relpath, size, mtime_ns in self.db.execute(
                    "SELECT relpath, size, mtime_ns FROM jobs WHERE inbox=? AND kept=1 AND "
                    f"state='done' AND relpath IN ({marks})", (to_db(inbox), *chunk)):
                key = (from_db(relpath), size, mtime_ns)
                if key in wanted:
                    found.add(key)
        return found

    def counts(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state"))

    @_guarded
    def recent_failures(self, limit: int = 10) -> list[Job]:
        return self._many("WHERE state='failed' ORDER BY finished DESC LIMIT ?", limit)

    def recent(self, state: str, limit: int = 10) -> list[Job]:
        """The last rows to reach `state`, newest first (the index on `finished`)."""
        return self._many("WHERE state=? ORDER BY finished DESC LIMIT ?", state, limit)

    def find(self, where: FileFilter, limit: int = 50, offset: int = 0) -> list[Job]:
        """Rows matching the filter, newest first, one page of them."""
        sql, args = where.sql()
        return self._many(f"{sql} ORDER BY id DESC LIMIT ? OFFSET ?", *args, limit, offset)

    def count(self, where: FileFilter) -> int:
        sql, args = where.sql()
        return int(self.db.execute(f"SELECT COUNT(*) FROM jobs {sql}", args).fetchone()[0])

    def open_by_inbox(self) -> dict[str, dict[str, int]]:
        """Per inbox, its unfinished rows by state (claimed, converting …)."""
        marks = ",".join("?" * len(OPEN_STATES))
        out: dict[str, dict[str, int]] = {}
        for inbox, state, n in self.db.execute(
                f"SELECT inbox, state, COUNT(*) FROM jobs WHERE state IN ({marks}) "
                "GROUP BY inbox, state", OPEN_STATES):
            out.setdefault(from_db(inbox), {})[state] = int(n)
        return out

    def failures_by_reason(self) -> dict[str, int]:
        return dict(self.db.execute(
            "SELECT reason, COUNT(*) FROM jobs WHERE state='failed' GROUP BY reason"))

    def inboxes(self) -> list[str]:
        return [from_db(r[0]) for r in self.db.execute("SELECT DISTINCT inbox FROM jobs")]

    def pages_per_bucket(self, since: float, bucket_seconds: int) -> dict[int, int]:
        """Pages of files done since `since`, summed per bucket (bucket start time)."""
        rows = self.db.execute(
            "SELECT CAST(finished / ? AS INTEGER) * ?, SUM(COALESCE(pages, 0)) FROM jobs "
            "WHERE finished >= ? AND state = 'done' GROUP BY 1",
            (bucket_seconds, bucket_seconds, since))
        return {int(t): int(n) for t, n in rows}

    def done_after(self, finished: float, job_id: int, limit: int) -> list[Job]:
        """Done rows after (finished, id), in that order (the search indexer's walk)."""
        return self._many("WHERE state='done' AND (finished > ? OR (finished = ? AND id > ?))"
                          " ORDER BY finished, id LIMIT ?", finished, finished, job_id, limit)

    def names_of(self, job_ids: list[int]) -> dict[int, Job]:
        if not job_ids:
            return {}
        marks = ",".join("?" * len(job_ids))
        return {j.id: j for j in self._many(f"WHERE id IN ({marks})", *job_ids)}

    # -- retry --------------------------------------------------------------------------

    @_guarded
    def dismiss(self, job_id: int) -> bool:
        """Set a failed row aside; False when it is not (or no longer) failed."""
        cur = self.db.execute("UPDATE jobs SET state=? WHERE id=? AND state='failed'",
                              (DISMISSED, job_id))
        return cur.rowcount == 1

    @_guarded
    def set_turn(self, sha256: str, page: int, rotation: int | None) -> None:
        """Page `page` of the document `sha256` is to be read turned `rotation` degrees
        clockwise (0, 90, 180, 270; 0: as it lies), whatever the engine would detect;
        None: as the engine finds it again."""
        if rotation is None:
            self.db.execute("DELETE FROM turns WHERE sha256=? AND page=?", (sha256, page))
            return
        self.db.execute("INSERT OR REPLACE INTO turns (sha256, page, rotation, at) "
                        "VALUES (?, ?, ?, ?)", (sha256, page, rotation % 360, time.time()))

    @_guarded
    def turns(self, sha256: str) -> dict[int, int]:
        """{page: rotation} a person chose for the document `sha256` (a journal from
        before turns, opened read-only, has none)."""
        try:
            rows = self.db.execute("SELECT page, rotation FROM turns WHERE sha256=?",
                                   (sha256,)).fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return {}
            raise
        return {int(page): int(rotation) for page, rotation in rows}

    @_guarded
    def mark_retried(self, job_id: int, put_back: str) -> bool:
        """A failed row whose original is back in its inbox as `put_back`; False when
        the row is not (or no longer) failed."""
        cur = self.db.execute(
            "UPDATE jobs SET state=?, output=? WHERE id=? AND state='failed'",
            (RETRIED, to_db(put_back), job_id))
        return cur.rowcount == 1


# What the console calls a state, as journal states (`degraded`: done with degraded pages).
FILTER_STATES: dict[str, tuple[tuple[str, ...], str]] = {
    "queued": (("claiming", "claimed"), ""),
    "converting": (("converting", "finishing"), ""),
    "done": (("done",), " AND COALESCE(degraded, 0) = 0"),
    "degraded": (("done",), " AND degraded > 0"),
    "failed": (("failed",), ""),
    "retried": ((RETRIED,), ""),
    "dismissed": ((DISMISSED,), ""),
}


@dataclass(frozen=True)
class FileFilter:
    """The console's filters: state (a FILTER_STATES key), inbox (exact), name (part of
    the relative path), reason (failure code)."""

    state: str | None = None
    inbox: str | None = None
    name: str | None = None
    reason: str | None = None

    def sql(self) -> tuple[str, list[object]]:
        terms: list[str] = []
        args: list[object] = []
        if self.state:
            states, extra = FILTER_STATES[self.state]
            terms.append(f"state IN ({','.join('?' * len(states))}){extra}")
            args += states
        if self.inbox:
            terms.append("inbox = ?")
            args.append(to_db(self.inbox))
        if self.reason:
            terms.append("reason = ?")
            args.append(self.reason)
        if self.name:
            # instr, not LIKE: % and _ in a file name are not wildcards
            terms.append("instr(lower(CAST(relpath AS TEXT)), ?) > 0")
            args.append(self.name.lower())
        return ("WHERE " + " AND ".join(terms)) if terms else "", args


def _job(row: tuple) -> Job:
    """A row as a Job; the names (stored as TEXT or, when not UTF-8, as BLOB) as str."""
    job = Job(*row)
    job.inbox, job.relpath, job.claim_path = (from_db(v) for v in
                                              (job.inbox, job.relpath, job.claim_path))
    if job.output is not None:
        job.output = from_db(job.output)
    return job
