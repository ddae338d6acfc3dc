"""Secrets kept out of the YAML: `engine.remote.api_key_file` (a file only ocrd's user can
read) or `engine.remote.api_key_credential` (a systemd credential:
`LoadCredential=NAME:/path` in the unit puts it in $CREDENTIALS_DIRECTORY, readable by this
service alone)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ocrd.config.engine import RemoteConfig
from ocrd.config.settings import ConfigError

CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"


def _read(path: Path, key: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{key}: {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise ConfigError(f"{key}: {str(path)!r} cannot be read ({why})") from None
    secret = text.strip("\r\n")
    if not secret.strip():
        raise ConfigError(f"{key}: {str(path)!r} is empty")
    return secret


def credential_path(name: str, environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where systemd put the credential `name`, or None outside such a unit."""
    folder = environ.get(CREDENTIALS_ENV)
    return Path(folder) / name if folder else None


def api_key(cfg: RemoteConfig, environ: Mapping[str, str] = os.environ) -> str | None:
    """The remote servers' API key from wherever the config says it is."""
    if cfg.api_key_file is not None:
        return _read(cfg.api_key_file, f"engine.remote.api_key_file = {str(cfg.api_key_file)!r}")
    if cfg.api_key_credential is not None:
        key = f"engine.remote.api_key_credential = {cfg.api_key_credential!r}"
        path = credential_path(cfg.api_key_credential, environ)
        if path is None:
            raise ConfigError(
                f"{key}: ${CREDENTIALS_ENV} is not set; systemd sets it for a unit with "
                f"LoadCredential={cfg.api_key_credential}:/path/to/the/key")
        return _read(path, key)
    return cfg.api_key


def with_api_key(cfg: RemoteConfig, environ: Mapping[str, str] = os.environ) -> RemoteConfig:
    """`cfg` with `api_key` filled in from its file or credential (the engines read only
    `api_key`)."""
    if cfg.api_key_file is None and cfg.api_key_credential is None:
        return cfg
    return cfg.model_copy(update={"api_key": api_key(cfg, environ)})
