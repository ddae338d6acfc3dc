"""The engine side owns its output format and its prompts: a DeepSeek-OCR-2 engine turns
its grounding tags into Markdown with figures cropped from the page and follows the
inbox's prompt (ocrd/engines/deepseek_ocr2.py); an engine of plain text does neither.
The pipeline only asks the engine (Engine.page_markdown, keeps_page_image,
follows_prompt)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from typing import Any

from PIL import Image
from simulated_engines import SIMULATED, FaultOptions, FaultyEngine, SimulatedEngine

from ocrd.config.engine import EngineConfig
from ocrd.engines import deepseek_ocr2
from ocrd.engines.base import PageRequest
from ocrd.engines.remote import RemoteEngine

FIGURE = ("<|ref|>title<|/ref|><|det|>[[10, 10, 900, 80]]<|/det|>\n# Report\n\n"
          "<|ref|>image<|/ref|><|det|>[[100, 200, 600, 700]]<|/det|>")


def page(color: str = "white") -> Image.Image:
    return Image.new("RGB", (400, 600), color)


def test_a_deepseek_engine_crops_figures_and_follows_the_prompt() -> None:
    engine = RemoteEngine(EngineConfig(kind="remote", remote={"urls": ["http://127.0.0.1:9/v1"]}))
    assert engine.keeps_page_image and engine.follows_prompt
    out = engine.page_markdown(FIGURE, page(), 3, "report.assets")
    assert "# Report" in out.markdown and "<|ref|>" not in out.markdown
    assert [f.name for f in out.figures] == ["p0003-1.png"]
    assert out.figures[0].image.size == (200, 300)  # 400×600 page, box 100..600 of 999
    assert "report.assets/p0003-1.png" in out.markdown


def test_a_plain_text_engine_keeps_the_text_and_needs_no_image() -> None:
    engine = SimulatedEngine(EngineConfig(kind=SIMULATED))
    assert not engine.keeps_page_image and not engine.follows_prompt
    out = engine.page_markdown("Line one\nLine two", None, 1, "x.assets")
    assert out.markdown.splitlines()[:2] == ["Line one", "Line two"]
    assert out.figures == [] and not out.malformed


def test_the_faults_wrapper_keeps_the_inner_engines_format() -> None:
    inner = RemoteEngine(EngineConfig(kind="remote", remote={"urls": ["http://127.0.0.1:9/v1"]}))
    wrapped = FaultyEngine(inner, FaultOptions())
    assert wrapped.keeps_page_image and wrapped.follows_prompt
    assert wrapped.page_markdown(FIGURE, page(), 1, "a").figures


def test_the_recipes_prompts() -> None:
    req = PageRequest(image=page(), page_no=1, doc_id="d")
    assert deepseek_ocr2.prompt(req) == "<image>\n<|grounding|>Convert the document to markdown. "
    req = PageRequest(image=page(), page_no=1, doc_id="d", prompt_mode="text")
    assert deepseek_ocr2.prompt(req) == "<image>\nFree OCR. "
    req = PageRequest(image=page(), page_no=1, doc_id="d", prompt_mode="custom",
                      custom_prompt="Describe the table.")
    assert deepseek_ocr2.prompt(req) == "<image>\nDescribe the table."
    req = PageRequest(image=page(), page_no=1, doc_id="d", prompt_mode="custom",
                      custom_prompt="<image>Only this.")
    assert deepseek_ocr2.prompt(req) == "<image>Only this."


def test_the_page_image_is_made_only_for_a_page_with_figures() -> None:
    """The pipeline keeps a grounding engine's page packed and hands page_markdown a
    function that makes the image: called once for a page with figures, never for one
    without (most pages)."""
    engine = RemoteEngine(EngineConfig(kind="remote", remote={"urls": ["http://127.0.0.1:9/v1"]}))
    calls: list[int] = []

    def make() -> Image.Image:
        calls.append(1)
        return page()

    two = FIGURE + "\n<|ref|>image<|/ref|><|det|>[[0, 0, 500, 500]]<|/det|>"
    out = engine.page_markdown(two, make, 1, "a")
    assert [f.name for f in out.figures] == ["p0001-1.png", "p0001-2.png"]
    assert out.figures[0].image.size == (200, 300) and calls == [1]
    text_only = "<|ref|>text<|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>\nJust text."
    assert "Just text." in engine.page_markdown(text_only, make, 2, "a").markdown
    assert calls == [1]


def test_the_remote_engine_lets_go_of_the_image_once_it_is_encoded() -> None:
    """The page's pixels are in the request's data URL: the engine must not keep the
    Pillow image while the server reads the page (hundreds of pages in flight)."""
    engine = RemoteEngine(EngineConfig(kind="remote", remote={"urls": ["http://127.0.0.1:9/v1"]}))
    seen: list[Any] = []

    async def attempt(req: PageRequest, url: str, settings: Any) -> Any:
        gc.collect()
        seen.append((req.image, alive() is not None, url.startswith("data:image/png")))
        raise RuntimeError("stop here")

    engine._attempt = attempt  # type: ignore[method-assign]
    # as the pipeline hands pages over: popped from a list, no other reference kept
    requests = [PageRequest(image=page(), page_no=1, doc_id="d")]
    alive = weakref.ref(requests[0].image)

    async def run() -> None:
        with contextlib.suppress(RuntimeError):
            await engine.ocr(requests.pop())

    asyncio.run(run())
    assert seen and seen[0] == (None, False, True)
