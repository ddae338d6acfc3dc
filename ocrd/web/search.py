"""Full-text search over every converted page: an SQLite FTS5 index beside the journal
(`state_dir/search.sqlite3`), filled from the outbox's Markdown by a low-priority thread,
asked by the console and its API.

Words are found by FTS5's `unicode61` tokenizer (case and accents folded: "muller"
finds "Müller"). Chinese, Japanese and Korean text has no spaces between words, so each
of its characters is indexed as a word of its own and a query's CJK run is searched as a
phrase of adjacent characters: "東京" finds "東京都", and a one-character query works
(a trigram index would need three). The index is disposable: a damaged one is removed and
rebuilt from the outbox, and one that is deleted or replaced is let go of (each
connection knows the file it opened by its device and inode, as config/roots.py knows
folders) and rebuilt or taken as it is: by the indexer within a round, which also closes
the console threads' idle connections to the old file (its space comes back then), and
by a console thread at its next search.
"""

from __future__ import annotations

import contextlib
import functools
import html
import os
import re
import sqlite3
import threading
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("ocrd.web.search")

SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    job_id INTEGER PRIMARY KEY,
    inbox TEXT NOT NULL,
    output TEXT NOT NULL,
    finished REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS docs_output ON docs(inbox, output);
CREATE TABLE IF NOT EXISTS pages (
    id INTEGER PRIMARY KEY,
    job_id INTEGER NOT NULL,
    page INTEGER NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS pages_job ON pages(job_id);
CREATE VIRTUAL TABLE IF NOT EXISTS page_words USING fts5(
    words, content='', tokenize='unicode61 remove_diacritics 2', prefix='2 3 4');
CREATE TABLE IF NOT EXISTS progress (key TEXT PRIMARY KEY, value REAL NOT NULL);
"""

_CJK = ("\u2e80-\u2fdf\u3005-\u3007\u3021-\u3029\u3040-\u30ff\u3100-\u312f\u3190-\u31ff"
        "\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f"
        "\U00020000-\U0003134f")
_CJK_CHAR = re.compile(f"[{_CJK}]")
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")
_TAG = re.compile(r"<[^>\n]{0,400}>")
_MARKUP = re.compile(r"[#*_`|>~\[\]]+|!?\]\([^)\n]*\)")
_SPACES = re.compile(r"[ \t]+")
_QUERY_PART = re.compile(r'"([^"]*)"|(\S+)')
SNIPPET_CHARS = 160
# Ranking (bm25) costs time for every matching page: a query that matches more pages
# than this lists them newest first instead, which SQLite streams.
RANK_AT_MOST = 1000
# Counting stops here ("more than 1000 pages"): counting every page of a word that is
# on most of them costs more than the answer is worth.
COUNT_AT_MOST = RANK_AT_MOST
MIN_PREFIX = 2  # characters before a `*`; a shorter prefix is a whole word
MAX_TERMS = 16
NICE = 10  # the indexer thread's niceness


def plain_text(markdown: str) -> str:
    """A page's Markdown as the words a person reads: tags and markup dropped."""
    text = _MARKUP.sub(" ", _TAG.sub(" ", markdown))
    text = html.unescape(text)
    lines = (_SPACES.sub(" ", line).strip() for line in text.splitlines())
    return "\n".join(line for line in lines if line)


def index_words(text: str) -> str:
    """What FTS5 indexes for a text: CJK characters spaced apart, the rest as it is."""
    return _CJK_CHAR.sub(lambda m: f" {m.group(0)} ", text)


@dataclass(frozen=True)
class Query:
    """A user's query: words (all must be on the page), "quoted phrases", and `word*`
    for words that start so. `terms`: what to highlight."""

    match: str  # the FTS5 MATCH expression; "" when the query has no words
    terms: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Query:
        parts, terms = [], []
        for m in _QUERY_PART.finditer(text[:500]):
            raw = m.group(1) if m.group(1) is not None else m.group(2)
            prefix = m.group(2) is not None and raw.endswith("*") and \
                len(raw.rstrip("*")) >= MIN_PREFIX
            tokens = _TOKEN.findall(raw)
            if not tokens:
                continue
            parts.append(_phrase(tokens, prefix))
            terms.append(_fold("".join(tokens) if all(_CJK_CHAR.fullmatch(t) for t in tokens)
                               else " ".join(tokens)))
            if len(parts) >= MAX_TERMS:
                break
        return cls(" AND ".join(parts), tuple(dict.fromkeys(t for t in terms if t)))


def _phrase(tokens: list[str], prefix: bool) -> str:
    """Adjacent tokens as one FTS5 phrase ("a" + "b"), the last one a prefix when asked."""
    inner = " + ".join(f'"{t}"' for t in tokens)
    if prefix and not _CJK_CHAR.fullmatch(tokens[-1]):
        inner += " *"
    return inner


@functools.lru_cache(maxsize=65536)
def _fold_char(c: str) -> str:
    """One character, case and accents folded, still one character (positions in the
    folded text are positions in the original)."""
    base = unicodedata.normalize("NFKD", c)
    base = "".join(ch for ch in base if not unicodedata.combining(ch)) or c
    folded = base.casefold()
    return folded[0] if folded else c


def _fold(text: str) -> str:
    if text.isascii():
        return text.lower()
    return "".join(map(_fold_char, text))


def spans(text: str, terms: Iterable[str]) -> list[tuple[int, int]]:
    """Where the terms occur in text (case and accents folded), merged, in order."""
    folded = _fold(text)
    found = []
    for term in terms:
        pattern = _term_pattern(term)
        found += [(m.start(), m.end()) for m in pattern.finditer(folded)]
    found.sort()
    merged: list[tuple[int, int]] = []
    for start, end in found:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _term_pattern(term: str) -> re.Pattern[str]:
    """A folded term as a pattern: its words separated by any non-word run, a CJK run
    as its characters with any spacing between them."""
    if _CJK_CHAR.search(term):
        return re.compile(r"\s*".join(re.escape(c) for c in term if not c.isspace()))
    words = [re.escape(w) for w in term.split()]
    return re.compile(r"(?<!\w)" + r"\W+".join(words))


def highlight(text: str, terms: Iterable[str]) -> str:
    """text as HTML (escaped) with the terms in <mark>."""
    out, pos = [], 0
    for start, end in spans(text, terms):
        out.append(html.escape(text[pos:start]))
        out.append(f"<mark>{html.escape(text[start:end])}</mark>")
        pos = end
    out.append(html.escape(text[pos:]))
    return "".join(out)


_HTML_TAG = re.compile(r"(<[^>]*>)")


def highlight_html(markup: str, terms: Iterable[str]) -> str:
    """Clean HTML with the terms marked in its text (never inside a tag)."""
    terms = tuple(terms)
    if not terms:
        return markup
    parts = _HTML_TAG.split(markup)
    for k in range(0, len(parts), 2):  # even parts are text between tags
        if parts[k]:
            parts[k] = highlight(html.unescape(parts[k]), terms)
    return "".join(parts)


def snippet(text: str, terms: Iterable[str], chars: int = SNIPPET_CHARS) -> str:
    """About `chars` characters around the first hit, as HTML with the hits marked."""
    terms = tuple(terms)
    found = spans(text, terms)
    flat = text.replace("\n", " ")
    if not found:
        cut = flat[:chars]
        return html.escape(cut) + ("…" if len(flat) > chars else "")
    start = max(0, found[0][0] - chars // 3)
    if start > 0:
        space = flat.find(" ", start, found[0][0])
        start = space + 1 if space >= 0 else start
    end = min(len(flat), start + chars)
    return (("…" if start > 0 else "") + highlight(flat[start:end], terms) +
            ("…" if end < len(flat) else ""))


@dataclass
class Hit:
    job_id: int
    page: int
    snippet: str  # HTML: escaped text, hits in <mark>


def identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at path now; None when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class SearchIndex:
    """The index file. One connection per thread; writes from the indexer only. `lock`
    is held while the connection is used: another thread may close an idle connection
    to a file that is gone (Store.let_go_of_stale_readers)."""

    def __init__(self, path: Path, readonly: bool = False) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.closed = False
        if readonly:
            self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5,
                                      check_same_thread=False)
        else:
            self.db = sqlite3.connect(path, timeout=30, isolation_level=None,
                                      check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")  # disposable: rebuilt if lost
            self.db.executescript(SCHEMA)
        self.ident = identity(path)  # the file this connection has open

    def current(self) -> bool:
        """The file at the index's path is still the one this connection has open."""
        return self.ident is not None and identity(self.path) == self.ident

    @classmethod
    def open_or_rebuild(cls, path: Path) -> SearchIndex:
        """The index; a damaged one is removed and started anew (the indexer refills it
        from the outbox)."""
        try:
            index = cls(path)
            ok = index.db.execute("PRAGMA quick_check").fetchone()
            if ok and ok[0] == "ok":
                return index
            index.close()
        except sqlite3.DatabaseError as e:
            log.warning("search_index_damaged", path=str(path), error=str(e))
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                path.with_name(path.name + suffix).unlink()
        return cls(path)

    def close(self) -> None:
        self.closed = True
        self.db.close()

    # -- writing ------------------------------------------------------------------------

    def add(self, job_id: int, inbox: str, output: str, finished: float,
            pages: list[tuple[int, str]]) -> None:
        """A converted document's pages (page number, plain text); an older conversion
        of the same output file is replaced."""
        db = self.db
        db.execute("BEGIN")
        try:
            for (old,) in db.execute("SELECT job_id FROM docs WHERE inbox=? AND output=?",
                                     (inbox, output)).fetchall():
                self._remove(old)
            db.execute("INSERT OR REPLACE INTO docs VALUES (?,?,?,?)",
                       (job_id, inbox, output, finished))
            for page, text in pages:
                cur = db.execute("INSERT INTO pages (job_id, page, text) VALUES (?,?,?)",
                                 (job_id, page, text))
                db.execute("INSERT INTO page_words (rowid, words) VALUES (?,?)",
                           (cur.lastrowid, index_words(text)))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _remove(self, job_id: int) -> None:
        for rowid, text in self.db.execute("SELECT id, text FROM pages WHERE job_id=?",
                                           (job_id,)).fetchall():
            self.db.execute("INSERT INTO page_words (page_words, rowid, words) "
                            "VALUES ('delete', ?, ?)", (rowid, index_words(text)))
        self.db.execute("DELETE FROM pages WHERE job_id=?", (job_id,))
        self.db.execute("DELETE FROM docs WHERE job_id=?", (job_id,))

    def known(self, job_ids: list[int]) -> set[int]:
        if not job_ids:
            return set()
        marks = ",".join("?" * len(job_ids))
        return {r[0] for r in self.db.execute(
            f"SELECT job_id FROM docs WHERE job_id IN ({marks})", job_ids)}

    def watermark(self) -> tuple[float, int]:
        """(finished, id) of the last journal row looked at."""
        got = dict(self.db.execute("SELECT key, value FROM progress"))
        return float(got.get("finished", 0.0)), int(got.get("id", 0))

    def set_watermark(self, finished: float, job_id: int) -> None:
        self.db.executemany("INSERT OR REPLACE INTO progress VALUES (?, ?)",
                            (("finished", finished), ("id", job_id)))

    # -- asking -------------------------------------------------------------------------

    def search(self, query: Query, limit: int = 20, offset: int = 0,
               job_ids: list[int] | None = None) -> tuple[list[Hit], int]:
        """Pages that have every word, best first, and how many there are in all (at most
        COUNT_AT_MOST + 1: "more than COUNT_AT_MOST")."""
        if not query.match:
            return [], 0
        try:
            total = int(self.db.execute(
                "SELECT count(*) FROM (SELECT rowid FROM page_words WHERE page_words MATCH ? "
                "LIMIT ?)", (query.match, COUNT_AT_MOST + 1)).fetchone()[0])
            order = "rank" if total <= RANK_AT_MOST else "rowid DESC"
            rows = self.db.execute(
                "SELECT p.job_id, p.page, p.text FROM (SELECT rowid, rank AS score FROM "
                f"page_words WHERE page_words MATCH ? ORDER BY {order} LIMIT ? OFFSET ?) "
                f"AS m JOIN pages p ON p.id = m.rowid ORDER BY m.{order.replace('rank', 'score')}",
                (query.match, limit, offset)).fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return [], 0
            raise
        return [Hit(j, p, snippet(t, query.terms)) for j, p, t in rows], total


# The index is optional: it stops growing while the state folder (the journal's) has
# less than this free.
MIN_FREE_BYTES = 64 * 1024**2


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged writer may still use on the folder's filesystem."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


class Indexer:
    """Fills the index from the journal's done rows and their Markdown, on a thread of
    its own, a batch at a time with pauses between: conversion comes first."""

    def __init__(self, path: Path, rows: Callable[[tuple[float, int], int], list],
                 read: Callable[[object], str | None], every: float = 2.0,
                 batch: int = 50, each_round: Callable[[], None] | None = None) -> None:
        self.path = path
        self.rows = rows  # ((finished, id), limit) -> the done Jobs after it, in order
        self.read = read  # Job -> its Markdown, or None
        # called after every round (the console lets go of readers of a file that is gone)
        self.each_round = each_round
        self.every = every
        self.batch = batch
        self.indexed = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="search-index", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def poke(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        # Linux gives a thread its own nice value: this one yields the CPU to the rest
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        index = None
        said: str | None = None  # the trouble logged last: each kind once, until it ends
        while not self._stop.is_set():
            try:
                if free_bytes(self.path.parent) < MIN_FREE_BYTES:
                    # the journal needs the state folder's last space, not the index
                    if said != "low_space":
                        log.warning("search_index_paused", why="the state folder has less "
                                    f"than {MIN_FREE_BYTES // 1024**2} MiB free")
                        said = "low_space"
                else:
                    if index is not None and not index.current():
                        # deleted or replaced: writing on into the old file would fill
                        # a file nobody sees (and keep its space)
                        log.warning("search_index_replaced", path=str(self.path),
                                    then="rebuilt from the outbox, or the file there now "
                                    "taken as it is")
                        index.close()
                        index = None
                    if index is None:
                        index = SearchIndex.open_or_rebuild(self.path)
                    while not self._stop.is_set() and self.step(index):
                        self._stop.wait(0.05)  # a pause between batches: conversion first
                    if said is not None:
                        log.info("search_index_resumed")
                        said = None
                if self.each_round is not None:
                    self.each_round()
            except Exception as e:  # noqa: BLE001 - search must never stop the daemon
                if said != repr(e):
                    log.warning("search_index_failed", error=repr(e))
                    said = repr(e)
                if index is not None:
                    with contextlib.suppress(Exception):
                        index.close()
                index = None
            self._wake.wait(self.every)
            self._wake.clear()
        if index is not None:
            index.close()

    def step(self, index: SearchIndex) -> bool:
        """Index one batch; True when there may be more."""
        jobs = self.rows(index.watermark(), self.batch)
        if not jobs:
            return False
        known = index.known([j.id for j in jobs])
        for job in jobs:
            if job.id in known:
                continue
            markdown = self.read(job)
            if markdown is None:
                continue
            from ocrd.web.render import split_pages

            pages = [(p.page, plain_text(p.markdown)) for p in split_pages(markdown)]
            index.add(job.id, job.inbox, job.output or "", job.finished or 0.0, pages)
            self.indexed += 1
        index.set_watermark(jobs[-1].finished or 0.0, jobs[-1].id)
        return len(jobs) == self.batch
