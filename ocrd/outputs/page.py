"""What an engine made of one page (`PageOutput`) and the words it saw on it (`Word`): the
one vocabulary between the engines, which make them, and the outputs, which write them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ocrd.render.deskew import Skew


@dataclass(frozen=True, slots=True)
class Word:
    """A word and where it is: pixels (left, top, right, bottom) of the page image the
    engine was given. Engines that see words (tesseract) report them; the searchable
    PDF lays each word over its box (ocrd/outputs/textlayer.py)."""

    text: str
    box: tuple[int, int, int, int]
    conf: float | None = None  # 0-100, as the engine rates it; None: not given
    # where it stands in the engine's reading: its block and its line (both numbered
    # over the page), for outputs that keep the page's structure (hOCR)
    block: int = 0
    line: int = 0


@dataclass
class PageOutput:
    """What the engine made of one page."""

    text: str  # raw model output (grounding tags included) or plain text
    finish_reason: str = "stop"  # "stop" is normal; "length"/"repetition" mean a loop
    tokens: int | None = None  # generated tokens (of the kept attempt)
    prompt_tokens: int | None = None
    attempts: int = 1
    # set when the kept text is not a normal finish: the reason, for the sidecar
    degraded: str | None = None
    seconds: float = 0.0
    # timestamps (time.time()) when the engine started and finished this page
    started_at: float = 0.0
    finished_at: float = 0.0
    # degrees (clockwise) the page was turned before it was read; None = the
    # engine does not detect orientation
    rotation: int | None = None
    extra: dict = field(default_factory=dict)
    # the page's words with their boxes, where the engine gives them (None: no geometry)
    words: list[Word] | None = None
    # how the page was straightened before the engine read it (the pipeline sets it;
    # words and boxes are on the straightened page, `Skew.to_original` puts them on the
    # page as scanned); None: it was read as it lies, unmeasured
    skew: Skew | None = None


def unturn(box: tuple[int, int, int, int], angle: int,
           size: tuple[int, int]) -> tuple[int, int, int, int]:
    """A box (left, top, right, bottom) found on the page turned clockwise by `angle`, on
    the page as it was given (`size`: its width and height)."""
    left, top, right, bottom = box
    width, height = size
    if angle == 90:
        return top, height - right, bottom, height - left
    if angle == 180:
        return width - right, height - bottom, width - left, height - top
    if angle == 270:
        return width - bottom, left, width - top, right
    return box
