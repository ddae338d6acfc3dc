"""The folder layout: whether the configured folders can work together, compared after
resolving links, and whether the daemon could use them. `check-config` reports both; the
daemon refuses to start (and a reload refuses to apply) a layout with overlaps.
"""

from __future__ import annotations

import os
from pathlib import Path

from ocrd.config.roots import is_mounted
from ocrd.config.settings import Config, InboxConfig


def _real(p: Path) -> Path:
    """The path with every symbolic link in it resolved (as far as it exists)."""
    return Path(os.path.realpath(p))


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def layout_problems(cfg: Config, numbers: list[int] | None = None) -> list[str]:
    """Folder layouts that would destroy state or loop, compared after resolving links:
    one line each. Refused by check-config, at start and at reload. `numbers`: each
    inbox's place in the config file's list (when some were left out), for the
    messages."""
    problems: list[str] = []
    places = numbers if numbers is not None else range(len(cfg.inboxes))
    boxes = [(i, box, _real(box.path)) for i, box in zip(places, cfg.inboxes, strict=True)]

    def reads(box: InboxConfig, inbox: Path, p: Path) -> bool:
        """The inbox would pick up what lies at p."""
        return _within(p, inbox) if box.recursive else p == inbox

    state = _real(cfg.state_dir)
    for i, box, inbox in boxes:
        if reads(box, inbox, state) or (inbox != state and _within(inbox, state)):
            problems.append(f"state_dir {str(cfg.state_dir)!r} and inboxes[{i}].path "
                            f"{str(box.path)!r} overlap: the daemon would claim its own "
                            "journal")
        for j, other, other_path in boxes:
            if j != i and inbox == other_path and j < i:
                problems.append(f"inboxes[{i}].path {str(box.path)!r} is the same folder "
                                f"as inboxes[{j}].path {str(other.path)!r}")
            elif j != i and reads(other, other_path, inbox) and inbox != other_path:
                problems.append(f"inboxes[{i}].path {str(box.path)!r} is inside the "
                                f"recursive inboxes[{j}].path {str(other.path)!r}: both "
                                "would claim its files")
        for name, dest in box.destinations().items():
            d = _real(dest)
            for j, other, other_path in boxes:
                if reads(other, other_path, d) or _within(other_path, d):
                    whose = "its inbox" if j == i else f"inboxes[{j}].path"
                    problems.append(
                        f"inboxes[{i}].{name} {str(dest)!r} overlaps {whose} "
                        f"{str(other.path)!r} (links resolved: {str(d)!r}, "
                        f"{str(other_path)!r}): outputs would be read back as input")
    return problems


def check_folders(cfg: Config, numbers: list[int] | None = None) -> list[str]:
    """Problems a running daemon would meet with the folders, besides the layout's
    (check-config reports them): every folder that is missing (ocrd creates a
    destination only with create_folders), not usable, or on a required mount where
    nothing is mounted. `numbers` as for layout_problems."""
    problems: list[str] = []
    for k, mount in enumerate(cfg.required_mounts):
        if not is_mounted(mount):
            problems.append(f"required_mounts[{k}] = {str(mount)!r}: no filesystem is "
                            "mounted there (the share is not mounted); the inboxes with "
                            "folders on it would wait")
    places = numbers if numbers is not None else range(len(cfg.inboxes))
    for i, box in zip(places, cfg.inboxes, strict=True):
        if not box.path.is_dir():
            problems.append(f"inboxes[{i}].path = {str(box.path)!r}: folder does not exist")
        elif not os.access(box.path, os.R_OK | os.W_OK | os.X_OK):
            problems.append(
                f"inboxes[{i}].path = {str(box.path)!r}: no read/write permission "
                "(ocrd moves claimed files out of the inbox)")
        for name, dest in box.destinations().items():
            if dest.is_dir():
                if not os.access(dest, os.W_OK | os.X_OK):
                    problems.append(f"inboxes[{i}].{name} = {str(dest)!r}: not writable")
                continue
            if dest.exists() or dest.is_symlink():
                problems.append(f"inboxes[{i}].{name} = {str(dest)!r}: not a folder")
                continue
            if not box.create_folders:
                problems.append(
                    f"inboxes[{i}].{name} = {str(dest)!r}: folder does not exist, and ocrd "
                    "does not create it (a share not mounted? a misspelt path?): create it, "
                    f"or set inboxes[{i}].create_folders: true")
                continue
            parent = dest
            while not parent.exists() and parent != parent.parent:
                parent = parent.parent
            if not os.access(parent, os.W_OK | os.X_OK):
                problems.append(f"inboxes[{i}].{name} = {str(dest)!r}: cannot be created "
                                f"({str(parent)!r} is not writable)")
    return problems
