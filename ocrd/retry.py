"""Retry: a failed original goes back into its inbox, under its original relative path,
and the daemon takes it in again through its normal intake (gate, claim, convert).

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
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import structlog

from . import outbox
from .config import Config, InboxConfig
from .journal import FileFilter, Job, Journal
from .names import shown

log = structlog.get_logger("ocrd.retry")


class RetryError(Exception):
    """Why a failed file cannot be put back, as a sentence for a person."""


def retry_job(cfg: Config, journal: Journal, job: Job) -> Path:
    """Put the failed original of `job` back into its inbox; returns where it went."""
    if job.state != "failed":
        raise RetryError(f"{shown(job.relpath)} has not failed (state: {job.state})")
    box = _inbox_of(cfg, job)
    original = _failed_original(box, job)
    rel = PurePosixPath(job.relpath)
    perms = outbox.Perms(box.mode, box.dmode, box.gid, tag=f"retry{os.getpid()}")
    try:
        folder = outbox.makedirs(box.path, rel.parent if rel.parent.parts else None, perms)
        dest = outbox.move_unique(original, folder, rel.name, perms)
    except FileNotFoundError:
        raise RetryError(f"{shown(job.relpath)}: the original left the failed folder "
                         "meanwhile (retried by someone else?)") from None
    except (OSError, outbox.UnsafePath) as e:
        raise RetryError(f"{shown(job.relpath)}: cannot put it back into "
                         f"{shown(str(box.path))}: {e}") from None
    error_json = original.with_name(outbox.fit_name(original.name, ".error.json"))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(error_json)
    if not journal.mark_retried(job.id, str(dest)):
        log.warning("retry_row_changed", id=job.id, file=shown(job.relpath))
    log.info("file_retried", id=job.id, file=shown(job.relpath), reason=job.reason,
             put_back=shown(str(dest)))
    return dest


def _inbox_of(cfg: Config, job: Job) -> InboxConfig:
    for box in cfg.inboxes:
        if str(box.path) == job.inbox:
            return box
    raise RetryError(f"{shown(job.relpath)}: its inbox {shown(job.inbox)} is no longer "
                     "in the configuration")


def _failed_original(box: InboxConfig, job: Job) -> Path:
    """The failed copy the journal points at, checked to be a regular file inside the
    inbox's failed folder (a row is data, and a link there could lead anywhere)."""
    if not job.output:
        raise RetryError(f"{shown(job.relpath)}: no original was kept ({job.reason}); "
                         "drop the file into the inbox again")
    path = Path(job.output)
    root = os.path.abspath(box.failed)
    if os.path.commonpath([root, os.path.abspath(path)]) != root or path == Path(root):
        raise RetryError(f"{shown(job.relpath)}: {shown(job.output)} is not inside the "
                         f"failed folder {shown(str(box.failed))}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise RetryError(f"{shown(job.relpath)}: the original is no longer in the failed "
                         f"folder ({shown(job.output)})") from None
    if not stat.S_ISREG(st.st_mode):
        raise RetryError(f"{shown(job.relpath)}: {shown(job.output)} is not a regular file")
    return path


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
