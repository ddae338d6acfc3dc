"""One claimed file's turn: count the attempt, open the claimed file (once, by its
folder descriptor), convert it into its outbox folder, and hand it to its outcome.

This is what the scheduler runs for each Item. The attempt limit lives here: a file
started `max_attempts` times without finishing (the daemon died on it each time) fails
as too_many_attempts instead of taking the daemon down again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import Callable

import structlog

from ocrd import errors, safefs
from ocrd.config.roots import RootChanged
from ocrd.config.settings import Config
from ocrd.outputs import destinations
from ocrd.pipeline.document import Converter
from ocrd.pipeline.source import Source
from ocrd.work.item import Item
from ocrd.work.journal import Journal, JournalCorrupt, JournalUnwritable
from ocrd.work.outcomes import OWN_FAILURE_TRIES, Outcomes, plain_name

log = structlog.get_logger("ocrd.pipeline.jobs")


class Jobs:
    def __init__(self, cfg: Config, journal: Journal, converter: Converter,
                 outcomes: Outcomes, engine_dead: Callable[[errors.EngineDead], None]) -> None:
        self.cfg = cfg
        self.journal = journal
        self.converter = converter
        self.outcomes = outcomes
        self.engine_dead = engine_dead

    async def run(self, item: Item) -> None:
        """The file's turn, to its outcome: nothing it raises reaches the scheduler (a
        surprise fails this file as internal_error, with its traceback)."""
        try:
            await self._run(item)
        except (asyncio.CancelledError, errors.EngineDead):
            raise
        except Exception as e:  # noqa: BLE001 - one file must never take the daemon down
            log.exception("internal_error", file=item.relpath)
            try:
                await self.outcomes.fail(item, errors.internal(e, "finishing the file"))
            except Exception:  # noqa: BLE001 - left claimed: the next start retries it
                log.exception("internal_error_unrecorded", file=item.relpath)

    async def _run(self, item: Item) -> None:
        if isinstance(item.error, errors.Truncated):
            # It looked cut off while it might still change; claimed, it is finished:
            # read as it is (the converter repairs a PDF that can be), or fail as before.
            item.error = None
        if item.error is not None:
            await self.outcomes.fail(item, item.error)
            return
        if item.stage == "dispose":  # converted; the original could not be moved yet
            await self.outcomes.finish(item, item.output, {})
            return
        attempt = await self.outcomes.record(self.journal.start, item.job_id)
        if attempt > self.cfg.schedule.max_attempts:
            await self.outcomes.fail(item, errors.TooManyAttempts(
                f"conversion was started {attempt - 1} times without finishing (the daemon "
                "may have crashed on this file)"))
            return
        try:
            fd = self._open(item)
        except errors.OcrdError as e:
            await self.outcomes.fail(item, e)
            return
        except OSError as e:  # no descriptor to spare, the inbox unreachable …
            self._requeue(item)
            self.outcomes.destination_failed(item, e, "work area")
            return
        try:
            written = await self._convert(item, fd)
        finally:
            os.close(fd)
        if written is not None:
            await self.outcomes.finish(item, str(written.folder / written.markdown),
                                       written.meta)

    def _open(self, item: Item) -> int:
        """The claimed file, opened once: never through a link, whatever was put in the
        work area since it was claimed."""
        try:
            with item.open_claim_folder() as folder:
                return folder.open_file(item.name)
        except (FileNotFoundError, safefs.Blocked):
            raise errors.Unreadable("the claimed file disappeared from the work area",
                                    reason="vanished") from None
        except OSError as e:
            if errors.shortage(e) or isinstance(e, RootChanged):
                raise  # the daemon's trouble (or its inbox's), not the file's: it waits
            if e.errno in (errno.ELOOP, errno.EINVAL):
                raise errors.NotRegularFile(
                    "the claimed file in the work area was replaced by a link or special "
                    "file; ocrd never follows links") from None
            raise errors.Unreadable(f"the claimed file cannot be opened: {e.strerror}") \
                from None

    async def _convert(self, item: Item, fd: int):  # noqa: ANN202 - Written | None
        inbox = item.inbox
        plain = item.own_failures >= OWN_FAILURE_TRIES
        src = Source(fd, item.relpath, inbox=str(inbox.path), prompt_mode=inbox.cfg.prompt,
                     custom_prompt=inbox.cfg.custom_prompt, info=item.info,
                     same_path_replaces=inbox.cfg.on_success == "keep",
                     claimed_at=item.claimed_at or 0.0, job_id=item.job_id,
                     outputs=tuple(inbox.cfg.outputs), output_settings=inbox.cfg,
                     turns_for=self._turns)
        if plain:
            src.stem = destinations.split_ext(plain_name(item.name))[0]
        src.order = item.order
        folders = tuple(map(plain_name, item.folders)) if plain else item.folders
        try:
            with inbox.open_destination(inbox.cfg.outbox) as root:
                out_dir, _used = destinations.mirror(root, folders, inbox.perms)
                with out_dir:
                    return await self.converter.convert(src, out_dir, inbox.perms)
        except errors.EngineDead as e:
            self._requeue(item)
            self.engine_dead(e)
        except asyncio.CancelledError:
            self._requeue(item)
            log.info("file_requeued", file=item.relpath, why="stopping")
            raise
        except errors.OcrdError as e:
            item.sha256, item.info = src.sha256, src.info
            await self.outcomes.fail(item, e)
        except OSError as e:
            # The destination is full, read-only or gone, or the daemon is short of
            # descriptors or memory: not the file's fault. Keep it claimed and try again
            # later.
            self._requeue(item)
            self.outcomes.destination_failed(item, e, "outbox")
        except Exception as e:  # noqa: BLE001 - one file must never take the daemon down
            log.exception("internal_error", file=item.relpath)
            item.sha256, item.info = src.sha256, src.info
            await self.outcomes.fail(item, errors.internal(e, "converting the file"))
        return None

    def _turns(self, sha256: str) -> dict[int, int]:
        """The pages of this document a person turned by hand (the console)."""
        try:
            return self.journal.turns(sha256)
        except (JournalUnwritable, JournalCorrupt) as e:  # read as the engine sees them
            log.warning("turns_unread", error=str(e))
            return {}

    def _requeue(self, item: Item) -> None:
        with contextlib.suppress(JournalUnwritable):
            self.journal.requeue(item.job_id)
