"""Typed configuration, read from YAML and validated with pydantic.

Each key's text is written once, in its `description` (docs/configuration.md and
config.example.yaml are generated from it: reference.py). Unknown keys are errors (a typo
must not be silently ignored); check.py finds every problem at once and names each key
and value; load.py reads a file. The `engine:` section's models live in engine.py.
"""

from __future__ import annotations

import grp
import ipaddress
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ocrd.config import listen
from ocrd.config.engine import CLASS_PATH, EngineConfig, _Strict, key_problem
from ocrd.names import number

# Names that are never documents: OS junk, sync-tool folders, partial downloads and
# scanner temp files. Matched against each path component (fnmatch, case-insensitive).
BUILTIN_IGNORE: tuple[str, ...] = (
    ".*",  # dotfiles and dot-folders: .DS_Store, ._x.pdf, .stfolder, .ocrd-work, ...
    "~$*",  # Office lock files
    "*~",
    "*.part",
    "*.partial",
    "*.tmp",
    "*.temp",
    "*.crdownload",
    "*.download",
    "*.pd~",  # ScanSnap writes x.pd~ then renames to x.pdf
    "*.swp",
    "Thumbs.db",
    "desktop.ini",
    "@eaDir",  # Synology
    "#recycle",  # Synology
    "#snapshot",
    "$RECYCLE.BIN",
    "__MACOSX",
    "lost+found",
)


class ConfigError(Exception):
    """Problems with the configuration, each one line that names the key and the value."""

    def __init__(self, *problems: str) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


# state_dir for a config file under /etc: where the unit's StateDirectory=ocrd is.
SERVICE_STATE_DIR = Path("/var/lib/ocrd")


# The outputs besides the Markdown, by name: what an inbox's `outputs` may list besides
# a writer's class path of one's own (an ocrd.outputs.writers.Writer subclass).
WRITERS: dict[str, str] = {
    "pdf": "ocrd.outputs.searchable_pdf:SearchablePdf",
    "hocr": "ocrd.outputs.hocr:Hocr",
}


class InboxConfig(_Strict):
    """One folder that is watched, and where its files go."""

    path: Path = Field(description=(
        "The folder people and scanners drop files into. ocrd needs to read, write and "
        "rename in it: a file is claimed by moving it out."))
    outbox: Path = Field(description=(
        "Where the Markdown goes: NAME.md, its sidecar NAME.json and NAME.assets/ with "
        "the figures, in the inbox's subfolders mirrored."))
    failed: Path = Field(description=(
        "Where files that could not be converted go, each with NAME.error.json saying "
        "why (`ocrd retry` puts them back)."))
    archive: Path | None = Field(None, description=(
        "Where originals go once their Markdown is written; left out, they stay in the "
        "inbox (see on_success)."))
    on_success: Literal["archive", "delete", "keep"] | None = Field(None, description=(
        "What becomes of an original once its Markdown is written: `archive` (moved to "
        "the archive folder), `delete`, or `keep` (left in the inbox, converted again "
        "only if it changes). null: `archive` when an archive folder is set, else "
        "`keep`."))
    create_folders: bool = Field(False, description=(
        "Create the outbox, failed and archive folders when they are missing. false: "
        "while one is missing the inbox waits, PAUSED, with the reason in `ocrd "
        "status`, the console and the log, until the folder is there — so that a share "
        "not mounted yet, or a misspelt path, is never written onto the local disk; "
        "`ocrd check-config` names every missing folder."))
    recursive: bool = Field(False, description=(
        "Watch the inbox's subfolders too. false: files in subfolders are not read "
        "(`ocrd status` and the console say how many wait there)."))
    include: list[str] = Field(default_factory=lambda: ["*"], description=(
        "Only names matching one of these patterns are converted (case-insensitive, "
        "like `*.pdf`)."))
    ignore: list[str] = Field(default_factory=list, description=(
        "Names never converted, on top of the built-in list (dotfiles, `~$*`, `*.part`, "
        "`*.tmp`, `Thumbs.db`, `@eaDir` …)."))
    quiet_seconds: float = Field(5.0, ge=0, description=(
        "A file counts as written once its size and time have not changed for this "
        "long; then it is checked for completeness."))
    incomplete_seconds: float = Field(600.0, ge=0, description=(
        "A file that looks cut short (empty, a PDF without its end, an image that does "
        "not decode to its end) waits until it has not changed for this long — also "
        "after its writer closed it: SMB clients and scanners close a file between "
        "chunks and pause — then is read as it is (a PDF without %%EOF that opens is "
        "converted), or goes to the failed folder if it does not read. A file that "
        "looks complete goes at once. A scanner that writes PDFs without %%EOF: lower "
        "it, above its longest pause between chunks."))
    watch: Literal["auto", "inotify", "polling"] = Field("auto", description=(
        "How new files are noticed: `auto` (polling on network filesystems such as NFS, "
        "SMB or FUSE, inotify elsewhere), `inotify` or `polling`. Rescans find "
        "everything either way."))
    file_mode: str = Field("0644", description=(
        "Mode of the files ocrd writes, in octal. On a shared folder: \"0660\", with "
        "dir_mode \"2770\" (what systemd/ocrd.tmpfiles sets up)."))
    dir_mode: str = Field("0755", description=(
        "Mode of the folders ocrd creates, in octal (\"2770\": group-writable, the "
        "group kept on everything inside)."))
    group: str | None = Field(None, description=(
        "Group (name or number) given to what ocrd writes; ocrd's user must be a "
        "member. null: the folder's or the user's group."))
    prompt: Literal["markdown", "text", "custom"] = Field("markdown", description=(
        "vllm and remote: what to ask the model for: `markdown` (layout, figures, "
        "tables), `text` (plain text) or `custom` (custom_prompt). tesseract ignores it."))
    custom_prompt: str | None = Field(None, description="The prompt, with prompt: custom.")
    outputs: list[str] = Field(
        default_factory=lambda: ["markdown"], description=(
            "What is written: `markdown` (always: NAME.md and its sidecar NAME.json); "
            "`pdf`: NAME.pdf, the original made searchable by an invisible text layer "
            "(README, \"Searchable PDFs\"); `hocr`: NAME.hocr, every word with its box "
            "and confidence on the page (for OCRmyPDF, archives and proofreading "
            "tools); or a writer of one's own by class path, `package.module:Class` "
            "(docs/engines.md)."))
    pdf_text_layer: Literal["replace", "add", "skip_if_text"] = Field(
        "skip_if_text", description=(
            "With outputs pdf, on pages that have text already: `skip_if_text` keeps "
            "such a page as it is, `add` lays ocrd's text over it too, `replace` "
            "removes an earlier invisible text layer first."))
    pdf_suffix: str = Field(".pdf", description=(
        "With outputs pdf: how the searchable PDF's name ends (`.ocr.pdf`: "
        "NAME.ocr.pdf)."))

    @field_validator("file_mode", "dir_mode")
    @classmethod
    def _octal(cls, v: str | int) -> str:
        text = str(v)
        try:
            mode = int(text, 8)
        except ValueError:
            raise ValueError("must be an octal mode like '0640'") from None
        if not 0 <= mode <= 0o7777:
            raise ValueError("must be an octal mode like '0640'")
        return text

    @field_validator("group")
    @classmethod
    def _group(cls, v: str | None) -> str | None:
        if v is None or number(v) is not None:
            return v
        try:
            grp.getgrnam(v)
        except KeyError:
            raise ValueError("no such group on this machine") from None
        return v

    @field_validator("pdf_suffix")
    @classmethod
    def _pdf_suffix(cls, v: str) -> str:
        if not re.fullmatch(r"[^/\0]{0,40}\.pdf", v):
            raise ValueError("pdf_suffix must end in '.pdf' (like '.ocr.pdf')")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> InboxConfig:
        if self.on_success is None:
            self.on_success = "archive" if self.archive is not None else "keep"
        if self.on_success == "archive" and self.archive is None:
            raise key_problem("on_success", "no 'archive' folder is set: set one, or leave "
                              "on_success out to keep originals in the inbox")
        if self.prompt == "custom" and not self.custom_prompt:
            raise key_problem("prompt", "'custom' needs the prompt in custom_prompt")
        if "markdown" not in self.outputs:
            raise key_problem("outputs", "must list 'markdown' (always written; add "
                              "'pdf' or 'hocr')")
        for name in self.outputs:
            if name != "markdown" and name not in WRITERS and not CLASS_PATH.fullmatch(name):
                raise key_problem("outputs", f"{name!r} is not an output: markdown, "
                                  f"{', '.join(WRITERS)}, or a writer's class path "
                                  "`package.module:Class`")
        if len(set(self.outputs)) != len(self.outputs):
            raise key_problem("outputs", "each output once")
        return self

    @property
    def file_mode_bits(self) -> int:
        return int(self.file_mode, 8)

    @property
    def dir_mode_bits(self) -> int:
        return int(self.dir_mode, 8)

    @property
    def gid(self) -> int | None:
        if self.group is None:
            return None
        gid = number(self.group)
        return gid if gid is not None else grp.getgrnam(self.group).gr_gid

    def destinations(self) -> dict[str, Path]:
        out = {"outbox": self.outbox, "failed": self.failed}
        if self.archive is not None:
            out["archive"] = self.archive
        return out


class RenderConfig(_Strict):
    """How the pages of documents become images for the engine."""

    dpi: int | None = Field(None, ge=36, le=1200, description=(
        "Pages of born-digital PDFs render at this resolution. null: the engine's "
        "choice (tesseract 300, DeepSeek-OCR-2 144)."))
    scan_min_dpi: int | None = Field(None, ge=36, le=2400, description=(
        "A scanned page (one image covering it) renders at its image's own resolution, "
        "but at least at this. null: the engine's choice (tesseract 200, DeepSeek-OCR-2 "
        "144)."))
    scan_max_dpi: int | None = Field(None, ge=36, le=2400, description=(
        "... and at most at this. null: the engine's choice (tesseract 600, "
        "DeepSeek-OCR-2 200)."))
    renderer: Literal["pypdfium2", "pdf2image"] = Field("pypdfium2", description=(
        "`pypdfium2` (PDFium) or `pdf2image` (poppler); poppler is also the fallback "
        "for files PDFium refuses."))
    workers: int = Field(0, ge=0, description="Render processes; 0: one per CPU core.")
    lookahead: int = Field(4, ge=1, description=(
        "Pages rendered ahead of the engine, per document."))
    deskew: bool = Field(True, description=(
        "Straighten pages that were scanned askew (up to 15 degrees either way) before "
        "the engine reads them; the skew measured is in the sidecar (`skew`), and the "
        "searchable PDF keeps the original scan, its words laid over it where they "
        "stand. false: pages are read as they lie."))


class LimitsConfig(_Strict):
    """Files beyond these go to the failed folder, with the reason."""

    max_pages: int = Field(2000, ge=1, description=(
        "Documents with more pages fail (`too_many_pages`)."))
    max_file_bytes: int = Field(2 * 1024**3, ge=1, description=(
        "Bigger files fail (`too_large`)."))
    max_pixels: int = Field(200_000_000, ge=1, description=(
        "Pixels of one image: bigger images fail (`too_large`; a guard against "
        "decompression bombs), and PDF pages that would be bigger render at a lower "
        "resolution."))
    memory_bytes: int | None = Field(None, ge=64 * 1024**2, description=(
        "Bytes of page images in flight, all files together; a page that would cost "
        "more renders at a lower resolution. null: 1 GiB, raised to what the engine's "
        "pages in flight cost as A4 pages; one page at most 1 GiB."))


class ScheduleConfig(_Strict):
    """How files and pages are fed to the engine."""

    pages_in_flight: int = Field(0, ge=0, description=(
        "Pages in the engine at once, all files together; 0: the engine's own "
        "preference."))
    batch_window_seconds: float = Field(0.5, ge=0, description=(
        "Files that become ready within this window form one batch, smallest first."))
    max_active_documents: int = Field(4, ge=1, description=(
        "Documents converted at the same time."))
    max_attempts: int = Field(3, ge=1, description=(
        "A file is given up (`too_many_attempts`) after this many starts that did not "
        "finish, e.g. when the daemon crashed on it each time."))
    page_retries: int = Field(2, ge=0, description=(
        "Engine errors on one page before the page (and its file) fails."))
    page_timeout_seconds: float = Field(900.0, gt=0, description=(
        "Seconds one page may take in the engine; longer counts as an engine error."))


class LogConfig(_Strict):
    """The daemon's log."""

    level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="`debug`, `info`, `warning` or `error`.")
    format: Literal["auto", "console", "json"] = Field("auto", description=(
        "`auto`: readable lines on a terminal, JSON lines otherwise (under systemd: the "
        "journal's fields); `console`; `json`."))


def _address(v: str | None) -> str | None:
    if v is not None:
        listen.parse(v)  # a ValueError that says what is wrong
    return v


class MetricsConfig(_Strict):
    """Prometheus metrics and health checks: /metrics, /healthz, /readyz."""

    listen: str | None = Field("127.0.0.1:9464", description=(
        "HOST:PORT, with an IPv4 address, an IPv6 address in brackets (`[::1]:9464`) "
        "or localhost; port 0: a free one. null turns it off. The daemon does not "
        "start when it cannot listen there."))

    _hostport = field_validator("listen")(classmethod(lambda cls, v: _address(v)))


class WebConfig(_Strict):
    """The console (overview, files, page-by-page review, retry) and its JSON API
    (/api/status, /api/files, /api/files/ID, POST /api/files/ID/retry)."""

    listen: str | None = Field("127.0.0.1:9465", description=(
        "HOST:PORT of the console; null turns it off. Anything but a loopback address "
        "(127.0.0.0/8, ::1, localhost) needs token_file."))
    token_file: Path | None = Field(None, description=(
        "A file holding the access token on one line, at least 16 characters (`openssl "
        "rand -hex 32`). A bare name is looked up among systemd's credentials first "
        "(`LoadCredential=` in the unit). Once set, the console asks for it even on "
        "loopback."))
    previews: bool = Field(True, description=(
        "Page images for the review page, rendered from the original when a page is "
        "first looked at (conversion pays nothing for them) and cached under "
        "state_dir/previews."))
    previews_days: float = Field(30.0, gt=0, description=(
        "Cached page images older than this many days are removed."))
    previews_max_bytes: int = Field(2 * 1024**3, ge=0, description=(
        "Cached page images beyond this many bytes in all are removed, oldest documents "
        "first."))
    search: bool = Field(True, description=(
        "Full-text search over every converted page (an index in "
        "state_dir/search.sqlite3, filled as files finish)."))
    upload_max_bytes: int = Field(200 * 1024**2, ge=0, description=(
        "The largest file the console's upload form takes (0: no uploads)."))

    _hostport = field_validator("listen")(classmethod(lambda cls, v: _address(v)))

    @model_validator(mode="after")
    def _token_off_loopback(self) -> WebConfig:
        if not self.loopback and self.token_file is None:
            raise key_problem("listen", "not a loopback address: set web.token_file (a "
                              "file, or a systemd credential's name) so that the console "
                              "needs a token, or listen on 127.0.0.1")
        return self

    @property
    def loopback(self) -> bool:
        """Reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
        if self.listen is None:
            return True
        return ipaddress.ip_address(listen.parse(self.listen).host).is_loopback


class Config(_Strict):
    """The whole configuration file."""

    inboxes: list[InboxConfig] = Field(default_factory=list, description=(
        "The watched folders, each with its own destinations and settings."))
    state_dir: Path | None = Field(None, description=(
        "Where the journal (SQLite), the console's previews and the daemon's identity "
        "live: a local folder of one daemon's own. null: `/var/lib/ocrd` for a config "
        "file under /etc (the service's StateDirectory=), else `state` in this file's "
        "folder."))
    required_mounts: list[Path] = Field(default_factory=list, description=(
        "Mount points of shares that configured folders lie on (`/mnt/nas`): while no "
        "filesystem is mounted at one (/proc/self/mountinfo), every inbox with a folder "
        "at or below it waits, PAUSED — also where a folder is the empty mount point "
        "itself, which a missing folder cannot reveal. `ocrd check-config` says when one "
        "is not mounted. For the service, add `RequiresMountsFor=` with the same paths "
        "in a drop-in (docs/operations.md)."))
    rescan_seconds: float = Field(60.0, gt=0, description=(
        "Seconds between full rescans of every inbox: change events are only hints, a "
        "rescan finds what they missed."))
    poll_seconds: float = Field(2.0, gt=0, description=(
        "Seconds between scans of the inboxes watched by polling."))
    drain_timeout_seconds: float = Field(60.0, ge=0, description=(
        "On stop, seconds for the pages in flight to finish; what is left stays claimed "
        "and resumes at the next start."))
    engine: EngineConfig = Field(default_factory=EngineConfig)
    render: RenderConfig = Field(default_factory=RenderConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    web: WebConfig = Field(default_factory=WebConfig)

    def resolve(self, base: Path) -> Config:
        """Paths relative to the config file's folder `base` become absolute; state_dir
        left out becomes its default for a config file there."""
        def fix(p: Path | None) -> Path | None:
            if p is None:
                return None
            p = p.expanduser()
            return p if p.is_absolute() else (base / p)

        data = self.model_copy(deep=True)
        data.state_dir = fix(data.state_dir) or default_state_dir(base)
        data.required_mounts = [fix(m) for m in data.required_mounts]  # type: ignore[misc]
        token = data.web.token_file
        # A bare name may be a systemd credential (looked up at start); a path is a path.
        if token is not None and len(token.parts) > 1:
            data.web.token_file = fix(token)
        for box in data.inboxes:
            box.path = fix(box.path)  # type: ignore[assignment]
            box.outbox = fix(box.outbox)  # type: ignore[assignment]
            box.failed = fix(box.failed)  # type: ignore[assignment]
            box.archive = fix(box.archive)
        remote = data.engine.remote
        remote.api_key_file = fix(remote.api_key_file)
        remote.tls_ca_file, remote.tls_cert_file, remote.tls_key_file = (
            fix(remote.tls_ca_file), fix(remote.tls_cert_file), fix(remote.tls_key_file))
        return data


def default_state_dir(base: Path) -> Path:
    """state_dir for a config file in `base` that leaves it out."""
    etc = Path("/etc")
    return SERVICE_STATE_DIR if base == etc or etc in base.parents else base / "state"
