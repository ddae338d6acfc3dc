"""A document to convert (`Source`: its open file and what is known of it) and how far
its conversion has come (`DocProgress`, what the console shows: `converting_files`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ocrd import safefs
from ocrd.live import ConvertingFile
from ocrd.names import shown
from ocrd.outputs.writers import OutputSettings
from ocrd.render import pages


@dataclass
class Source:
    """A document to convert: an open file (the claimed copy in the work area, or the
    file given to `ocrd convert`), read by every stage through its descriptor."""

    fd: int  # open for reading; ocrd never reopens the document by its path
    name: str  # path shown in outputs: relative to the inbox, or as given
    inbox: str | None = None
    prompt_mode: str = "markdown"
    custom_prompt: str | None = None
    claimed_at: float = field(default_factory=time.time)
    info: pages.DocInfo | None = None
    sha256: str | None = None
    order: tuple = ()  # scheduler order key (batch, cost, seq)
    # a new version of this source path replaces the results of the old one (keep mode)
    same_path_replaces: bool = False
    stem: str | None = None  # the outputs' name, when not the source's own (plain names)
    # the outputs besides the Markdown (their writers: outputs/writers.py) and what they
    # read of their settings (the inbox's, or `ocrd convert`'s)
    outputs: tuple[str, ...] = ()
    output_settings: OutputSettings | None = None
    job_id: int | None = None  # its journal row (the console links to it)
    # {page: degrees clockwise} a person chose (the console's "turn this page"): those
    # pages are read turned so, without the engine's own orientation detection; asked
    # of `turns_for(sha256)` once the content is known
    turns: dict[int, int] | None = None
    turns_for: Callable[[str], dict[int, int]] | None = None

    @property
    def path(self) -> str:
        """What render workers and poppler open: exactly this open file."""
        return safefs.fd_path(self.fd)


@dataclass
class DocProgress:
    """A document being converted, as the console shows it: page k of n."""

    src: Source
    pages: int
    started: float  # wall time its first page was asked for
    done: int = 0  # pages with their engine output


def converting_files(docs: Iterable[DocProgress], wall: float) -> tuple[ConvertingFile, ...]:
    """Documents being converted: page k of n, and the rest at this document's pace."""
    out = []
    for doc in docs:
        eta = None
        if 0 < doc.done < doc.pages:
            eta = round((wall - doc.started) / doc.done * (doc.pages - doc.done), 1)
        out.append(ConvertingFile(doc.src.job_id, shown(doc.src.name), shown(doc.src.inbox or ""),
                                  doc.done, doc.pages, doc.started, eta))
    return tuple(sorted(out, key=lambda f: f.started))
