"""Retry: a failed original goes back into its inbox, under its original relative path,
and the daemon takes it in again through its normal intake (readiness, claim, convert).

Nothing here talks to a daemon, so `ocrd retry` works whether one runs or not. The file
is moved (never copied over anything: a taken name gets `-2`, `-3` …), its `.error.json`
is removed, and its journal row becomes `retried`; the conversion that follows is a new
row. Only paths from the journal are used, and only when they lie inside the folders the
configuration names for that inbox.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path

import structlog

from ocrd import safefs
from ocrd.config.settings import Config, InboxConfig
from ocrd.names import shown
from ocrd.outputs import destinations
from ocrd.safefs import Dir
from ocrd.work.journal import FileFilter, Job, Journal, JournalUnwritable

log = structlog.get_logger("ocrd.work.retry")


class RetryError(Exception):
    """Why a failed file cannot be put back, as a sentence for a person."""


def retry_job(cfg: Config, journal: Journal, job: Job) -> Path:
    """Put the failed original of `job` back into its inbox; returns where it went."""
    if job.state != "failed":
        raise RetryError(f"{shown(job.relpath)} has not failed (state: {job.state})")
    box = _inbox_of(cfg, job)
    folders, name = _in_failed(box, job)
    inbox_folders, wanted = safefs.split(job.relpath)
    perms = destinations.Perms(box.file_mode_bits, box.dir_mode_bits, box.gid,
                         tag=f"retry{os.getpid()}")
    try:
        with Dir.open_root(box.failed) as failed, failed.walk(folders) as src:
            if not stat.S_ISREG(src.lstat(name).st_mode):
                raise RetryError(f"{shown(job.relpath)}: {shown(job.output)} is not a "
                                 "regular file")
            with Dir.open_root(box.path) as inbox:
                dest, used = destinations.mirror(inbox, inbox_folders, perms)
                with dest:
                    new = destinations.move_unique(src, name, dest, wanted, perms)
            with contextlib.suppress(FileNotFoundError):
                src.unlink(destinations.fit_name(name, destinations.ERROR_SUFFIX))
    except FileNotFoundError:
        raise RetryError(f"{shown(job.relpath)}: the original is no longer in the failed "
                         f"folder ({shown(job.output)})") from None
    except (OSError, ValueError) as e:
        raise RetryError(f"{shown(job.relpath)}: cannot put it back into "
                         f"{shown(str(box.path))}: {e}") from None
    put_back = box.path.joinpath(*used, new)
    try:
        if not journal.mark_retried(job.id, str(put_back)):
            log.warning("retry_row_changed", id=job.id, file=shown(job.relpath))
    except JournalUnwritable as e:  # the file is back all the same: it converts anew
        log.warning("retry_not_recorded", id=job.id, error=str(e))
    log.info("file_retried", id=job.id, file=shown(job.relpath), reason=job.reason,
             put_back=shown(str(put_back)))
    return put_back


def convert_again(cfg: Config, journal: Journal, job: Job) -> Path:
    """Have a converted file converted again (its outputs replaced: the same document
    from the same path): its archived original moved back into its inbox under its
    relative path; a kept one (on_success: keep) marked as changed (its modification
    time set to now), so that the daemon takes it in again. Returns where it is.
    RetryError when there is no original (on_success: delete) or it is not found."""
    if job.state != "done":
        raise RetryError(f"{shown(job.relpath)} is not converted (state: {job.state})")
    box = _inbox_of(cfg, job)
    folders, name = safefs.split(job.relpath)
    try:
        if box.on_success == "keep":
            with Dir.open_root(box.path) as inbox, inbox.walk(folders) as folder:
                st = folder.lstat(name)
                if not stat.S_ISREG(st.st_mode) or st.st_size != job.size:
                    raise FileNotFoundError(name)
                os.utime(name, ns=(st.st_atime_ns, time.time_ns()), dir_fd=folder.fd,
                         follow_symlinks=False)
            where = box.path.joinpath(*folders, name)
        elif box.on_success == "archive" and box.archive is not None:
            perms = destinations.Perms(box.file_mode_bits, box.dir_mode_bits, box.gid,
                                       tag=f"retry{os.getpid()}")
            with Dir.open_root(box.archive) as archive, archive.walk(folders) as src:
                archived = _archived_name(src, name, job.size)
                with Dir.open_root(box.path) as inbox:
                    dest, used = destinations.mirror(inbox, folders, perms)
                    with dest:
                        new = destinations.move_unique(src, archived, dest, name, perms)
            where = box.path.joinpath(*used, new)
        else:
            raise RetryError(f"{shown(job.relpath)}: its original was deleted once it was "
                             "converted (on_success: delete); drop it into the inbox again")
    except FileNotFoundError:
        raise RetryError(f"{shown(job.relpath)}: the original is no longer where ocrd left "
                         "it") from None
    except (OSError, ValueError) as e:
        raise RetryError(f"{shown(job.relpath)}: cannot put it back into "
                         f"{shown(str(box.path))}: {e}") from None
    log.info("file_converted_again", id=job.id, file=shown(job.relpath),
             put_back=shown(str(where)))
    return where


def _archived_name(folder: Dir, name: str, size: int) -> str:
    """The original's name in the archive folder: its own, or the first free name the
    archive gave it (`a-2.pdf` …), of its size."""
    stem, dot, ext = name.rpartition(".")
    for candidate in [name] + [f"{stem or ext}-{n}{dot}{ext if stem else ''}"
                               for n in range(2, 10)]:
        try:
            st = folder.lstat(candidate)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_size == size:
            return candidate
    raise FileNotFoundError(name)


def _inbox_of(cfg: Config, job: Job) -> InboxConfig:
    for box in cfg.inboxes:
        if str(box.path) == job.inbox:
            return box
    raise RetryError(f"{shown(job.relpath)}: its inbox {shown(job.inbox)} is no longer "
                     "in the configuration")


def _in_failed(box: InboxConfig, job: Job) -> tuple[tuple[str, ...], str]:
    """The failed copy the journal points at, as (folders, name) below the inbox's
    failed folder; refused when it lies anywhere else (a row is data)."""
    if not job.output:
        raise RetryError(f"{shown(job.relpath)}: no original was kept ({job.reason}); "
                         "drop the file into the inbox again")
    root, path = os.path.abspath(box.failed), os.path.abspath(job.output)
    if os.path.commonpath([root, path]) != root or path == root:
        raise RetryError(f"{shown(job.relpath)}: {shown(job.output)} is not inside the "
                         f"failed folder {shown(str(box.failed))}")
    return safefs.split(os.path.relpath(path, root))


def select(journal: Journal, *, ids: Iterable[int] = (), paths: Iterable[str] = (),
           reason: str | None = None, everything: bool = False) -> list[Job]:
    """Failed rows chosen by id, by path (the failed copy, or the path relative to the
    inbox), by failure reason, or all of them."""
    failed = FileFilter(state="failed", reason=reason)
    if everything or reason:
        return journal.find(failed, limit=-1)
    chosen: dict[int, Job] = {}
    for job_id in ids:
        job = journal.get(job_id)
        if job is not None:
            chosen[job.id] = job
    wanted = {os.path.abspath(p) for p in paths} | set(paths)
    if wanted:
        for job in journal.find(failed, limit=-1):
            if job.relpath in wanted or (job.output and os.path.abspath(job.output) in wanted):
                chosen[job.id] = job
    return sorted(chosen.values(), key=lambda j: j.id)
