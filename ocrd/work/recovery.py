"""Crash recovery, at start: how every file a previous run left behind is taken up.

1. Journal rows still open are settled: `claiming` becomes claimed (the rename happened)
   or is dropped (it did not); `finishing` (outputs durable) gets its original disposed
   of; a claimed file that is gone fails as `vanished`; the rest is queued again. Files
   that were converting when the last run died are suspects: when several were, each is
   converted alone first, so that one that really kills the daemon is caught by
   max_attempts while the others go through.
2. Files in this daemon's work area without a row (the journal was lost or damaged)
   are adopted — where their place makes sense (`<job>/<relpath>`); anything else found
   there (planted by a user of the share) goes to failed/ with a reason.
3. Work areas of earlier instance ids of this host (its state folder was deleted, so it
   got a new id) are adopted the same way. A work area of another host or of another
   state folder that still names its id belongs to a daemon that may be running: left
   alone.

4. Temporary files this daemon's crash left in an inbox's destinations (names carrying
   its tag, `.ocrd-tmp-<tag>-…`) are removed (`prepare_inbox`, also for an inbox a reload
   adds), and so are page files of dead daemons in /dev/shm (render/pool.py, RenderPool.start).

Each step works on one file at a time and logs what it did; a file it cannot settle is
logged and left, never the end of the start.
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path

import structlog

from ocrd import errors, safefs
from ocrd.names import number
from ocrd.outputs import destinations
from ocrd.work.area import OWNER_FILE, WORK_DIR_NAME, InboxView, host_id, mark_owner
from ocrd.work.item import Item, claim_parts
from ocrd.work.journal import Job, Journal
from ocrd.work.kept import KEPT_DIR
from ocrd.work.outcomes import Outcomes

log = structlog.get_logger("ocrd.work.recovery")

_FOREIGN = ("found in ocrd's work area but never claimed there (the work area is "
            "ocrd's own; put documents into the inbox itself)")


@dataclass
class Resume:
    item: Item
    exclusive: bool = False  # convert it alone (a crash suspect)


class Recovery:
    def __init__(self, journal: Journal, inboxes: dict[Path, InboxView], outcomes: Outcomes,
                 state_dir: Path, journal_fresh: bool) -> None:
        self.journal = journal
        self.inboxes = inboxes
        self.outcomes = outcomes
        self.state_dir = state_dir
        self.fresh = journal_fresh
        self.resume: list[Resume] = []
        self.fail: list[tuple[Item, errors.OcrdError]] = []

    async def run(self) -> list[Resume]:
        jobs = self.journal.open_jobs()
        suspects = {j.id for j in jobs if j.state == "converting"}
        known = {j.claim_path for j in jobs}
        for job in jobs:
            try:
                await self._settle(job, isolate=len(suspects) > 1 and job.id in suspects)
            except Exception as e:  # noqa: BLE001 - one row must not stop the start
                log.exception("recovery_failed", file=job.relpath, job=job.id, error=repr(e))
        for inbox in self.inboxes.values():
            try:
                self._adopt_work_areas(inbox, known)
            except OSError as e:
                log.error("recovery_failed", inbox=str(inbox.path), error=str(e))
        for item, err in self.fail:
            await self.outcomes.fail(item, err)
        return self.resume

    # -- open rows ------------------------------------------------------------------------

    async def _settle(self, job: Job, isolate: bool) -> None:
        inbox = self.inboxes.get(Path(job.inbox))
        if inbox is None:
            log.warning("claimed_file_of_unknown_inbox", inbox=job.inbox, file=job.relpath,
                        claim=job.claim_path)
            return
        claim = claim_location(inbox, job.claim_path, job.relpath)
        if claim is None:
            if job.state == "claiming":
                self.journal.drop(job.id)
                return
            log.error("claim_outside_work_area", file=job.relpath, claim=job.claim_path)
            self.journal.failed(job.id, "vanished", "the claim is not in the work area", "")
            return
        item = Item(job.id, inbox, job.relpath, claim, claimed_at=job.created)
        exists = _exists(item)
        if exists is None:
            # The inbox is not reachable now (an unmounted share): the claimed file is
            # not known to be gone. Queued, it waits until the inbox is back.
            log.warning("claimed_file_waits", file=job.relpath, inbox=job.inbox,
                        why="its inbox cannot be reached now")
            self.resume.append(Resume(item))
            return
        if job.state == "claiming":
            if not exists:
                self.journal.drop(job.id)
                return
            self.journal.claimed(job.id)
        if job.state == "finishing":
            await self.outcomes.finish(item, job.output or "", {})
            return
        if not exists:
            self.journal.failed(job.id, "vanished", "the claimed file disappeared from "
                                "the work area", "")
            log.error("claimed_file_missing", file=job.relpath, claim=job.claim_path)
            return
        if isolate:
            self.journal.requeue(job.id)  # not its attempt: the crash is not pinned on it
        log.info("file_resumed", file=job.relpath, attempts=job.attempts, isolated=isolate)
        self.resume.append(Resume(item, isolate))

    # -- files without rows ---------------------------------------------------------------

    def _adopt_work_areas(self, inbox: InboxView, known: set[str]) -> None:
        try:
            root = inbox.open_root()
        except OSError:
            return  # the inbox is not there now; its files wait for the next start
        with root:
            try:
                work = root.sub(WORK_DIR_NAME)
            except FileNotFoundError:
                return
            with work:
                for name in sorted(work.names()):
                    if name == KEPT_DIR:  # the share's marks of kept originals (work/kept.py)
                        continue
                    if name == inbox.instance or self._ours_to_adopt(work, name):
                        self._adopt_area(inbox, work, name, known)

    def _ours_to_adopt(self, work: safefs.Dir, instance: str) -> bool:
        """An earlier instance of this daemon on this host, whose state is gone?"""
        try:
            with work.sub(instance) as area:
                owner = json.loads(area.read_file(OWNER_FILE))
        except (OSError, ValueError):
            if self.fresh:
                log.warning("work_area_adopted_unmarked", instance=instance,
                            why="no owner mark, and this daemon's journal is new")
                return True
            return False
        if owner.get("host") != host_id():
            return False
        state = Path(owner.get("state_dir", ""))
        if state != self.state_dir:
            try:
                if (state / "instance-id").read_text().strip() == instance:
                    return False  # that daemon's state is still there: it may run
            except OSError:
                pass
        log.warning("work_area_adopted", instance=instance, state_dir=str(state))
        return True

    def _adopt_area(self, inbox: InboxView, work: safefs.Dir, instance: str,
                    known: set[str]) -> None:
        try:
            area = work.sub(instance)
        except safefs.Blocked:
            self._foreign(inbox, (), instance, known)  # a link named like a work area
            return
        with area:
            for entry in sorted(area.names()):
                if entry == OWNER_FILE:
                    continue
                st = area.lstat(entry)
                if stat.S_ISDIR(st.st_mode) and number(entry) is not None:
                    self._adopt_job(inbox, (instance, entry), known)
                else:
                    self._foreign(inbox, (instance,), entry, known)
        if instance != inbox.instance:
            _remove_owner_if_empty(work, instance)

    def _adopt_job(self, inbox: InboxView, parts: tuple[str, ...], known: set[str]) -> None:
        """Every file under a job folder, as claimed files (relpath = below the job)."""
        stack: list[tuple[str, ...]] = [()]
        with inbox.open_root() as root:
            while stack:
                sub = stack.pop()
                try:
                    folder = root.walk((WORK_DIR_NAME, *parts, *sub))
                except safefs.Blocked:
                    self._foreign(inbox, (*parts, *sub[:-1]), sub[-1], known)
                    continue
                with folder:
                    for name in sorted(folder.names()):
                        st = folder.lstat(name)
                        if stat.S_ISDIR(st.st_mode):
                            stack.append((*sub, name))
                        else:
                            self._adopt_file(inbox, (*parts, *sub), name, st, known)
            with root.walk((WORK_DIR_NAME,)) as work:
                work.remove_empty(parts)

    def _adopt_file(self, inbox: InboxView, claim: tuple[str, ...], name: str,
                    st, known: set[str]) -> None:  # noqa: ANN001
        """A claimed file without a row gets one; one in an earlier instance's work area
        is moved into this daemon's, as a claim of its own (the old area then goes)."""
        path = str(inbox.path.joinpath(WORK_DIR_NAME, *claim, name))
        if path in known:
            return
        relpath = "/".join((*claim[2:], name))
        job_id = self.journal.begin_claim(str(inbox.path), relpath, path, st.st_size,
                                          st.st_mtime_ns)
        item = Item(job_id, inbox, relpath, claim)
        if claim[0] != inbox.instance:
            item.claim = claim_parts(inbox, job_id, relpath)
            self.journal.set_claim_path(job_id, item.claim_path)
            with inbox.open_root() as root, root.walk((WORK_DIR_NAME, *claim)) as src, \
                    inbox.open_work(create=True) as work, \
                    work.mkdir(item.claim[1], 0o700) as job:
                dest, _ = destinations.mirror(job, item.claim[2:], destinations.Perms(0o600, 0o700))
                with dest:
                    src.rename(name, dest, name)
        self.journal.claimed(job_id)
        log.warning("orphan_adopted", file=relpath, claim=item.claim_path, was=path)
        self.resume.append(Resume(item))

    def _foreign(self, inbox: InboxView, claim: tuple[str, ...], name: str,
                 known: set[str]) -> None:
        """Something in the work area that ocrd did not put there: to failed/."""
        path = str(inbox.path.joinpath(WORK_DIR_NAME, *claim, name))
        if path in known:
            return
        job_id = self.journal.begin_claim(str(inbox.path), name, path, 0, 0)
        self.journal.claimed(job_id)
        log.warning("work_area_intruder", file=name, claim=path)
        item = Item(job_id, inbox, name, claim)
        self.fail.append((item, errors.OcrdError(_FOREIGN, reason="not_claimed")))


def prepare_inbox(inbox: InboxView, state_dir: Path) -> None:
    """Before an inbox is used: its work area marked as this daemon's (so that a later
    instance of this host can adopt it), and this daemon's temporary files removed
    from its destinations. Runs in a thread."""
    try:
        mark_owner(inbox, state_dir)
    except OSError as e:
        log.warning("work_area_unwritable", inbox=str(inbox.path), error=e.strerror)
    for root in inbox.cfg.destinations().values():
        removed = destinations.sweep_temporaries(root, inbox.perms.tag,
                                           lambda r=root: inbox.roots.open(r))
        if removed:
            log.info("temporaries_removed", folder=str(root), count=removed)


def claim_location(inbox: InboxView, claim_path: str, relpath: str) -> tuple[str, ...] | None:
    """The folders below .ocrd-work of a journal row's claim path, or None when the path
    is not where a claim of that relpath can be."""
    work = str(inbox.path / WORK_DIR_NAME) + "/"
    if not claim_path.startswith(work):
        return None
    parts = tuple(claim_path[len(work):].split("/"))
    rel = tuple(relpath.split("/"))
    if len(parts) < 1 + len(rel) or parts[-len(rel):] != rel:
        return None
    try:
        safefs.split("/".join(parts))
    except ValueError:
        return None
    return parts[:-1]


def _exists(item: Item) -> bool | None:
    """Whether the claimed file is in the work area; None when the inbox itself cannot
    be reached (not pinned, missing, replaced)."""
    try:
        root = item.inbox.open_root()
    except OSError:
        return None
    try:
        with root, root.walk((WORK_DIR_NAME, *item.claim)) as folder:
            folder.lstat(item.name)
    except OSError:
        return False
    return True


def _remove_owner_if_empty(work: safefs.Dir, instance: str) -> None:
    try:
        with work.sub(instance) as area:
            if set(area.names()) <= {OWNER_FILE}:
                if OWNER_FILE in area.names():
                    area.unlink(OWNER_FILE)
            else:
                return
        work.rmdir(instance)
    except OSError:
        pass
