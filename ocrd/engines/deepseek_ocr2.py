"""DeepSeek-OCR-2's recipe in one place: prompts, output format, sampling and engine
settings, and the n-gram ban every request runs under (tightened by ocrd on retries).

The engines that run the model — in the daemon's process (engines/vllm/inprocess.py), on
a local `vllm serve` that ocrd supervises (engines/vllm/managed.py), on servers elsewhere
(remote.py, through the `DeepSeekOcr2` recipe) — take all of it from here; the generic
engine interface (base.py) and the transport know none of it. The n-gram ban's defaults
are user settings (`engine.deepseek_ocr2.ngram`, config/engine.py's NGramConfig), the
recipe's values; the processor that applies them lives with the code vLLM loads
(ocrd/vllm_model/ngram.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ocrd.config.engine import EngineConfig, NGramConfig
from ocrd.engines.base import OutputFormat, PageRequest
from ocrd.engines.recipe import Recipe

# Prompts of DeepSeek-OCR-2's published recipe (plain text, no chat template). The
# "markdown" prompt asks for grounding tags (<|ref|>/<|det|>): layout and figure boxes.
PROMPTS: dict[str, str] = {
    "markdown": "<image>\n<|grounding|>Convert the document to markdown. ",
    "text": "<image>\nFree OCR. ",
}

# What the model writes: DeepSeek-OCR-2's tag stream, turned into Markdown (figures
# cropped from the page image) by markdown.grounding_to_markdown (see base.Engine).
OUTPUT_FORMAT: OutputFormat = "grounding"

# Sampling: greedy, and the special tokens kept (outputs/markdown.py needs the grounding tags).
SAMPLING: dict[str, Any] = {"temperature": 0.0, "skip_special_tokens": False}

# The recipe's logits processor (n-gram ban with per-request arguments): ocrd's drop-in
# for vLLM's NGramPerReqLogitsProcessor, the same bans at a fraction of the engine time.
# vLLM imports it by name in its engine core.
NGRAM_PROCESSOR = "ocrd.vllm_model.ngram:NGramBanLogitsProcessor"

# Floor for the tightened n-gram size: banning every repeated 3-gram would garble
# ordinary prose ("of the ...").
MIN_NGRAM_SIZE = 4
# Window never grows past this many tokens (the processor scans it on every token).
MAX_WINDOW_SIZE = 1024
# vLLM's repetition detector (>= 0.19), used on retries only: a block of up to this many
# tokens repeated this many times in a row ends the request early. Retries only, because
# legitimately repetitive pages (empty table cells, dotted leaders) must not be cut on the
# first try.
REPETITION_MAX_PATTERN_TOKENS = 256
REPETITION_MIN_COUNT = 8


def prompt(page: PageRequest) -> str:
    """The plain prompt for a page: the recipe's for its mode, or the inbox's own text
    (with the image placeholder the model expects in front)."""
    if page.prompt_mode == "custom":
        text = page.custom_prompt or ""
        return text if text.startswith("<image>") else "<image>\n" + text
    return PROMPTS[page.prompt_mode]


def engine_settings() -> dict[str, Any]:
    """vLLM engine arguments of the recipe (a new dict each call): pages never share a
    prefix worth caching, and caching processed images only costs memory (every page
    image is new); one image per prompt; the n-gram ban."""
    return {
        "enable_prefix_caching": False,
        "mm_processor_cache_gb": 0,
        "limit_mm_per_prompt": {"image": 1},
        "logits_processors": [NGRAM_PROCESSOR],
    }


@dataclass(frozen=True)
class AttemptSettings:
    """Anti-repetition settings for one try at a page (1-based `attempt`)."""

    attempt: int
    ngram_size: int
    window_size: int
    whitelist_token_ids: tuple[int, ...]
    # ask vLLM to stop a looping request early, where it supports that
    repetition_detection: bool = False

    def extra_args(self) -> dict[str, object]:
        """Per-request arguments of DeepSeek-OCR's NGramPerReqLogitsProcessor."""
        return {
            "ngram_size": self.ngram_size,
            "window_size": self.window_size,
            "whitelist_token_ids": list(self.whitelist_token_ids),
        }

    def repetition_params(self) -> dict[str, int] | None:
        """Fields of vLLM's RepetitionDetectionParams, or None on the first try."""
        if not self.repetition_detection:
            return None
        return {
            "max_pattern_size": REPETITION_MAX_PATTERN_TOKENS,
            "min_pattern_size": 1,
            "min_count": REPETITION_MIN_COUNT,
        }


def attempt_settings(ngram: NGramConfig, attempt: int) -> AttemptSettings:
    """The configured settings on the first try, tighter on each retry.

    The processor bans a token that would repeat an n-gram seen in the last `window`
    tokens, so it breaks loops whose period is at most window - ngram + 1. A smaller
    n-gram and a *larger* window both catch more loops (a smaller window would let
    longer loops through), hence n-gram halves and the window doubles per retry.
    """
    if attempt <= 1:
        return AttemptSettings(1, ngram.ngram_size, ngram.window_size,
                               tuple(ngram.whitelist_token_ids))
    shift = attempt - 1
    size = max(min(MIN_NGRAM_SIZE, ngram.ngram_size), ngram.ngram_size >> shift)
    window = max(ngram.window_size, min(MAX_WINDOW_SIZE, ngram.window_size << shift))
    return AttemptSettings(attempt, size, window, tuple(ngram.whitelist_token_ids),
                           repetition_detection=True)


def chat_text(prompt: str) -> str:
    """The prompt without its `<image>` placeholder.

    vLLM's chat path puts one `<image>\\n` before the text of a message whose text has no
    placeholder, and DeepSeek-OCR(-2)'s fallback chat template adds nothing but the BOS
    token, so the model sees exactly the recipe's plain prompt.
    """
    return prompt.removeprefix("<image>").removeprefix("\n")


class DeepSeekOcr2(Recipe):
    """DeepSeek-OCR-2 on `vllm serve`: the recipe's prompt after the page's image, greedy
    sampling with the special tokens kept, the n-gram ban's per-request arguments
    (tightened on each retry, with vLLM's repetition detector on retries)."""

    name = "deepseek-ocr-2"
    output_format = OUTPUT_FORMAT
    follows_prompt = True

    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__(cfg)
        self.ngram = cfg.deepseek_ocr2.ngram

    def messages(self, page: PageRequest, image_url: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image_url}},
            {"type": "text", "text": chat_text(prompt(page))},
        ]}]

    def sampling(self, attempt: int) -> dict[str, Any]:
        settings = attempt_settings(self.ngram, attempt)
        fields: dict[str, Any] = {
            **SAMPLING,
            # per-request arguments of the server's NGramPerReqLogitsProcessor
            "vllm_xargs": settings.extra_args(),
        }
        rep = settings.repetition_params()
        if rep is not None:
            # vLLM >= 0.19 stops a looping request early; older servers ignore the field.
            fields["repetition_detection"] = rep
        return fields
