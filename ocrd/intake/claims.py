"""Claiming a file: a journal row first, then one rename into this daemon's work area.

The types a file passes through, and why each exists:
  Entry      (intake/watch.py)     what a scan or an event saw: name, size, mtime, inode
  Candidate  (intake/readiness.py) an entry being watched until it is ready
  Item       (work/item.py)  a claimed file: its journal row and its place in the work area
  Source     (pipeline/document.py)  the claimed file opened for one conversion
  Job        (work/journal.py)   the row that survives restarts

The row is written before the rename (state `claiming`), so a crash between the two is
settled at the next start (work/recovery.py). The rename works from the entry's folder
descriptor into a fresh job folder (`.ocrd-work/<instance>/<job>/<relpath>`), so a folder
swapped for a link is refused and two daemons on one share cannot both win. After it,
the claimed entry is compared with what was checked: an entry swapped in between (a link
for the PDF that was probed) is claimed as what it is, and fails as such.
"""

from __future__ import annotations

import os
import stat

import structlog

from ocrd import errors, safefs
from ocrd.intake.inboxes import Inbox
from ocrd.intake.watch import Entry
from ocrd.outputs import destinations
from ocrd.render.pages import DocInfo
from ocrd.work import kept
from ocrd.work.item import Item, claim_parts
from ocrd.work.journal import Journal

log = structlog.get_logger("ocrd.intake.claims")


class Claims:
    def __init__(self, journal: Journal, metrics) -> None:  # noqa: ANN001
        self.journal = journal
        self.metrics = metrics

    def claim(self, inbox: Inbox, folder: safefs.Dir, entry: Entry,
              checked: os.stat_result | None, info: DocInfo | None,
              error: errors.OcrdError | None) -> Item | None:
        """Claim entry (in `folder`, its folder in the inbox). `checked`: the stat of the
        file that was probed, to compare the claimed entry with. Returns the Item, or
        None when the entry is gone (another daemon took it). Raises JournalUnwritable
        (nothing moved) and OSError (the work area cannot be written)."""
        job_id = self.journal.open_claim(
            str(inbox.path), entry.relpath, entry.size, entry.mtime_ns,
            lambda job: Item(job, inbox, entry.relpath,
                             claim_parts(inbox, job, entry.relpath)).claim_path)
        item = Item(job_id, inbox, entry.relpath, claim_parts(inbox, job_id, entry.relpath),
                    info, error=error)
        try:
            moved = self._move_in(inbox, folder, entry, item)
        except BaseException:
            self.journal.drop(job_id)
            raise
        if not moved:
            self.journal.drop(job_id)
            log.info("claim_lost", file=entry.relpath)
            return None
        self.journal.claimed(job_id)
        self._compare(item, entry, checked)
        self.metrics.claims.inc()
        log.info("file_claimed", file=entry.relpath, inbox=str(inbox.path), size=entry.size,
                 pages=info.pages if info else None, job=job_id)
        return item

    def _move_in(self, inbox: Inbox, folder: safefs.Dir, entry: Entry, item: Item) -> bool:
        with inbox.open_work(create=True) as work, \
                work.mkdir(item.claim[1], 0o700) as job:
            dest, _ = destinations.mirror(job, item.claim[2:], destinations.Perms(0o600, 0o700))
            with dest:
                try:
                    folder.rename(item.name, dest, item.name)
                except FileNotFoundError:
                    # Gone, or another ocrd on the same share claimed it first.
                    _remove_job_folder(work, item.claim[1:])
                    return False
                except BaseException:
                    _remove_job_folder(work, item.claim[1:])
                    raise
                if not _in_place(inbox, item.folders, folder):
                    # The folder was moved out of the inbox while ocrd held it open:
                    # what was taken from it lies outside ocrd's folders. Give it back.
                    log.warning("claim_undone", file=item.relpath,
                                why="its folder left the inbox while ocrd claimed it")
                    dest.rename(item.name, folder, item.name)
                    _remove_job_folder(work, item.claim[1:])
                    return False
                if inbox.cfg.on_success == "keep" and _kept_by_another(inbox, item, dest):
                    try:
                        dest.rename(item.name, folder, item.name)
                    except OSError as e:  # its name taken meanwhile: convert it after all
                        log.warning("claim_kept", file=item.relpath, error=str(e))
                        return True
                    log.info("claim_undone", file=item.relpath,
                             why="another daemon on the share converted it and put it "
                             "back (on_success: keep)")
                    _remove_job_folder(work, item.claim[1:])
                    return False
        return True

    def _compare(self, item: Item, entry: Entry, checked: os.stat_result | None) -> None:
        """The claimed entry is what was checked? If not, it was swapped in between:
        a link or device is failed as one; another regular file is converted as new."""
        try:
            with item.open_claim_folder() as folder:
                st = folder.lstat(item.name)
        except OSError:
            return  # the conversion will find out, and fail it as vanished
        if not stat.S_ISREG(st.st_mode):
            if entry.regular:
                log.warning("claim_swapped", file=item.relpath,
                            why="the file was replaced by a link or special file while "
                            "ocrd checked it")
            item.info = None
            item.error = errors.NotRegularFile(
                "not a regular file (a symbolic link, FIFO, socket or device); ocrd never "
                "follows links out of an inbox — copy the document itself into the inbox")
            return
        if not entry.regular:
            # A link when it was seen, a regular file by the time it was claimed.
            item.info = None
            item.error = None
            return
        if checked is not None and (st.st_dev, st.st_ino) != (checked.st_dev, checked.st_ino):
            log.warning("claim_swapped", file=item.relpath,
                        why="another file took the name while ocrd checked it; it is "
                        "checked again")
            item.info = None
            item.error = None


def _in_place(inbox: Inbox, folders: tuple[str, ...], folder: safefs.Dir) -> bool:
    """The open folder is (still) the inbox's folder at that path."""
    try:
        with inbox.open_root() as root, root.walk(folders) as now:
            a, b = os.fstat(now.fd), os.fstat(folder.fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _kept_by_another(inbox: Inbox, item: Item, claimed: safefs.Dir) -> bool:
    """The file just claimed is an original that a daemon on the share converted and
    put back (its mark is written before the original reappears: after a claim that
    won the rename, the mark is there if it ever will be)."""
    try:
        st = claimed.lstat(item.name)
        with inbox.open_root() as root:
            done = kept.marked(root, item.relpath, st.st_size, st.st_mtime_ns)
    except OSError:
        return False
    if done:
        inbox.kept.add((item.relpath, st.st_size, st.st_mtime_ns))
    return done


def _remove_job_folder(work: safefs.Dir, parts: tuple[str, ...]) -> None:
    """The job folder (and mirrored subfolders) of a claim that did not happen."""
    work.remove_empty(parts)
