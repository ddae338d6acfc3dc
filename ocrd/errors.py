"""Why a file could not be converted: one exception per failure a user can meet.

Each carries a stable reason code (written to `failed/NAME.error.json` and the sidecar),
a sentence for a human, and the exit code `ocrd convert` uses for that class of failure.
"""

from __future__ import annotations

import errno
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    MIXED_FAILURES = 1  # several files failed for different classes of reason
    USAGE = 2  # bad command line or configuration
    BAD_INPUT = 3  # empty, truncated, unsupported or unreadable file
    ENCRYPTED = 4
    LIMITS = 5  # too many pages, too large
    ENGINE = 6  # the OCR engine failed or is unavailable
    OUTPUT = 7  # the result could not be written
    INTERRUPTED = 130


class OcrdError(Exception):
    """A failure of one file. `reason` is a stable code; the message is for a human."""

    reason = "error"
    exit_code = ExitCode.BAD_INPUT
    # the file may still be being written (its end missing): readiness judges it only
    # once it has stopped changing (ocrd/intake/readiness.py)
    cut_short = False

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class EmptyFile(OcrdError):
    reason = "empty"
    cut_short = True


class Truncated(OcrdError):
    reason = "truncated"
    cut_short = True


class UnsupportedFormat(OcrdError):
    reason = "unsupported_format"


class Damaged(OcrdError):
    """A complete file (its end is there) that still cannot be read."""

    reason = "damaged"


class Unreadable(OcrdError):
    reason = "unreadable"


class NotRegularFile(OcrdError):
    reason = "not_a_regular_file"


class Encrypted(OcrdError):
    reason = "encrypted"
    exit_code = ExitCode.ENCRYPTED


class TooManyPages(OcrdError):
    reason = "too_many_pages"
    exit_code = ExitCode.LIMITS


class TooLarge(OcrdError):
    reason = "too_large"
    exit_code = ExitCode.LIMITS


class RenderFailed(OcrdError):
    reason = "render_failed"


class PageTooSmall(OcrdError):
    """A page whose own size is too small to hold text (1×1 pt): a blank page of the
    document, never a failure of the file."""

    reason = "page_too_small"


class EngineFailed(OcrdError):
    """A page could not be converted by the engine after all retries."""

    reason = "engine_failed"
    exit_code = ExitCode.ENGINE


class OutputFailed(OcrdError):
    """An output could not be written: the result as a whole (the outbox refused it),
    or — `output` names it — one output asked for besides the Markdown (`ocrd convert
    --pdf`: the Markdown was written, the searchable PDF was not)."""

    reason = "output_failed"
    exit_code = ExitCode.OUTPUT

    def __init__(self, message: str, *, output: str | None = None) -> None:
        super().__init__(message)
        self.output = output


class TooManyAttempts(OcrdError):
    """The file was started too often without finishing (it may crash the daemon)."""

    reason = "too_many_attempts"


class InternalError(OcrdError):
    """A failure of ocrd itself (or of a library it calls) on this file: the file fails
    with it, the others go on. `details` is the traceback, for the error file."""

    reason = "internal_error"

    def __init__(self, message: str, *, details: str | None = None) -> None:
        super().__init__(message)
        self.details = details


def internal(e: BaseException, doing: str) -> InternalError:
    """An unexpected exception met while `doing` something with one file."""
    import traceback

    text = "".join(traceback.format_exception(e)).strip()
    detail = str(e).strip().splitlines()
    what = f"{type(e).__name__}: {detail[0][:200]}" if detail else type(e).__name__
    return InternalError(f"internal error while {doing} ({what})", details=text)
# Every reason a failed file can carry (error.json's `reason`; docs/output.md, "Failure reasons"):
# the classes' above, and those the daemon gives without raising one.
REASONS: tuple[str, ...] = (
    "empty", "truncated", "damaged", "unsupported_format", "encrypted", "too_many_pages",
    "too_large", "unreadable", "not_a_regular_file", "render_failed", "engine_failed",
    "too_many_attempts", "vanished", "not_claimed", "output_failed", "internal_error")
# Reasons of a page, never of a file (the sidecar's pages[].reason).
PAGE_REASONS: tuple[str, ...] = ("page_too_small",)


# Not failures of a file: conditions of the engine that the daemon waits out or dies of.


class EngineUnavailable(Exception):
    """The engine cannot take work right now (server down, overloaded). Not the page's
    fault: the page goes back to the queue and intake pauses until the engine is back."""


class EngineDead(Exception):
    """The engine is gone for good in this process (vLLM's EngineDeadError). The daemon
    leaves pages claimed and exits non-zero so that systemd restarts it."""


# errno values that say the daemon or the machine is short of something — descriptors,
# memory, disk space — never that a file is bad: the work waits and resumes.
SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC, errno.EDQUOT})
# the part of SHORTAGE that is the daemon's own (not a destination's disk)
DAEMON_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


# errno values that say a destination as a whole cannot take files now (full,
# read-only, unmounted, refusing) or the daemon is short of something: "not now", never
# "not this file". Every output of a file meets them alike: the file waits.
NOT_NOW = SHORTAGE | {
    errno.EROFS, errno.EIO, errno.ENOENT, errno.EACCES, errno.EPERM, errno.ESTALE,
    errno.ENOTCONN, errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.EHOSTDOWN,
    errno.ENODEV, errno.ENXIO}


def not_now(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in NOT_NOW


def shortage(e: BaseException) -> bool:
    """An OSError that means "not now", not "not this file"."""
    return isinstance(e, OSError) and e.errno in SHORTAGE


def exit_code_for(errors: list[OcrdError]) -> ExitCode:
    """One failure class → its own exit code; several classes → MIXED_FAILURES."""
    codes = {e.exit_code for e in errors}
    if not codes:
        return ExitCode.OK
    if len(codes) == 1:
        return codes.pop()
    return ExitCode.MIXED_FAILURES
