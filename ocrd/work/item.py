"""A claimed file (`Item`): its journal row, its inbox and its place in the work area
(`.ocrd-work/<instance>/<job>/<relpath>`), from the claim to its outcome."""

from __future__ import annotations

from dataclasses import dataclass, field

from ocrd import errors, safefs
from ocrd.render.pages import DocInfo
from ocrd.work.area import WORK_DIR_NAME, InboxView


@dataclass
class Item:
    """A claimed file, in the scheduler and on its way to an outcome."""

    job_id: int
    inbox: InboxView
    relpath: str  # the file's path in its inbox ("sub/scan.pdf")
    claim: tuple[str, ...]  # its folders below .ocrd-work: (instance, job id, *subfolders)
    info: DocInfo | None = None
    claimed_at: float = 0.0  # time.time(): the sidecar's claimed_at
    claimed_mono: float = 0.0  # time.monotonic() of a claim in this run: its duration
    retries: int = 0  # destination failures so far (backoff)
    own_failures: int = 0  # of those, failures of this file alone (then plain names)
    stage: str = "convert"  # convert | dispose (outputs written, the original is left)
    output: str = ""  # the Markdown written (stage dispose)
    error: errors.OcrdError | None = None  # fail it instead of converting
    extra: dict = field(default_factory=dict)  # facts for the error file
    order: tuple = ()  # the scheduler's order key (batch, cost, seq), for the page slots
    sha256: str | None = None  # once known (the conversion hashes the file)

    @property
    def name(self) -> str:
        return self.relpath.rsplit("/", 1)[-1]

    @property
    def folders(self) -> tuple[str, ...]:
        return tuple(self.relpath.split("/")[:-1])

    @property
    def claim_path(self) -> str:
        return str(self.inbox.path.joinpath(WORK_DIR_NAME, *self.claim, self.name))

    def open_claim_folder(self) -> safefs.Dir:
        with self.inbox.open_root() as root:
            return root.walk((WORK_DIR_NAME, *self.claim))


def claim_parts(inbox: InboxView, job_id: int, relpath: str) -> tuple[str, ...]:
    return (inbox.instance, str(job_id), *relpath.split("/")[:-1])
