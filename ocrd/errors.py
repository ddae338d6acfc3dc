"""Why a file could not be converted: one exception per failure a user can meet.

Each carries a stable reason code (written to `failed/NAME.error.json` and the sidecar),
a sentence for a human, and the exit code `ocrd convert` uses for that class of failure.
"""

from __future__ import annotations

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

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class EmptyFile(OcrdError):
    reason = "empty"


class Truncated(OcrdError):
    reason = "truncated"


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


class EngineFailed(OcrdError):
    """A page could not be converted by the engine after all retries."""

    reason = "engine_failed"
    exit_code = ExitCode.ENGINE


class OutputFailed(OcrdError):
    reason = "output_failed"
    exit_code = ExitCode.OUTPUT


class TooManyAttempts(OcrdError):
    """The file was started too often without finishing (it may crash the daemon)."""

    reason = "too_many_attempts"


# Every reason a failed file can carry (error.json's `reason`; README, "Failure reasons"):
# the classes' above, and those the daemon gives without raising one.
REASONS: tuple[str, ...] = (
    "empty", "truncated", "damaged", "unsupported_format", "encrypted", "too_many_pages",
    "too_large", "unreadable", "not_a_regular_file", "render_failed", "engine_failed",
    "too_many_attempts", "vanished", "not_claimed", "output_failed", "internal_error")


# Not failures of a file: conditions of the engine that the daemon waits out or dies of.


class EngineUnavailable(Exception):
    """The engine cannot take work right now (server down, overloaded). Not the page's
    fault: the page goes back to the queue and intake pauses until the engine is back."""


class EngineDead(Exception):
    """The engine is gone for good in this process (vLLM's EngineDeadError). The daemon
    leaves pages claimed and exits non-zero so that systemd restarts it."""


def exit_code_for(errors: list[OcrdError]) -> ExitCode:
    """One failure class → its own exit code; several classes → MIXED_FAILURES."""
    codes = {e.exit_code for e in errors}
    if not codes:
        return ExitCode.OK
    if len(codes) == 1:
        return codes.pop()
    return ExitCode.MIXED_FAILURES
