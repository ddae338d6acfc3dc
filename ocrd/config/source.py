"""Which config file a command reads, the way services look for theirs: `-c FILE`, else
$OCRD_CONFIG, else /etc/ocrd/config.yaml — and where the answer came from, to say so."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ocrd.config.check import Checked
from ocrd.config.load import read_config
from ocrd.config.settings import Config, ConfigError

ENV = "OCRD_CONFIG"
# A module constant, read at each call, so that tests can point it elsewhere.
DEFAULT = Path("/etc/ocrd/config.yaml")


@dataclass(frozen=True)
class ConfigFile:
    path: Path
    origin: str  # "-c", "$OCRD_CONFIG" or "default"

    def __str__(self) -> str:
        how = {"-c": "given with -c", f"${ENV}": f"from ${ENV}", "default": "the default"}
        return f"{self.path} ({how.get(self.origin, self.origin)})"


def find(given: Path | None, environ: Mapping[str, str] = os.environ) -> ConfigFile:
    if given is not None:
        return ConfigFile(given, "-c")
    named = environ.get(ENV)
    if named:
        return ConfigFile(Path(named), f"${ENV}")
    if os.path.lexists(DEFAULT):
        return ConfigFile(DEFAULT, "default")
    raise ConfigError(f"no config file: give one with -c FILE, name it in ${ENV}, or write "
                      f"{DEFAULT} (config.example.yaml is one to start from)")


def read(found: ConfigFile) -> Checked:
    """Every problem of the config in `found` (ConfigError if it cannot be read)."""
    try:
        return read_config(found.path)
    except ConfigError as e:
        raise noted(e, found) from None


def load(found: ConfigFile) -> Config:
    """The config in `found`; an error names where the file's name came from."""
    try:
        return read(found).config_or_raise()
    except ConfigError as e:
        raise noted(e, found) from None


def noted(e: ConfigError, found: ConfigFile) -> ConfigError:
    """`e`, saying which file it is about unless the command line named it."""
    if found.origin == "-c" or any("[config file: " in p for p in e.problems):
        return e
    if len(e.problems) == 1:
        return ConfigError(f"{e.problems[0]} [config file: {found}]")
    return ConfigError(*e.problems, f"[config file: {found}]")
