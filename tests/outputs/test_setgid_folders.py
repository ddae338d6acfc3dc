"""Folders ocrd makes in a shared folder laid out as systemd/ocrd.tmpfiles lays it out
(setgid, mode 2770) with the example config's `dir_mode: "2770"`, under the unit's
RestrictSUIDSGID=yes: systemd's seccomp filter refuses any chmod that sets the setuid or
setgid bit (EPERM), so a new folder must take the bit from its parent, not from a chmod.
The filter is faked here (the fake refuses what it refuses); the README's service test
(tests/systemd/test_readme.py) runs the real one."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ocrd.safefs import Dir


def fake_restrict_suid_sgid(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, os.fchmod/os.chmod as under RestrictSUIDSGID=yes; the modes asked
    for."""
    asked: list[int] = []
    real_fchmod, real_chmod = os.fchmod, os.chmod

    def refuse(mode: int) -> None:
        asked.append(mode)
        if mode & (stat.S_ISUID | stat.S_ISGID):
            raise PermissionError(1, "Operation not permitted")

    def fchmod(fd: int, mode: int) -> None:
        refuse(mode)
        real_fchmod(fd, mode)

    def chmod(path: object, mode: int, *args: object, **kw: object) -> None:
        refuse(mode)
        real_chmod(path, mode, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fchmod", fchmod)
    monkeypatch.setattr(os, "chmod", chmod)
    return asked


def test_a_folder_in_a_setgid_share_keeps_the_bit_without_a_chmod(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    share = tmp_path / "markdown"
    share.mkdir()
    share.chmod(0o2770)  # systemd-tmpfiles, outside the unit
    asked = fake_restrict_suid_sgid(monkeypatch)
    old = os.umask(0o007)  # the unit's UMask=
    try:
        with Dir.open_root(share) as root, root.mkdir("sub", 0o2770) as sub, \
                sub.mkdir("work", 0o700):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE((share / "sub").stat().st_mode) == 0o2770
    assert (share / "sub").stat().st_gid == share.stat().st_gid
    # the private folder still loses the group's access (and the bit) by a plain chmod
    assert stat.S_IMODE((share / "sub" / "work").stat().st_mode) == 0o700
    assert all(not mode & stat.S_ISGID for mode in asked)


def test_modes_the_umask_took_away_are_given_back(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with Dir.open_root(tmp_path) as root, root.mkdir("shared", 0o775):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o775
