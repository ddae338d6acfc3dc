"""A document's Markdown as safe HTML, page by page, for the review page.

The Markdown is the model's output, so it is untrusted: anything that is not Markdown or
one of the table tags DeepSeek-OCR-2 writes (`<table>`, `<tr>`, `<td>` …) is escaped and
shown as the text it is, and the HTML that comes out is cleaned once more by ammonia
(nh3) — with the allowlist of tags, attributes and link schemes that the outbox's
Markdown is held to as well (ocrd/outputs/modeltext.py). Images are shown only when they are
this document's own figure crops, through the console's asset URL.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from urllib.parse import unquote

import nh3
from markdown_it import MarkdownIt
from markdown_it.token import Token

from ocrd.outputs.modeltext import ATTRIBUTES, RAW_TAGS, TAGS, URL_SCHEMES

_PAGE_MARK = re.compile(r"^<!-- page (\d+)(?: \(([^()\n]*)\))? -->[ \t]*$", re.MULTILINE)
_ALLOWED_RAW = re.compile(rf"</?(?:{'|'.join(sorted(RAW_TAGS))})\b[^<>]*>", re.IGNORECASE)
_FIGURE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,100}")


@dataclass
class PageText:
    page: int
    note: str  # "", "blank" or "degraded: …" from the page's marker
    markdown: str


def split_pages(text: str) -> list[PageText]:
    """The pages of an ocrd Markdown file, split on its `<!-- page N … -->` markers."""
    marks = list(_PAGE_MARK.finditer(text))
    out = []
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
        out.append(PageText(int(m.group(1)), m.group(2) or "", text[m.end():end].strip()))
    if not marks and text.strip():
        out.append(PageText(1, "", text.strip()))
    return out


def _escape_raw(content: str) -> str:
    """Raw HTML from the Markdown: table tags kept (their attributes are cleaned later),
    every other `<` and `>` escaped, so `<script>` reads as text."""
    out, pos = [], 0
    for m in _ALLOWED_RAW.finditer(content):
        out.append(content[pos:m.start()].replace("<", "&lt;").replace(">", "&gt;"))
        out.append(m.group(0))
        pos = m.end()
    out.append(content[pos:].replace("<", "&lt;").replace(">", "&gt;"))
    return "".join(out)


def _raw(self: object, tokens: list[Token], idx: int, options: object, env: dict) -> str:
    return _escape_raw(tokens[idx].content)


def _image(self: object, tokens: list[Token], idx: int, options: object, env: dict) -> str:
    """A figure crop of this document (`STEM.assets/NAME`) through the console's asset
    URL; any other image as its alt text, never loaded."""
    token = tokens[idx]
    alt = html.escape(token.content or "", quote=True)
    src = unquote(str(token.attrGet("src") or ""))
    folder, _, name = src.rpartition("/")
    if env.get("assets") and folder == env["assets"] and _FIGURE_NAME.fullmatch(name):
        return (f'<img class="figure" src="{env["asset_url"]}/{html.escape(name)}" '
                f'alt="{alt or "figure"}">')
    return f"<span class=\"noimage\">[image{': ' + alt if alt else ''}]</span>"


_MD = MarkdownIt("commonmark", {"html": True}).enable("table").enable("strikethrough")
_MD.add_render_rule("html_block", _raw)
_MD.add_render_rule("html_inline", _raw)
_MD.add_render_rule("image", _image)


def to_html(markdown: str, assets_folder: str | None = None, asset_url: str = "") -> str:
    """One page's Markdown as clean HTML. `assets_folder`: the document's `STEM.assets`
    name as the Markdown links it; `asset_url`: where the console serves its files."""
    dirty = _MD.render(markdown, {"assets": assets_folder, "asset_url": asset_url.rstrip("/")})
    return nh3.clean(dirty, tags=set(TAGS),
                     attributes={tag: set(names) for tag, names in ATTRIBUTES.items()},
                     url_schemes=set(URL_SCHEMES), link_rel="noopener noreferrer nofollow")
