"""What the files beside the results say: the sidecar (NAME.json) and the error file
(NAME.pdf.error.json). Both carry a `schema_version`, ISO-8601 UTC timestamps and the same
`source` object; schemas/sidecar.schema.json and schemas/error.schema.json describe them.
A change that breaks a reader of either file raises its schema_version.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol

from ocrd import __version__, names

SIDECAR_SCHEMA_VERSION = 1
ERROR_SCHEMA_VERSION = 1


class _Info(Protocol):  # pages.DocInfo, without importing the renderers here
    format: str
    renderer: str


def iso(t: float | None) -> str | None:
    """A time.time() value as ISO 8601 in UTC, to the millisecond: 2026-12-01T21:59:03.123Z."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def local_time(t: float | None, seconds: bool = True) -> str:
    """A time.time() value in this machine's time zone, the zone named, for people:
    2026-12-01 22:59:03 CET (to the minute without `seconds`); "" for none."""
    if not t:
        return ""
    moment = datetime.fromtimestamp(t).astimezone()
    zone = moment.strftime("%Z") or moment.strftime("UTC%z")
    return moment.strftime("%Y-%m-%d %H:%M" + (":%S" if seconds else "")) + " " + zone


def source(path: str, inbox: str | None, size: int | None = None, sha256: str | None = None,
           info: _Info | None = None) -> dict[str, Any]:
    """The document a result or a failure is about; every key is always there (null when
    not known, e.g. a file that failed before it was hashed or recognised)."""
    return {"path": path, "inbox": inbox, "size": size, "sha256": sha256,
            "format": info.format if info else None,
            "renderer": info.renderer if info else None}


def page(result: dict[str, Any]) -> dict[str, Any]:
    """A page's entry in the sidecar: its result without the text, times in ISO 8601."""
    out = {k: v for k, v in result.items() if k != "markdown"}
    for key in ("started_at", "finished_at"):
        if key in out:
            out[key] = iso(out[key] or None)
    return out


def error_json(reason: str, message: str, source: dict[str, Any], failed_at: float,
               extra: dict[str, Any] | None = None) -> bytes:
    body = {"schema_version": ERROR_SCHEMA_VERSION, "ocrd_version": __version__,
            "reason": reason, "message": message, "source": source,
            "time": iso(failed_at), **(extra or {})}
    return names.json_bytes(body)
