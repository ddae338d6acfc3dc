"""A file uploaded through the console, dropped into an inbox as a scanner would.

The form's body is parsed as it arrives (`UploadForm`): its file part is taken only when
the CSRF token came before it (or with the request's headers), and only up to the limit;
nothing of a refused or oversized file stays anywhere.

The browser's file name is hostile input: only its last component is kept (after `/`
or `\\`), the characters `names.printable` would escape (control characters,
bidirectional overrides) and leading dots go, and a name the inbox would ignore or
refuse is refused here. The bytes are written under a temporary name the inbox ignores
(`.ocrd-upload-….part`), synced, then renamed into place without replacing anything: a
taken name gets `-2`, `-3` … The inbox is walked from its folder descriptor; nothing is
written anywhere else.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import AsyncGenerator, Callable
from typing import BinaryIO

from starlette.datastructures import Headers
from starlette.formparsers import MultiPartParser

from ocrd.config.settings import InboxConfig
from ocrd.intake.watch import Ignore
from ocrd.names import is_control
from ocrd.outputs.destinations import split_ext
from ocrd.safefs import Dir

CHUNK = 1 << 20
MAX_NAME_BYTES = 200


class UploadError(Exception):
    """Why an upload was refused, as a sentence for a person."""


class UploadTooLarge(UploadError):
    pass


class UploadRefused(UploadError):
    """The file came without a CSRF token before it that allows it."""


class UploadForm(MultiPartParser):
    """An upload's multipart body, parsed as it arrives. When its file part begins, the
    fields before it must allow it (`allowed(fields)`: the CSRF check), or UploadRefused
    ends the request before a byte of the file is kept; past `limit` bytes of the file,
    UploadTooLarge ends it. Either way what was spooled is closed and gone. (A browser
    sends the fields in the form's order, and the form has its token first.)"""

    def __init__(self, headers: Headers, stream: AsyncGenerator[bytes, None], limit: int,
                 allowed: Callable[[dict[str, str]], bool]) -> None:
        super().__init__(headers, stream, max_files=1, max_fields=8)
        self.limit = limit
        self.allowed = allowed
        self.file_bytes = 0

    def fields(self) -> dict[str, str]:
        return {k: v for k, v in self.items if isinstance(v, str)}

    def on_headers_finished(self) -> None:
        super().on_headers_finished()
        if self._current_part.file is not None and not self.allowed(self.fields()):
            raise UploadRefused("missing or wrong CSRF token")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._current_part.file is not None:
            self.file_bytes += end - start
            if self.file_bytes > self.limit:
                raise too_large(self.limit)
        super().on_part_data(data, start, end)


def too_large(limit: int) -> UploadTooLarge:
    return UploadTooLarge(f"The file is larger than the console takes ({limit} bytes, "
                          "web.upload_max_bytes).")


def upload_name(given: str, box: InboxConfig) -> str:
    """The name the file gets in the inbox, or UploadError."""
    name = re.split(r"[/\\]", given or "")[-1]
    name = "".join(ch for ch in name if not is_control(ch)).strip().lstrip(".").strip()
    while len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        stem, ext = split_ext(name)
        name = stem[:-1] + ext if stem else name[:-1]
    if not name or name in (".", ".."):
        raise UploadError("the file has no usable name")
    if not Ignore(box).wanted(name):
        raise UploadError(f"{name!r}: the inbox ignores files named like this "
                          "(its ignore/include settings)")
    return name


def candidates(name: str) -> list[str]:
    stem, ext = split_ext(name)
    return [name] + [f"{stem}-{n}{ext}" for n in range(2, 100)]


def save(box: InboxConfig, given_name: str, data: BinaryIO, limit: int) -> str:
    """Write the upload into the inbox's top folder; returns the name it got. Raises
    UploadError (bad name, too large, no free name) or OSError (the inbox)."""
    name = upload_name(given_name, box)
    tmp = f".ocrd-upload-{secrets.token_hex(8)}.part"
    with Dir.open_root(box.path) as inbox:
        fd = inbox.create(tmp, 0o640)
        try:
            try:
                _copy(data, fd, limit)
                os.fsync(fd)
            finally:
                os.close(fd)
            for candidate in candidates(name):
                try:
                    inbox.rename(tmp, inbox, candidate)  # never replaces an entry
                except FileExistsError:
                    continue
                inbox.fsync()
                return candidate
            raise UploadError(f"{name!r}: too many files of this name in the inbox")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                inbox.unlink(tmp)
            raise


def _copy(data: BinaryIO, fd: int, limit: int) -> None:
    written = 0
    while chunk := data.read(CHUNK):
        written += len(chunk)
        if written > limit:
            raise too_large(limit)
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]
    if written == 0:
        raise UploadError("the file is empty")
