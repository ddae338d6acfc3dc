"""`ocrd convert`'s run: the files given, and the documents in the folders given (walked
as an inbox is, their subfolders mirrored in the output folder), each to exactly one
outcome — converted, or failed with a reason — and a summary line at the end.

Nothing one file does (a damaged document, a bug met on it) reaches the others: every
failure, expected or not, becomes that file's outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from ocrd import errors, safefs
from ocrd.config.settings import BUILTIN_IGNORE, Config
from ocrd.errors import OcrdError
from ocrd.outputs import destinations

if TYPE_CHECKING:
    from ocrd.pipeline.document import Converter
    from ocrd.pipeline.progress import Progress

log = structlog.get_logger("ocrd.convert")


@dataclass(frozen=True)
class Job:
    """One file to convert: where it is, and where its outputs go."""

    path: Path  # as shown to the user
    folders: tuple[str, ...] = ()  # subfolders of the output folder (a walked folder's)
    walked: bool = False  # found in a folder: never opened through a link

    @property
    def name(self) -> str:
        return "/".join((*self.folders, self.path.name))


@dataclass
class Outcome:
    job: Job
    error: OcrdError | None = None
    degraded: bool = False


def jobs_for(paths: list[Path], output: Path) -> list[Job]:
    """The files to convert: each file given, and every document in each folder given
    (recursively, skipping what an inbox skips: dotfiles, partial downloads, OS junk —
    and the output folder itself where it lies inside)."""
    from ocrd.intake.watch import Ignore

    ignore = Ignore.rules(BUILTIN_IGNORE, ["*"])
    out = os.path.realpath(output)
    jobs: list[Job] = []
    for path in paths:
        if not path.is_dir():
            jobs.append(Job(path))
            continue
        found = []
        for entry in _walk(path, ignore):
            if _inside(os.path.realpath(path / entry), out):
                continue
            *folders, _name = entry.split("/")
            found.append(Job(path / entry, tuple(folders), walked=True))
        jobs += sorted(found, key=lambda j: j.path)
    return jobs


def _walk(folder: Path, ignore: Any) -> list[str]:
    from ocrd.intake.watch import scan

    problems: list[str] = []
    entries = [e.relpath for e in scan(folder, True, ignore,
                                       lambda f, e: problems.append(f"{f}: {e.strerror}"))]
    for problem in problems:
        log.warning("folder_unreadable", folder=problem)
    return entries


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def summary(outcomes: list[Outcome]) -> str:
    """'6 converted (1 with degraded pages), 4 failed: 2 encrypted, 1 damaged, 1 truncated'."""
    ok = [o for o in outcomes if o.error is None]
    failed = Counter(o.error.reason + (f" ({output})" if (output := getattr(
        o.error, "output", None)) else "") for o in outcomes if o.error is not None)
    degraded = sum(o.degraded for o in ok)
    text = f"{len(ok)} converted"
    if degraded:
        text += f" ({degraded} with degraded pages)"
    if failed:
        kinds = ", ".join(f"{n} {reason}" for reason, n in
                          sorted(failed.items(), key=lambda kv: (-kv[1], kv[0])))
        text += f", {sum(failed.values())} failed: {kinds}"
    return text


class Batch:
    """The files of one `ocrd convert`, through one converter, each to its outcome."""

    def __init__(self, cfg: Config, args: argparse.Namespace, converter: Converter,
                 progress: Progress) -> None:
        self.cfg = cfg
        self.args = args
        self.converter = converter
        self.progress = progress
        self.perms = destinations.Perms(tag=f"cli{os.getpid()}")
        self.limit = asyncio.Semaphore(cfg.schedule.max_active_documents)
        # the outputs asked for besides the Markdown (--pdf, --hocr)
        self.outputs = [name for name in ("pdf", "hocr") if getattr(args, name, False)]

    async def run(self, jobs: list[Job]) -> list[Outcome]:
        return list(await asyncio.gather(*(self.one(job) for job in jobs)))

    async def one(self, job: Job) -> Outcome:
        async with self.limit:
            t0 = time.monotonic()
            try:
                outcome = await self._convert(job, t0)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - one file must never end the run
                log.exception("internal_error", file=str(job.path))
                outcome = Outcome(job, errors.internal(e, "converting the file"))
                self.progress.done(job.path, _failed(outcome.error))
            return outcome

    async def _convert(self, job: Job, t0: float) -> Outcome:
        try:
            fd = _open(job)
        except OcrdError as e:
            self.progress.done(job.path, _failed(e))
            return Outcome(job, e)
        try:
            return await self._convert_open(job, fd, t0)
        finally:
            os.close(fd)

    async def _convert_open(self, job: Job, fd: int, t0: float) -> Outcome:
        from ocrd.pipeline.source import Source

        src = Source(fd, job.name, prompt_mode=self.args.prompt)
        try:
            with safefs.Dir.open_root(self.args.output, create=True) as root:
                out, _used = destinations.mirror(root, job.folders, self.perms)
                with out:
                    src.outputs = tuple(self.outputs)
                    src.output_settings = _output_settings(self.args, job.path, out)
                    written = await self.converter.convert(src, out, self.perms)
        except OcrdError as e:
            self.progress.done(job.path, _failed(e))
            return Outcome(job, e)
        except errors.EngineDead as e:
            err = errors.EngineFailed(str(e))
            self.progress.done(job.path, _failed(err))
            return Outcome(job, err)
        except OSError as e:
            err = errors.OutputFailed(f"cannot write the result: {e}")
            self.progress.done(job.path, _failed(err))
            return Outcome(job, err)
        meta = written.meta
        n = meta["page_count"]
        done = f"{written.folder / written.markdown} ({n} page{'s' * (n != 1)}, " \
            f"{time.monotonic() - t0:.1f} s)"
        for name in self.outputs:  # asked for, and missing: a failure of the file
            why = meta["outputs"].get(f"{name}_failed")
            if why:
                err = errors.OutputFailed(f"{why}; the Markdown was written: {done}",
                                          output=name)
                self.progress.done(job.path, _failed(err))
                return Outcome(job, err)
        self.progress.done(job.path, f"ok → {done}")
        return Outcome(job, degraded=bool(meta["degraded_pages"]))


def _failed(e: OcrdError) -> str:
    return f"FAILED [{e.reason}] {e}"


def _open(job: Job) -> int:
    """The file, opened once for reading (one found in a folder: never through a link)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if job.walked else 0)
    try:
        return os.open(job.path, flags)
    except OSError as e:
        if e.errno == 40:  # ELOOP: a link found in a folder
            raise errors.NotRegularFile("a symbolic link; ocrd does not follow links found "
                                        "in a folder (give the file itself)") from None
        raise errors.Unreadable(f"cannot open the file: {e.strerror}") from None


def _output_settings(args: argparse.Namespace, path: Path, out: Any) -> Any:
    """The outputs' settings for one file: --pdf-text-layer; NAME.pdf, or NAME.ocr.pdf
    for a PDF converted into the folder it is in."""
    from ocrd.outputs.searchable_pdf import BESIDE_ORIGINAL_SUFFIX, DEFAULT_SUFFIX, same_folder
    from ocrd.outputs.writers import Settings

    beside = path.suffix.lower() == ".pdf" and same_folder(out, str(path))
    return Settings(args.pdf_text_layer, BESIDE_ORIGINAL_SUFFIX if beside else DEFAULT_SUFFIX)
