"""Model output is untrusted text: cleaned once where it enters the pipeline, and made
inert before it is saved — one allowlist of the HTML it may keep, shared by the outbox's
Markdown and the console that shows it.

`clean` turns what no file should hold (lone surrogates, NUL and other control
characters) into U+FFFD. `inert_markdown` keeps the page's Markdown and the table tags
DeepSeek-OCR-2 writes, and makes everything active inert: any other HTML tag, comment or
autolink is escaped (`&lt;script>` reads as the text it is), table tags keep only their
numeric span attributes, and a link or image whose target is a script, a local file or
data (`javascript:`, `file:`, `data:` …), or an image or path that leaves the outbox
(`../../etc/passwd`, `/etc/passwd`, `https://…` for an image), is broken into plain text.
Both are linear in the text.
"""

from __future__ import annotations

import html
import re
from urllib.parse import unquote

# ---- the one allowlist --------------------------------------------------------------

# Raw HTML the model may write into a page (DeepSeek-OCR-2 writes tables as HTML).
RAW_TAGS = frozenset({"table", "thead", "tbody", "tfoot", "tr", "td", "th", "br"})
# Tags and attributes of the HTML the console shows (Markdown rendered, then cleaned by
# nh3); raw tags keep only these attributes, and only with a number as their value.
TAGS = frozenset({"p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em",
                  "del", "s", "code", "pre", "blockquote", "ul", "ol", "li", "a", "img",
                  "table", "thead", "tbody", "tfoot", "tr", "th", "td", "sup", "sub",
                  "span"})
ATTRIBUTES: dict[str, frozenset[str]] = {
    "a": frozenset({"href", "title"}), "img": frozenset({"src", "alt", "class"}),
    "ol": frozenset({"start"}), "td": frozenset({"colspan", "rowspan"}),
    "th": frozenset({"colspan", "rowspan"}), "span": frozenset({"class"})}
# Where a link may lead; an image never leaves the outbox.
URL_SCHEMES = frozenset({"http", "https", "mailto"})

# ---- clean: once, where model text enters ---------------------------------------------

# Lone surrogates (valid in JSON, not in UTF-8), NUL, and the C0/C1 control characters a
# terminal or viewer could act on; tab, line feed, vertical tab, form feed and carriage
# return stay (they are whitespace).
_UNCLEAN = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def clean(text: str) -> str:
    """`text` with every lone surrogate, NUL and control character as U+FFFD."""
    return _UNCLEAN.sub("\ufffd", text)


# ---- inert Markdown ---------------------------------------------------------------------

# A tag (name, attributes), or any other '<' a renderer could read as HTML's start
# (a tag, comment, declaration, processing instruction or autolink), with the backslash
# that may escape it.
_HTML = re.compile(r"\\?<(?:(/?)([A-Za-z][A-Za-z0-9-]*)((?:[\s/][^<>]*)?)>|(?=[A-Za-z/!?]))")
_NUMERIC_ATTRIBUTE = re.compile(r"([A-Za-z-]+)\s*=\s*[\"']?(\d{1,4})(?![\d\w])")
# An inline link's or image's target follows "](" (blanks and one line break allowed);
# a reference definition's follows "]:".
_TARGET_AFTER = re.compile(r"\](\(|:)[ \t]*(?:\r?\n[ \t]*)?")
# CommonMark's link destination: <...> on one line, or characters other than blanks and
# controls with balanced parentheses (one level here; deeper counts as unsafe).
_ANGLE_TARGET = re.compile(r"<([^<>\n\\]|\\.)*>")
_PLAIN_TARGET = re.compile(r"(?:[^\s()\\\x00-\x1f]|\\.|\((?:[^\s()\\\x00-\x1f]|\\.)*\))*")
_BACKSLASH_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
_URL_NOISE = re.compile(r"[\t\n\r]")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
# How far back the '[' of an image's "![" is looked for.
_MAX_LINK_TEXT = 2000


def inert_markdown(markdown: str) -> str:
    """The page's Markdown with nothing active left in it (see the module's docstring)."""
    return _HTML.sub(_inert_tag, _inert_links(markdown))


def _inert_tag(m: re.Match[str]) -> str:
    name = m.group(2)
    if name is not None and name.lower() in RAW_TAGS:
        lead = m.group(0)[:m.group(0).index("<")]  # a backslash in front stays
        return lead + _rebuilt_tag(name.lower(), m.group(1), m.group(3))
    # what follows '<' stays as text: '&lt;' is inert in Markdown, in HTML and in code
    return "&lt;" + m.group(0)[m.group(0).index("<") + 1:]


def _rebuilt_tag(name: str, closing: str, attributes: str) -> str:
    if closing:
        return f"</{name}>"
    allowed = ATTRIBUTES.get(name, frozenset())
    kept = [f'{k.lower()}="{v}"' for k, v in _NUMERIC_ATTRIBUTE.findall(attributes)
            if k.lower() in allowed]
    return "<" + " ".join([name, *dict.fromkeys(kept)]) + ">"


def _inert_links(markdown: str) -> str:
    """Links and images whose target is not allowed, broken into text: "](" becomes
    "]&#40;" (a reference definition's "]:" becomes "]&#58;"), which shows the same."""
    if "]" not in markdown:
        return markdown
    out: list[str] = []
    pos = 0
    for m in _TARGET_AFTER.finditer(markdown):
        inline = m.group(1) == "("
        target = _target_at(markdown, m.end())
        if target is not None and _allowed_target(
                target, image=not inline or _is_image(markdown, m.start())):
            continue
        out.append(markdown[pos:m.start()])
        out.append("]&#40;" if inline else "]&#58;")
        pos = m.start() + 2
    out.append(markdown[pos:])
    return "".join(out)


def _target_at(text: str, at: int) -> str | None:
    """The link destination that starts at `at`, or None where it cannot be read the
    way a renderer would (then it counts as unsafe)."""
    if text.startswith("<", at):
        m = _ANGLE_TARGET.match(text, at)
        return m.group(0)[1:-1] if m else None
    m = _PLAIN_TARGET.match(text, at)
    assert m is not None  # the pattern matches the empty string
    after = text[m.end():m.end() + 1]
    if after and not (after == ")" or after.isspace()):
        return None  # stopped early (deeper parentheses, a control character)
    return m.group(0)


def _allowed_target(target: str, image: bool) -> bool:
    """A link may go to http(s) and mailto, or to a path that stays in the outbox; an
    image only to such a path."""
    url = html.unescape(_BACKSLASH_ESCAPE.sub(r"\1", html.unescape(target)))
    url = _URL_NOISE.sub("", url).strip("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c"
                                       "\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18"
                                       "\x19\x1a\x1b\x1c\x1d\x1e\x1f\x20")
    scheme = _SCHEME.match(url)
    if scheme is not None:
        return not image and scheme.group(1).lower() in URL_SCHEMES
    path = unquote(url).replace("\\", "/")
    if path.startswith("/") or ":" in path.split("/", 1)[0]:
        return False  # absolute, another host (//host), or a drive (c:)
    return ".." not in path.split("?", 1)[0].split("#", 1)[0].split("/")


def _is_image(text: str, close: int) -> bool:
    """Whether the "]" at `close` ends an image's "![...]" (when that cannot be told
    cheaply, as with brackets inside the text, it counts as one: the stricter rule)."""
    open_ = text.rfind("[", max(0, close - _MAX_LINK_TEXT), close)
    if open_ < 0 or text.find("]", open_ + 1, close) >= 0 or _escaped(text, open_):
        return True
    return open_ > 0 and text[open_ - 1] == "!" and not _escaped(text, open_ - 1)


def _escaped(text: str, at: int) -> bool:
    """Whether the character at `at` follows a backslash (one, or any odd number)."""
    start = at
    while start > 0 and text[start - 1] == "\\":
        start -= 1
    return (at - start) % 2 == 1
