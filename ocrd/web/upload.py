"""A file uploaded through the console, dropped into an inbox as a scanner would.

The browser's file name is hostile input: only its last component is kept (after `/`
or `\\`), control characters and leading dots go, and a name the inbox would ignore or
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
from typing import BinaryIO

from ocrd.config.settings import InboxConfig
from ocrd.intake.watch import Ignore
from ocrd.outputs.destinations import split_ext
from ocrd.safefs import Dir

CHUNK = 1 << 20
MAX_NAME_BYTES = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UploadError(Exception):
    """Why an upload was refused, as a sentence for a person."""


class UploadTooLarge(UploadError):
    pass


def upload_name(given: str, box: InboxConfig) -> str:
    """The name the file gets in the inbox, or UploadError."""
    name = re.split(r"[/\\]", given or "")[-1]
    name = _CONTROL.sub("", name).strip().lstrip(".").strip()
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
            raise UploadTooLarge(f"the file is larger than the console takes "
                                 f"(web.upload_max_bytes = {limit})")
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]
    if written == 0:
        raise UploadError("the file is empty")
