"""Typed configuration, read from YAML and validated with pydantic.

Every key is documented in config.example.yaml. Unknown keys are errors (a typo must not
be silently ignored), and every error names the key and the offending value. The
`engine:` section's models live in engine_config.py.
"""

from __future__ import annotations

import grp
import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from . import listen
from .engine_config import EngineConfig, _Strict

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
    """A configuration problem, phrased as one line that names the key and the value."""


class InboxConfig(_Strict):
    path: Path
    outbox: Path
    failed: Path
    on_success: Literal["archive", "delete", "keep"] = "archive"
    archive: Path | None = None
    recursive: bool = False
    # Only names matching one of these (fnmatch, case-insensitive) are considered.
    include: list[str] = Field(default_factory=lambda: ["*"])
    # Extra ignore patterns on top of the built-in list.
    ignore: list[str] = Field(default_factory=list)
    # A file is ready once its size and mtime have not changed for this long.
    quiet_seconds: float = Field(default=5.0, ge=0)
    # A file that stays incomplete (truncated PDF, zero bytes) this long after its last
    # change is given up on and moved to failed/.
    incomplete_seconds: float = Field(default=600.0, ge=0)
    watch: Literal["auto", "inotify", "polling"] = "auto"
    # Output file mode (octal string like "0640") and group (name or gid).
    file_mode: str = "0644"
    dir_mode: str = "0755"
    group: str | None = None
    # What to ask the model for: markdown (layout, figures, tables), text (plain OCR) or
    # custom (custom_prompt). Ignored by tesseract.
    prompt: Literal["markdown", "text", "custom"] = "markdown"
    custom_prompt: str | None = None
    # markdown (always) and pdf: the original, searchable (ocrd/textpdf.py); on a page
    # that has text already, the layer replaces, is added to, or skips (skip_if_text)
    outputs: list[Literal["markdown", "pdf"]] = Field(default_factory=lambda: ["markdown"])
    pdf_text_layer: Literal["replace", "add", "skip_if_text"] = "skip_if_text"
    pdf_suffix: str = ".pdf"

    @field_validator("file_mode", "dir_mode")
    @classmethod
    def _octal(cls, v: str | int) -> str:
        text = str(v)
        try:
            mode = int(text, 8)
        except ValueError:
            raise ValueError(f"must be an octal mode like '0640', got {v!r}") from None
        if not 0 <= mode <= 0o7777:
            raise ValueError(f"must be an octal mode like '0640', got {v!r}")
        return text

    @field_validator("group")
    @classmethod
    def _group(cls, v: str | None) -> str | None:
        if v is None or v.isdigit():
            return v
        try:
            grp.getgrnam(v)
        except KeyError:
            raise ValueError(f"no such group {v!r}") from None
        return v

    @model_validator(mode="after")
    def _consistent(self) -> InboxConfig:
        if self.on_success == "archive" and self.archive is None:
            raise ValueError("on_success is 'archive' but no 'archive' folder is set")
        if self.prompt == "custom" and not self.custom_prompt:
            raise ValueError("prompt is 'custom' but no 'custom_prompt' is set")
        if "markdown" not in self.outputs:
            raise ValueError("outputs must list 'markdown' (always written; add 'pdf')")
        if not re.fullmatch(r"[^/\0]{0,40}\.pdf", self.pdf_suffix):
            raise ValueError(f"pdf_suffix must end in '.pdf' (like '.ocr.pdf'), got "
                             f"{self.pdf_suffix!r}")
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
        return int(self.group) if self.group.isdigit() else grp.getgrnam(self.group).gr_gid

    def destinations(self) -> dict[str, Path]:
        out = {"outbox": self.outbox, "failed": self.failed}
        if self.archive is not None:
            out["archive"] = self.archive
        return out


class RenderConfig(_Strict):
    # born-digital pages; None = the engine's choice (tesseract 300, DeepSeek-OCR-2 144)
    dpi: int | None = Field(default=None, ge=36, le=1200)
    # a scanned page (one image covering it) renders at its image's own resolution,
    # within these; None = the engine's choice (tesseract 200-600, DeepSeek-OCR-2 144-200)
    scan_min_dpi: int | None = Field(default=None, ge=36, le=2400)
    scan_max_dpi: int | None = Field(default=None, ge=36, le=2400)
    renderer: Literal["pypdfium2", "pdf2image"] = "pypdfium2"
    # render worker processes; 0 = one per CPU core
    workers: int = Field(default=0, ge=0)
    # pages rendered ahead of the engine, per document being converted
    lookahead: int = Field(default=4, ge=1)


class LimitsConfig(_Strict):
    max_pages: int = Field(default=2000, ge=1)
    max_file_bytes: int = Field(default=2 * 1024**3, ge=1)
    # per page image, after rendering; guards against decompression bombs
    max_pixels: int = Field(default=200_000_000, ge=1)
    # page images in flight, all files together (ocrd/budget.py); a page that would cost
    # more is rendered at a lower dpi. null (default): 1 GiB, raised to what the engine's
    # pages in flight cost as A4 pages (a GPU engine keeps hundreds), one page at most 1 GiB
    memory_bytes: int | None = Field(default=None, ge=64 * 1024**2)


class ScheduleConfig(_Strict):
    # pages in the engine at once, across all files; 0 = the engine's own preference
    pages_in_flight: int = Field(default=0, ge=0)
    # files that become ready within this window form one batch, smallest first
    batch_window_seconds: float = Field(default=0.5, ge=0)
    # documents rendered/converted at the same time
    max_active_documents: int = Field(default=4, ge=1)
    # a file is given up (failed, reason too_many_attempts) after this many starts that
    # did not finish (e.g. the daemon crashed on it each time)
    max_attempts: int = Field(default=3, ge=1)
    # engine errors on one page before the page (and its file) fails
    page_retries: int = Field(default=2, ge=0)
    # per page; a page that takes longer counts as an engine error
    page_timeout_seconds: float = Field(default=900.0, gt=0)


class LogConfig(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    # auto: console on a terminal, JSON lines otherwise
    format: Literal["auto", "console", "json"] = "auto"


def _address(v: str | None) -> str | None:
    if v is not None:
        listen.parse(v)  # a ValueError that says what is wrong
    return v


class MetricsConfig(_Strict):
    # host:port for /metrics, /healthz, /readyz; null turns it off
    listen: str | None = "127.0.0.1:9464"

    _hostport = field_validator("listen")(classmethod(lambda cls, v: _address(v)))


class WebConfig(_Strict):
    """The console (ocrd/web/): status, files, page review, retry; and its JSON API."""

    # host:port of the console; null turns it off. Off loopback a token is required.
    listen: str | None = "127.0.0.1:9465"
    # file holding the access token (one line); relative names are looked up in
    # $CREDENTIALS_DIRECTORY first (systemd LoadCredential=). Required off loopback.
    token_file: Path | None = None
    # page images for the review page, rendered from the original when first asked
    # for (conversion pays nothing) and cached under state_dir/previews; kept this many
    # days and at most this many bytes in all (oldest documents removed first)
    previews: bool = True
    previews_days: float = Field(default=30.0, gt=0)
    previews_max_bytes: int = Field(default=2 * 1024**3, ge=0)
    # full-text search over every converted page (state_dir/search.sqlite3)
    search: bool = True
    # the largest file the console's upload form takes
    upload_max_bytes: int = Field(default=200 * 1024**2, ge=0)

    _hostport = field_validator("listen")(classmethod(lambda cls, v: _address(v)))

    @model_validator(mode="after")
    def _token_off_loopback(self) -> WebConfig:
        if not self.loopback and self.token_file is None:
            raise ValueError(f"listen {self.listen!r} is not a loopback address: set "
                             "web.token_file (a file, or a systemd credential's name) so "
                             "the console needs a token, or listen on 127.0.0.1")
        return self

    @property
    def loopback(self) -> bool:
        """Reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
        if self.listen is None:
            return True
        return ipaddress.ip_address(listen.parse(self.listen).host).is_loopback


class Config(_Strict):
    state_dir: Path
    # seconds between full rescans of every inbox (events are only hints)
    rescan_seconds: float = Field(default=60.0, gt=0)
    # seconds between polls for inboxes in polling mode
    poll_seconds: float = Field(default=2.0, gt=0)
    drain_timeout_seconds: float = Field(default=60.0, ge=0)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    render: RenderConfig = Field(default_factory=RenderConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    web: WebConfig = Field(default_factory=WebConfig)
    inboxes: list[InboxConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _folders_apart(self) -> Config:
        """Refuse layouts that would feed outputs back in or mix inboxes."""
        seen: dict[Path, str] = {}
        for i, box in enumerate(self.inboxes):
            inbox = _norm(box.path)
            for name, dest in box.destinations().items():
                d = _norm(dest)
                if d == inbox or (box.recursive and inbox in d.parents):
                    raise ValueError(
                        f"inboxes[{i}].{name} {str(dest)!r} is inside its inbox "
                        f"{str(box.path)!r}: outputs would be read back as input")
            if inbox in seen:
                raise ValueError(f"inboxes[{i}].path {str(box.path)!r} is listed twice")
            seen[inbox] = f"inboxes[{i}]"
        return self

    def resolve(self, base: Path) -> Config:
        """Paths relative to the config file's folder become absolute."""
        def fix(p: Path | None) -> Path | None:
            if p is None:
                return None
            p = p.expanduser()
            return p if p.is_absolute() else (base / p)

        data = self.model_copy(deep=True)
        data.state_dir = fix(data.state_dir)  # type: ignore[assignment]
        token = data.web.token_file
        # A bare name may be a systemd credential (looked up at start); a path is a path.
        if token is not None and len(token.parts) > 1:
            data.web.token_file = fix(token)
        for box in data.inboxes:
            box.path = fix(box.path)  # type: ignore[assignment]
            box.outbox = fix(box.outbox)  # type: ignore[assignment]
            box.failed = fix(box.failed)  # type: ignore[assignment]
            box.archive = fix(box.archive)
        eng = data.engine
        eng.api_key_file = fix(eng.api_key_file)
        eng.tls_ca_file, eng.tls_cert_file, eng.tls_key_file = (
            fix(eng.tls_ca_file), fix(eng.tls_cert_file), fix(eng.tls_key_file))
        return data


def _norm(p: Path) -> Path:
    return Path(os.path.normpath(os.path.abspath(p)))


def describe_error(err: Any) -> str:
    """One pydantic error as a line that names the key and the value."""
    loc = ".".join(str(x) for x in err.get("loc", ()) if x != "__root__")
    msg = err.get("msg", "invalid")
    if err.get("type") == "extra_forbidden":
        return f"unknown key {loc!r} (value {err.get('input')!r}); check its spelling"
    if err.get("type") == "missing":
        return f"missing key {loc!r}"
    msg = msg.removeprefix("Value error, ")
    if loc:
        value = err.get("input")
        if isinstance(value, dict):
            return f"{loc}: {msg}"
        return f"{loc} = {value!r}: {msg}"
    return msg


def parse_config(data: Any, base: Path) -> Config:
    if not isinstance(data, dict):
        raise ConfigError("the configuration must be a YAML mapping of keys to values")
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError("; ".join(describe_error(err) for err in e.errors())) from None
    return cfg.resolve(base)


def load_config(path: str | os.PathLike[str], defaults: dict | None = None) -> Config:
    """The config in the file at `path`; `defaults` fill keys the file leaves out (for
    commands that do not need them, such as `state_dir` for `ocrd convert`)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except OSError as e:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {e}") from None
    if defaults and isinstance(data, dict):
        data = {**defaults, **data}
    return parse_config(data, p.resolve().parent)
