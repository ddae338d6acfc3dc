"""What one model needs to read pages on `vllm serve`: how it is asked (its chat messages
and sampling, try by try) and how its answer is read (`Recipe`). The remote transport
(remote.py) carries the requests — servers, backoff, sickness, answer limits — for any
recipe; each model family is one recipe beside it (deepseek_ocr2.py, page_markdown.py),
named in `engine.recipe` (config/engine.py's RECIPES) or given by class path.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ocrd.engines.base import OutputFormat, PageRequest

if TYPE_CHECKING:
    from ocrd.config.engine import EngineConfig


@dataclass
class Read:
    """A model's answer, read: the page's text in the recipe's output format, facts for
    the sidecar, and — where the model says the page lies turned — the clockwise turn
    (90, 180, 270) after which to ask again."""

    text: str
    extra: dict[str, Any] = field(default_factory=dict)
    turn: int | None = None


class Recipe(abc.ABC):
    """One model family's way of reading a page. Made once per engine from the engine's
    settings; its methods are called from the event loop and must not block."""

    name: ClassVar[str] = "?"
    output_format: ClassVar[OutputFormat] = "markdown"
    # whether the inbox's prompt mode (markdown, text, custom) shapes what is asked
    follows_prompt: ClassVar[bool] = False

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg

    @abc.abstractmethod
    def messages(self, page: PageRequest, image_url: str) -> list[dict[str, Any]]:
        """The chat messages that ask for `page`, whose image is `image_url` (a PNG data
        URL)."""

    @abc.abstractmethod
    def sampling(self, attempt: int) -> dict[str, Any]:
        """The request's fields beside `model`, `messages` and `max_tokens` for try
        `attempt` (1-based; a retry follows a try whose answer ran into a loop)."""

    def read(self, text: str) -> Read:
        """The page as the answer's text gives it (the answer is untrusted: a recipe
        takes out only what it understands, and keeps the rest as text)."""
        return Read(text)

    def describe(self) -> dict[str, Any]:
        """Facts about the recipe for the sidecar and the log."""
        return {"recipe": self.name}
