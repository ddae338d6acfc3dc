"""How a claimed file ends: converted (the original archived, deleted or put back) or
failed (the original in failed/ beside an `.error.json` with the reason) — and what
happens when a destination cannot take it.

The one answer to "what happens to an original after success?" is `dispose`: only once
the outputs are durable (journal row `finishing`), and never replacing anything. With
`on_success: keep` the original goes back to its inbox folder and is remembered
(`is_kept`), so that it is not converted again while it is unchanged.

A destination that fails the whole inbox (full, read-only, unmounted: `TRANSIENT`) pauses
the inbox and the file is tried again later, with backoff, as long as it takes. A
failure that belongs to this one file (a name the share refuses …) is tried a few times,
then with a plain ASCII name, and then the file fails with a reason: it never blocks the
inbox for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from ocrd import errors, names, safefs
from ocrd.outputs import destinations, records
from ocrd.work import kept as kept_marks
from ocrd.work.area import WORK_DIR_NAME, InboxView, SeenFile
from ocrd.work.item import Item
from ocrd.work.journal import Journal, JournalCorrupt, JournalUnwritable

log = structlog.get_logger("ocrd.work.outcomes")

# errno values that say the destination as a whole cannot take files now, or that the
# daemon is short of descriptors or memory
TRANSIENT = errors.NOT_NOW
# tries of a file-specific destination failure before plain names, then failing
OWN_FAILURE_TRIES = 3
MAX_BACKOFF_SECONDS = 60.0
# a full or read-only state folder is looked at again at least this often
STATE_BACKOFF_SECONDS = 30.0


def transient(e: OSError) -> bool:
    return e.errno in TRANSIENT or isinstance(e, JournalUnwritable)


def plain_name(name: str) -> str:
    """A name any share takes: ASCII letters, digits, '-', '_', '.' (and its extension)."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "_", names.shown(name)).strip("._") or "file"
    stem, ext = destinations.split_ext(text)
    return destinations.fit_name(stem, ext)


class Outcomes:
    def __init__(self, journal: Journal, metrics: Any,
                 resubmit: Callable[[Item], None]) -> None:
        self.journal = journal
        self.metrics = metrics
        self.resubmit = resubmit
        self._later: list[asyncio.TimerHandle] = []
        self.done_pages = 0
        self.stopping = asyncio.Event()

    # -- the journal, which may be full for a while -----------------------------------

    async def record(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A journal write, retried (with backoff) while the state folder is full or
        read-only: the file waits, nothing is failed for it. When the daemon stops
        meanwhile, the file is left as the journal last knew it (cancelled)."""
        delay = 1.0
        while True:
            try:
                return fn(*args)
            except JournalUnwritable as e:
                log.error("state_unwritable", error=str(e), retry_in=delay,
                          hint="is the state folder's filesystem full or read-only?")
                self.journal.make_room()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self.stopping.wait()
            if self.stopping.is_set():
                raise asyncio.CancelledError
            delay = min(STATE_BACKOFF_SECONDS, delay * 2)

    # -- success ------------------------------------------------------------------------

    async def finish(self, item: Item, markdown: str, meta: dict) -> None:
        """The outputs are durable: record it, then dispose of the original."""
        item.stage, item.output = "dispose", markdown
        await self.record(self.journal.finishing, item.job_id, markdown)
        try:
            kept = await asyncio.to_thread(self.dispose, item)
        except OSError as e:
            self.destination_failed(item, e, "archive")
            return
        await self.record(self.journal.done, item.job_id, markdown, kept,
                          meta.get("page_count"), len(meta.get("degraded_pages") or []))
        self.metrics.files.labels("degraded" if meta.get("degraded_pages") else "ok").inc()
        self.metrics.last_success.set(time.time())
        if item.claimed_mono:
            self.metrics.file_seconds.observe(time.monotonic() - item.claimed_mono)
        self.done_pages += meta.get("page_count", 0)

    def dispose(self, item: Item) -> str | None:
        """Archive, delete or put back the original (after its outputs are durable).
        Returns the relative path it was put back under (keep), else None."""
        inbox = item.inbox
        try:
            claim = item.open_claim_folder()
        except (FileNotFoundError, safefs.Blocked):
            return None  # nothing left to dispose of (recovery after a crash)
        with claim:
            if not claim.exists(item.name):
                self._tidy(item)
                return None
            how = inbox.cfg.on_success
            if how == "delete":
                claim.unlink(item.name)
                kept = None
            elif how == "archive":
                assert inbox.cfg.archive is not None
                self._archive(claim, item, inbox.cfg.archive)
                kept = None
            else:
                kept = self._put_back(claim, item)
        self._tidy(item)
        return kept

    def _put_back(self, claim: safefs.Dir, item: Item) -> str:
        inbox = item.inbox
        before = claim.lstat(item.name)  # a rename keeps size and mtime
        token = (before.st_size, before.st_mtime_ns)
        inbox.putting_back.append(token)  # before the file shows in the inbox ...
        try:
            with inbox.open_root() as root:
                folder, used = destinations.mirror(root, item.folders, inbox.perms)
                with folder:
                    # marked on the share first: no other daemon takes it back in
                    wanted = "/".join((*used, item.name))
                    self._mark(root, item, wanted, before)
                    name = destinations.move_unique(claim, item.name, folder, item.name)
                    st = folder.lstat(name)
                    put_back = "/".join((*used, name))
                    if put_back != wanted:
                        self._mark(root, item, put_back, st)
            inbox.kept.add((put_back, st.st_size, st.st_mtime_ns))
        finally:
            inbox.putting_back.remove(token)  # ... until it is in `kept`
        return put_back

    def _mark(self, root: safefs.Dir, item: Item, relpath: str,
              st: os.stat_result) -> None:
        kept_marks.mark(root, relpath, st.st_size, st.st_mtime_ns, item.inbox.perms,
                  sha256=item.sha256, instance=item.inbox.instance)

    def kept_among(self, inbox: InboxView, entries: list[SeenFile]) -> set[tuple[str, int, int]]:
        """`is_kept` for a scan's regular files at once, in the scan's thread: the
        journal asked through a connection of its own, in batches; the share's marks
        (on_success: keep) from one listing of their folder. Returns their keys
        (relpath, size, mtime_ns)."""
        keys = [key for e in entries
                if (key := (e.relpath, e.size, e.mtime_ns)) not in inbox.kept]
        if not keys:
            return set()
        try:
            journal = Journal(self.journal.path, readonly=True)
            try:
                known = journal.kept_among(str(inbox.path), keys)
            finally:
                journal.close()
        except (JournalUnwritable, JournalCorrupt):
            known = set()
        if inbox.cfg.on_success == "keep":
            rest = [k for k in keys if k not in known]
            with contextlib.suppress(OSError), inbox.open_root() as root:
                known |= kept_marks.marked_among(root, rest)
        return known

    def is_kept(self, inbox: InboxView, entry: SeenFile) -> bool:
        """A file converted with on_success: keep, unchanged since it was put back."""
        key = (entry.relpath, entry.size, entry.mtime_ns)
        # being put back (a worker thread's move, seen before it is recorded): asked
        # first, since the thread records the file in `kept` before it lets go of this
        if (entry.size, entry.mtime_ns) in inbox.putting_back or key in inbox.kept:
            return True
        try:
            known = self.journal.is_kept(str(inbox.path), *key)
        except JournalUnwritable:
            known = False
        if not known and inbox.cfg.on_success == "keep":
            known = marked_on_share(inbox, *key)  # by another daemon on the share
        if known:
            inbox.kept.add(key)
        return known

    # -- failure ------------------------------------------------------------------------

    async def fail(self, item: Item, err: errors.OcrdError) -> None:
        job = self.journal.get(item.job_id)
        attempts = job.attempts if job else 0
        try:
            dest = await asyncio.to_thread(self._move_failed, item, err, attempts)
        except OSError as e:
            item.error = err
            self.destination_failed(item, e, "failed")
            return
        await self.record(self.journal.failed, item.job_id, err.reason, str(err), dest)
        self.metrics.files.labels("failed").inc()
        log.warning("file_failed", file=item.relpath, reason=err.reason, message=str(err),
                    moved_to=dest)

    def _move_failed(self, item: Item, err: errors.OcrdError, attempts: int) -> str:
        inbox = item.inbox
        extra = {"attempts": attempts, **item.extra}
        if isinstance(err, errors.InternalError) and err.details:
            extra["traceback"] = err.details
        plain = item.own_failures >= OWN_FAILURE_TRIES
        with inbox.open_destination(inbox.cfg.failed) as root:
            folder, used = destinations.mirror(root, tuple(map(plain_name, item.folders))
                                         if plain else item.folders, inbox.perms)
            with folder:
                size = None
                try:
                    with item.open_claim_folder() as claim:
                        st = claim.lstat(item.name)
                        size = st.st_size if stat.S_ISREG(st.st_mode) else None
                        name = self._move_entry(claim, item, folder, plain)
                    extra["entry"] = "/".join((*used, name))
                except (FileNotFoundError, safefs.Blocked):
                    name = plain_name(item.name) if plain else item.name
                    extra["entry"] = "gone (not in the work area any more)"
                source = records.source(item.relpath, str(inbox.path), size, item.sha256,
                                        item.info)
                data = records.error_json(err.reason, str(err), source, time.time(), extra)
                destinations.write_error(folder, name, data, inbox.perms)
        self._tidy(item)
        return str(inbox.cfg.failed.joinpath(*used, name))

    def _move_entry(self, claim: safefs.Dir, item: Item, folder: safefs.Dir,
                    plain: bool) -> str:
        wanted = plain_name(item.name) if plain else item.name
        st = claim.lstat(item.name)
        if stat.S_ISREG(st.st_mode) or claim_same_fs(claim, folder):
            return destinations.move_unique(claim, item.name, folder, wanted, item.inbox.perms,
                                      siblings=(destinations.ERROR_SUFFIX,))
        # A link, FIFO … to another filesystem: it cannot be copied; keep what it was.
        item.extra["not_moved"] = f"a {_kind(st.st_mode)}; removed from the work area"
        if stat.S_ISLNK(st.st_mode):
            item.extra["link_target"] = names.shown(os.readlink(item.name, dir_fd=claim.fd))
        claim.unlink(item.name)
        return wanted

    def _archive(self, claim: safefs.Dir, item: Item, archive: Path) -> str:
        """The original keeps its name in archive/ (name-2 … only where taken; plain
        names where the share refused it OWN_FAILURE_TRIES times)."""
        inbox = item.inbox
        plain = item.own_failures >= OWN_FAILURE_TRIES
        folders = tuple(map(plain_name, item.folders)) if plain else item.folders
        with inbox.open_destination(archive) as root:
            folder, _used = destinations.mirror(root, folders, inbox.perms)
            with folder:
                return destinations.move_unique(claim, item.name, folder,
                                          plain_name(item.name) if plain else item.name,
                                          inbox.perms)

    def _tidy(self, item: Item) -> None:
        """Remove the item's emptied job folder from the work area."""
        try:
            with item.inbox.open_root() as root, root.walk((WORK_DIR_NAME,)) as work:
                work.remove_empty(item.claim)
        except OSError:
            pass

    # -- destinations that cannot take a file -------------------------------------------

    def destination_failed(self, item: Item, e: OSError, where: str) -> float:
        """Keep the file claimed and try again later; the inbox takes no new files
        meanwhile. A failure of this file alone is tried OWN_FAILURE_TRIES times, then
        with plain names, then failed (output_failed). Returns the delay."""
        item.retries += 1
        own = not transient(e)
        if own:
            item.own_failures += 1  # a transient failure costs the file nothing
        if own and item.own_failures > 2 * OWN_FAILURE_TRIES and where != "failed":
            item.error = errors.OutputFailed(
                f"the {where} folder does not take this file: {e.strerror or e} "
                f"({names.shown(str(getattr(e, 'filename', '') or ''))})")
        delay = min(MAX_BACKOFF_SECONDS, 2.0 ** min(item.retries, 6))
        if not own:
            item.inbox.paused_until = time.monotonic() + delay
        loop = asyncio.get_running_loop()
        self._later = [h for h in self._later if not h.cancelled()]
        self._later.append(loop.call_later(delay, self.resubmit, item))
        if e.errno in errors.DAEMON_SHORTAGE:
            log.error("resources_short", file=item.relpath, at=where,
                      error=e.strerror or str(e), retry_in=delay,
                      hint="ocrd has no file descriptor or memory to spare (LimitNOFILE= "
                      "in the unit, other processes); the file waits, nothing is failed")
            return delay
        event = "failed_folder_unwritable" if where == "failed" else "output_unwritable"
        log.error(event, file=item.relpath, folder=where,
                  error=e.strerror or str(e), path=getattr(e, "filename", None),
                  retry_in=delay, inbox_paused=not own,
                  hint="is the folder full, read-only or unmounted? ocrd pauses this "
                  "inbox and retries" if not own else "this file's name or content is "
                  "refused there; ocrd retries, then uses a plain name")
        return delay

    def cancel_pending(self) -> None:
        """Stopping: no more retries later; journal writes waiting for room give up."""
        self.stopping.set()
        for handle in self._later:
            handle.cancel()


def marked_on_share(inbox: InboxView, relpath: str, size: int, mtime_ns: int) -> bool:
    """Some daemon serving this inbox converted relpath (as it is now) and put it back."""
    try:
        with inbox.open_root() as root:
            return kept_marks.marked(root, relpath, size, mtime_ns)
    except OSError:
        return False


def claim_same_fs(a: safefs.Dir, b: safefs.Dir) -> bool:
    return os.fstat(a.fd).st_dev == os.fstat(b.fd).st_dev


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device or special file"

