"""The SQLite ledger of every file ocrd has claimed: where it is, what state it is in,
how often it was tried and how it ended. It is what makes a restart lose nothing.

States: claiming (row written, rename pending) → claimed (in the work area, queued) →
converting (attempts counted) → finishing (outputs written) → done | failed. A row is
written *before* the rename that claims a file, so a crash between the two can always be
resolved at start.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from .names import from_db, shown, to_db

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
"""

OPEN_STATES = ("claiming", "claimed", "converting", "finishing")


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


_COLUMNS = ("id, inbox, relpath, claim_path, size, mtime_ns, state, attempts, sha256, pages, "
            "reason, message, output, created, started, finished")


class Journal:
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
            self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def _one(self, sql: str, *args: object) -> Job | None:
        row = self.db.execute(f"SELECT {_COLUMNS} FROM jobs {sql}", args).fetchone()
        return _job(row) if row else None

    def _many(self, sql: str, *args: object) -> list[Job]:
        return [_job(r) for r in self.db.execute(f"SELECT {_COLUMNS} FROM jobs {sql}", args)]

    # -- claims ---------------------------------------------------------------------

    def begin_claim(self, inbox: str, relpath: str, claim_path: str, size: int,
                    mtime_ns: int) -> int:
        cur = self.db.execute(
            "INSERT INTO jobs (inbox, relpath, claim_path, size, mtime_ns, state, created) "
            "VALUES (?, ?, ?, ?, ?, 'claiming', ?)",
            (to_db(inbox), to_db(relpath), to_db(claim_path), size, mtime_ns, time.time()))
        return int(cur.lastrowid or 0)

    def set_claim_path(self, job_id: int, claim_path: str) -> None:
        self.db.execute("UPDATE jobs SET claim_path=? WHERE id=?", (to_db(claim_path), job_id))

    def claimed(self, job_id: int) -> None:
        self.db.execute("UPDATE jobs SET state='claimed' WHERE id=?", (job_id,))

    def drop(self, job_id: int) -> None:
        self.db.execute("DELETE FROM jobs WHERE id=?", (job_id,))

    def start(self, job_id: int) -> int:
        """Mark a job converting and count the attempt; returns the attempt number."""
        self.db.execute(
            "UPDATE jobs SET state='converting', attempts=attempts+1, started=? WHERE id=?",
            (time.time(), job_id))
        row = self.db.execute("SELECT attempts FROM jobs WHERE id=?", (job_id,)).fetchone()
        return int(row[0]) if row else 0

    def requeue(self, job_id: int) -> None:
        """Back to the queue without counting the attempt (engine away, drain)."""
        self.db.execute(
            "UPDATE jobs SET state='claimed', attempts=MAX(attempts-1, 0) WHERE id=?",
            (job_id,))

    def finishing(self, job_id: int, output: str) -> None:
        """Outputs are durable; what is left is archiving/deleting the original."""
        self.db.execute("UPDATE jobs SET state='finishing', output=? WHERE id=?",
                        (to_db(output), job_id))

    def done(self, job_id: int, output: str, kept_relpath: str | None) -> None:
        """Finished. With on_success=keep, the original is back in the inbox under
        kept_relpath and must not be converted again while it is unchanged."""
        if kept_relpath is None:
            self.db.execute(
                "UPDATE jobs SET state='done', output=?, finished=? WHERE id=?",
                (to_db(output), time.time(), job_id))
        else:
            self.db.execute(
                "UPDATE jobs SET state='done', output=?, kept=1, relpath=?, finished=? "
                "WHERE id=?", (to_db(output), to_db(kept_relpath), time.time(), job_id))

    def failed(self, job_id: int, reason: str, message: str, output: str) -> None:
        self.db.execute(
            "UPDATE jobs SET state='failed', reason=?, message=?, output=?, finished=? "
            "WHERE id=?", (reason, shown(message), to_db(output), time.time(), job_id))

    # -- queries --------------------------------------------------------------------

    def get(self, job_id: int) -> Job | None:
        return self._one("WHERE id=?", job_id)

    def open_jobs(self) -> list[Job]:
        marks = ",".join("?" * len(OPEN_STATES))
        return self._many(f"WHERE state IN ({marks}) ORDER BY id", *OPEN_STATES)

    def is_kept(self, inbox: str, relpath: str, size: int, mtime_ns: int) -> bool:
        """A file converted with on_success=keep, still unchanged in its inbox."""
        row = self.db.execute(
            "SELECT 1 FROM jobs WHERE inbox=? AND relpath=? AND kept=1 AND state='done' "
            "AND size=? AND mtime_ns=? LIMIT 1",
            (to_db(inbox), to_db(relpath), size, mtime_ns)).fetchone()
        return row is not None

    def counts(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state"))

    def recent_failures(self, limit: int = 10) -> list[Job]:
        return self._many("WHERE state='failed' ORDER BY finished DESC LIMIT ?", limit)


def _job(row: tuple) -> Job:
    """A row as a Job; the names (stored as TEXT or, when not UTF-8, as BLOB) as str."""
    job = Job(*row)
    job.inbox, job.relpath, job.claim_path = (from_db(v) for v in
                                              (job.inbox, job.relpath, job.claim_path))
    if job.output is not None:
        job.output = from_db(job.output)
    return job
