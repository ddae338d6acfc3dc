"""The one small interface every OCR engine implements.

An engine turns one page image into text. It is started once, receives pages
concurrently (it decides how many it can take at a time), and is closed at shutdown.
Engines raise `EngineUnavailable` for conditions that pass (the page is queued again) and
`EngineDead` when they cannot go on; anything else fails the page.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from PIL import Image
from pydantic import BaseModel, ValidationError

from ocrd.config.settings import ConfigError
from ocrd.outputs.markdown import PageMarkdown, grounding_to_markdown, text_to_markdown
from ocrd.outputs.modeltext import inert_markdown
from ocrd.outputs.page import PageOutput

if TYPE_CHECKING:
    from ocrd.config.engine import EngineConfig

# What the inbox asked for; engines with a prompt (DeepSeek-OCR-2: deepseek_ocr2.prompt)
# turn it into theirs, the others ignore it.
PromptMode = Literal["markdown", "text", "custom"]
# What `ocr()` returns, and so how `page_markdown` reads it: "grounding": DeepSeek-OCR-2's
# tag stream (layout and figure boxes; figures are cropped from the page image);
# "markdown": the page's Markdown, made by the engine (tesseract, from its layout:
# ocrd/layout/) or a model; "text": plain text, escaped so that it reads as itself.
OutputFormat = Literal["grounding", "markdown", "text"]


@dataclass(frozen=True)
class PageRequest:
    """One rendered page on its way to the engine."""

    image: Image.Image | None  # RGB; None when `rendered` is given instead
    page_no: int  # 1-based
    doc_id: str  # stable per document; engines use it to name requests
    prompt_mode: PromptMode = "markdown"
    custom_prompt: str | None = None  # used when prompt_mode == "custom"
    dpi: float = 0.0  # the page's render resolution; 0 = not known (an image file)
    # for an engine whose page_mode is not RGB: the page as rendered, packed in its own
    # mode (pages.RenderedPage: grey or 1-bit), not made into a Pillow image
    rendered: Any = None
    # pages of its document not yet done (itself included) when it got its engine slot:
    # an engine with a queue of its own serves lower first (vLLM's priority), so a
    # one-page receipt does not wait behind a manual's queued pages, and a document near
    # its end goes before one just begun (ties: first come, first served)
    priority: int = 0
    # an engine that sends the page as a PNG data URL hands the URL here once it is made
    # (the pipeline keeps it for the page's figures instead of the packed page: a sixth
    # of the memory, nothing copied — the engine holds that string anyway)
    on_encoded: Callable[[str], None] | None = None
    # degrees clockwise a person turned this page by hand (the console's "turn this
    # page"; `image` is turned already): the engine reads it as given, without its own
    # orientation detection. None: nobody did.
    turned: int | None = None


class Engine(abc.ABC):
    """Base class. Subclasses set `kind`, `model` and `output_format`; they are made by
    `create(cfg)` from the engine section (EngineConfig). An engine of one's own, named in
    `engine.kind` by class path, takes its settings from `engine.options`, checked by its
    `Options` model when it has one (`options(cfg)`)."""

    # a pydantic model of the settings an engine given by class path takes in engine.options
    Options: ClassVar[type[BaseModel] | None] = None

    kind: str = "?"
    model: str = ""
    # What `ocr()` returns (OutputFormat). An engine with a grounding format also follows
    # the inbox's prompt mode.
    output_format: OutputFormat = "text"
    # How many pages this engine usefully takes at once (the scheduler's default bound).
    max_concurrency: int = 1
    # The resolution it reads best (ocrd/render/resolution.py): born-digital pages at
    # render_dpi, scans at their own resolution within scan_dpi. DeepSeek-OCR-2 resizes
    # pages to 1024/768 px, and its recipe renders at 144 dpi.
    render_dpi: int = 144
    scan_dpi: tuple[int, int] = (144, 200)
    # "RGB"; "L" for an engine that reads grey: it gets pages rendered grey, and 1-bit
    # scans as packed bits (PageRequest.rendered; ocrd/render/modes.py)
    page_mode: str = "RGB"
    # Bytes a page costs per pixel, by mode, from rendering until the engine is done
    # with it (ocrd/pipeline/budget.py): here the packed page (3) and its Pillow image (4).
    pixel_bytes: dict[str, float] = {"RGB": 7.0}  # noqa: RUF012 - read only

    @classmethod
    def create(cls, cfg: EngineConfig) -> Engine:
        """The engine for `cfg` (an engine may choose among its variants here)."""
        return cls(cfg)  # type: ignore[call-arg]

    @classmethod
    def preflight(cls, cfg: EngineConfig) -> list[str]:
        """What would keep this engine from starting, found without starting it (no GPU,
        no server asked, nothing written): one line per problem, each naming the key and
        the fix. check-config and the daemon's start both ask."""
        try:
            cls.options(cfg)
        except ConfigError as e:
            return list(e.problems)
        return []

    @classmethod
    def options(cls, cfg: EngineConfig) -> BaseModel | None:
        """`engine.options` checked by the `Options` model (None without one);
        ConfigError naming each wrong key."""
        if cls.Options is None:
            return None
        try:
            return cls.Options.model_validate(cfg.options)
        except ValidationError as e:
            raise ConfigError(*(
                f"engine.options.{'.'.join(str(x) for x in err['loc'])}: {err['msg']}"
                for err in e.errors())) from None

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load models, connect, check the installation. May take minutes."""

    @abc.abstractmethod
    async def ocr(self, page: PageRequest) -> PageOutput:
        """Convert one page. Safe to call concurrently up to `max_concurrency`."""

    async def health(self) -> bool:
        """True while the engine can take work."""
        return True

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Abort what is in flight and release resources."""

    @property
    def keeps_page_image(self) -> bool:
        """Whether `page_markdown` needs the page's image (to crop figures from it)."""
        return self.output_format == "grounding"

    @property
    def follows_prompt(self) -> bool:
        """Whether the inbox's prompt mode shapes this engine's output (the sidecar
        records the prompt only then)."""
        return self.output_format == "grounding"

    def page_markdown(self, text: str,
                      image: Image.Image | Callable[[], Image.Image] | None, page_no: int,
                      assets_link: str) -> PageMarkdown:
        """One page's output as Markdown, with nothing active left in it (the model's
        HTML and links are untrusted: ocrd/outputs/modeltext.py); figures (grounding only) are
        cropped from `image` (or from what it returns, made at the first figure) and
        linked under `assets_link`."""
        if self.output_format == "grounding":
            page = grounding_to_markdown(text, image, page_no, assets_link)
        elif self.output_format == "markdown":
            page = PageMarkdown(text)
        else:
            page = PageMarkdown(text_to_markdown(text))
        page.markdown = inert_markdown(page.markdown)
        return page

    def describe(self) -> dict:
        """Engine facts for the sidecar and logs."""
        return {"kind": self.kind, "model": self.model}
