"""File names are bytes: any byte but `/` and NUL. Python gives them to ocrd as str, the
bytes that are not UTF-8 carried as lone surrogates (U+DC80–U+DCFF, `surrogateescape`).
Such a str cannot be encoded as UTF-8 — not into SQLite, a JSON file, a Markdown link
or a log line — so every place a name leaves Python goes through here.

- `shown(name)`: a readable, valid-UTF-8 form for logs and people (`bad\\xff.pdf`).
- `printable(text)`: what a terminal or a page shows: `shown`, and control characters
  (ESC, BEL, newlines, the bidirectional overrides …) escaped, so that a name can
  neither drive a terminal nor forge a line of output.
- `to_db(name)` / `from_db(value)`: stored as TEXT when it is UTF-8 (readable with the
  sqlite3 shell, and what older journals hold), as a BLOB of its bytes when not.
- `json_bytes(obj)`: JSON text, valid UTF-8, where a name's undecodable bytes become
  `\\udcXX` escapes; Python's json reads the same str back.
- `number(text)`: the whole number a name (or a header, a form field, an argument)
  writes in ASCII digits, or None: `str.isdigit()` says yes to "²", which int() refuses.
"""

from __future__ import annotations

import json
import os
import unicodedata
from typing import Any

# int() refuses a decimal string longer than sys.get_int_max_str_digits() (4300)
MAX_DIGITS = 4000


def number(text: str) -> int | None:
    """The whole number `text` is, written in ASCII digits 0-9 and nothing else (no sign,
    no space, at most MAX_DIGITS of them); None for anything else ("²", "٣", "", "-1")."""
    if text.isascii() and text.isdigit() and len(text) <= MAX_DIGITS:
        return int(text)
    return None


def utf8(name: str) -> bool:
    """True when the name is valid UTF-8 (no escaped bytes)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def raw(name: str) -> bytes:
    return os.fsencode(name)


def nbytes(name: str) -> int:
    """The name's length in bytes, as the filesystem counts it."""
    return len(name.encode("utf-8", "surrogateescape"))


def shown(name: str) -> str:
    if utf8(name):
        return name
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Format characters that reorder or hide text (bidirectional embeddings, overrides and
# isolates): "invoice\u202efdp.exe" shows as "invoiceexe.pdf".
_BIDI = set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A)) | {0x200E, 0x200F, 0x061C}


def _escaped(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def is_control(ch: str) -> bool:
    """A character `printable` escapes: a control character, a line or paragraph
    separator, or one that reorders text (bidirectional overrides …)."""
    return unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ord(ch) in _BIDI


def printable(text: str) -> str:
    """`shown(text)` with control characters escaped (`scan\\x1b[2J.pdf`, `a\\nb.pdf`)."""
    text = shown(text)
    if text.isprintable():
        return text
    return "".join(_escaped(ch) if is_control(ch) else ch for ch in text)


def to_db(name: str) -> str | bytes:
    return name if utf8(name) else name.encode("utf-8", "surrogateescape")


def from_db(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def json_bytes(obj: Any) -> bytes:
    text = json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
    # A lone surrogate can only stand inside a JSON string; there "\udcff" is a valid
    # escape, and the text stays valid UTF-8.
    return text.encode("utf-8", "backslashreplace")
