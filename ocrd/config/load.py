"""Reading a configuration: from a file (`read_config`, `load_config`) or from data
already parsed (`parse_config`), every problem found at once (check.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import structlog
import yaml

from ocrd.config.check import Checked, check
from ocrd.config.settings import Config, ConfigError

log = structlog.get_logger("ocrd.config")


def parse_config(data: Any, base: Path) -> Config:
    """The configuration in `data` (paths relative to `base`); ConfigError with every
    problem found, one per line, when there is any."""
    return check(data, base).config_or_raise()


def read_config(path: str | os.PathLike[str], defaults: dict | None = None) -> Checked:
    """Every problem of the config file at `path`, and what of it is usable;
    `defaults` fill keys the file leaves out (for commands that do not need them).
    ConfigError when the file cannot be read as YAML at all."""
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
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {yaml_problem(e)}") \
            from None
    if defaults and isinstance(data, dict):
        data = {**defaults, **data}
    return check(data, p.resolve().parent)


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line, with where it is in the file (PyYAML's own text spans
    several lines and calls the file "<unicode string>")."""
    problem = getattr(e, "problem", None)
    mark = getattr(e, "problem_mark", None)
    if problem is None:
        return " ".join(str(e).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if "'\\t'" in problem:
        return f"{where}a tab, which YAML does not take for indenting: use spaces"
    context = getattr(e, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context else "")


def load_config(path: str | os.PathLike[str], defaults: dict | None = None) -> Config:
    """The config in the file at `path` (see read_config); ConfigError with every
    problem when there is any. A key read from its old place is logged
    (`config_key_moved`), once per load."""
    checked = read_config(path, defaults)
    cfg = checked.config_or_raise()
    for note in checked.notes:
        log.warning("config_key_moved", note=note)
    return cfg
