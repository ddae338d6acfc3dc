"""A vision-language model that answers a page image with the page's Markdown — olmOCR,
Nanonets-OCR, Qwen2.5-VL and the like, served by `vllm serve` — as a recipe
(`engine.recipe: page-markdown`, settings in `engine.page_markdown`).

The page goes first, then the question (`prompt`); sampling is near-greedy, warmer on
each retry of a page that looped. An answer may start with a YAML front matter, as
olmOCR's do (`primary_language`, `is_rotation_valid`, `rotation_correction`): it is read
line by line (never evaluated), left out of the Markdown, and a page the model says lies
turned is asked again turned (`turn_pages`). An answer wrapped whole in a ```markdown
fence is unwrapped.
"""

from __future__ import annotations

import re
from typing import Any

from ocrd.config.engine import EngineConfig
from ocrd.engines.base import PageRequest
from ocrd.engines.recipe import Read, Recipe

# A front matter: `---` on the first line, `key: value` lines, `---` (at most this many
# lines: a longer one is text).
FRONT_MATTER = re.compile(r"\A\s*---[ \t]*\r?\n((?:[^\n]*\n){0,20}?)---[ \t]*(?:\r?\n|\Z)")
FIELD = re.compile(r"\s*([A-Za-z_][\w]*)\s*:\s*(.*?)\s*")
FENCED = re.compile(r"\A\s*```(?:markdown|md)?[ \t]*\r?\n(.*)\r?\n```\s*\Z", re.S)
TURNS = {90, 180, 270}


def front_matter(text: str) -> tuple[dict[str, str], str]:
    """The front matter's fields (names and values as written) and the text after it;
    ({}, text) when the text has none."""
    m = FRONT_MATTER.match(text)
    if m is None:
        return {}, text
    fields = {}
    for line in m.group(1).splitlines():
        f = FIELD.fullmatch(line)
        if f is not None:
            fields[f.group(1).lower()] = f.group(2).strip("'\"")
    return fields, text[m.end():]


def _flag(value: str | None) -> bool | None:
    if value is None:
        return None
    return {"true": True, "yes": True, "false": False, "no": False}.get(value.lower())


class PageMarkdown(Recipe):
    """The page's image, then the question; the answer is the page's Markdown."""

    name = "page-markdown"
    output_format = "markdown"

    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__(cfg)
        self.settings = cfg.page_markdown

    def messages(self, page: PageRequest, image_url: str) -> list[dict[str, Any]]:
        question = page.custom_prompt if page.prompt_mode == "custom" and \
            page.custom_prompt else self.settings.prompt
        out: list[dict[str, Any]] = []
        if self.settings.system_prompt:
            out.append({"role": "system", "content": self.settings.system_prompt})
        out.append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image_url}},
            {"type": "text", "text": question},
        ]})
        return out

    def sampling(self, attempt: int) -> dict[str, Any]:
        step = self.settings.retry_temperature_step * (attempt - 1)
        return {"temperature": round(min(2.0, self.settings.temperature + step), 3)}

    def read(self, text: str) -> Read:
        extra: dict[str, Any] = {}
        turn = None
        if self.settings.front_matter:
            fields, text = front_matter(text)
            if fields.get("primary_language") not in (None, "", "null", "None"):
                extra["language"] = fields["primary_language"][:16]
            if _flag(fields.get("is_rotation_valid")) is False:
                try:
                    correction = int(fields.get("rotation_correction", ""))
                except ValueError:
                    correction = 0
                if correction in TURNS:
                    extra["model_says_turned"] = correction
                    if self.settings.turn_pages:
                        turn = correction
        fenced = FENCED.match(text)
        if fenced is not None and "```" not in fenced.group(1):
            text = fenced.group(1)
        return Read(text.strip("\n"), extra, turn)

    def describe(self) -> dict[str, Any]:
        return {"recipe": self.name, "prompt": self.settings.prompt[:200]}
