"""The container's entrypoint (container/entrypoint.sh) run directly as root, outside a
container: the config folder belongs to PUID, so whoever runs as PUID can plant links
there; the entrypoint, which runs as root at every start, must follow none of them —
no file created or handed over through a link — and must refuse to run ocrd as root
unless told so. A PUID change hands ocrd's own files to the new ids. The command it ends
with (`ocrd …`) is a stand-in here that says who runs it; tests/test_container.py runs
the real image."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENTRYPOINT = REPO / "container" / "entrypoint.sh"
UID, GID = 1234, 2345

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="the entrypoint runs as root and uses setpriv")


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A folder PUID can reach (pytest's own is root's alone, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="ocrd-entrypoint-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def entrypoint(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run the entrypoint with /config at tmp_path/config and a stand-in `ocrd`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "ocrd"
    fake.write_text('#!/bin/sh\necho "ocrd ran as $(id -u):$(id -g) with: $*"\n')
    fake.chmod(0o755)
    run_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PUID": str(UID),
               "PGID": str(GID), "OCRD_CONFIG": str(tmp_path / "config" / "config.yaml"),
               **env}
    return subprocess.run(["sh", str(ENTRYPOINT), *args], env=run_env, capture_output=True,
                          text=True, timeout=60)


def owner(path: Path) -> tuple[int, int]:
    st = path.lstat()
    return st.st_uid, st.st_gid


def test_a_first_start_writes_the_config_and_token_as_the_user(tmp_path: Path) -> None:
    res = entrypoint(tmp_path, "status")
    assert res.returncode == 0, res.stderr
    assert f"ocrd ran as {UID}:{GID} with: status" in res.stdout
    config, token = tmp_path / "config" / "config.yaml", tmp_path / "config" / "web-token"
    assert owner(config) == owner(token) == owner(config.parent) == (UID, GID)
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) > 16
    assert "inboxes:" in config.read_text()
    # the next start changes nothing
    before = token.read_text()
    assert entrypoint(tmp_path, "status").returncode == 0
    assert token.read_text() == before


@pytest.mark.parametrize("name", ["web-token", "config.yaml"])
def test_a_planted_link_is_neither_written_through_nor_handed_over(
        tmp_path: Path, name: str) -> None:
    """`web-token -> /tmp/somefile`: the old entrypoint created the target as root and
    chowned it to PUID (with /etc/ld.so.preload as the target, a way to root)."""
    folder = tmp_path / "config"
    folder.mkdir()
    dangling = tmp_path / "somefile"  # not there: `[ ! -e link ]` is true for it
    existing = tmp_path / "rootfile"
    existing.write_text("root's\n")
    os.chmod(existing, 0o644)
    for target in (dangling, existing):
        link = folder / name
        link.unlink(missing_ok=True)
        os.symlink(target, link)
        res = entrypoint(tmp_path, "run")
        assert res.returncode != 0, res.stdout
        assert "symbolic link" in res.stderr and str(link) in res.stderr, res.stderr
        assert "ocrd ran" not in res.stdout
        assert not dangling.exists() and not dangling.is_symlink()
        assert existing.read_text() == "root's\n" and owner(existing) == (0, 0)
        assert os.readlink(link) == str(target)


def test_a_linked_config_folder_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "config")
    res = entrypoint(tmp_path, "run")
    assert res.returncode != 0 and "symbolic link" in res.stderr
    assert list(elsewhere.iterdir()) == [] and owner(elsewhere) == (0, 0)


def test_root_ids_are_refused_unless_meant(tmp_path: Path) -> None:
    for ids in ({"PUID": "0"}, {"PGID": "0"}, {"PUID": "0", "PGID": "0"}):
        res = entrypoint(tmp_path, "status", **ids)
        assert res.returncode != 0 and "OCRD_RUN_AS_ROOT=yes" in res.stderr, res.stderr
        assert "ocrd ran" not in res.stdout
    res = entrypoint(tmp_path, "status", PUID="0", PGID="0", OCRD_RUN_AS_ROOT="yes")
    assert res.returncode == 0 and "ocrd ran as 0:0" in res.stdout, res.stderr
    assert entrypoint(tmp_path, "status", PUID="x1").returncode != 0


def test_a_puid_change_hands_ocrds_own_files_to_the_new_ids(tmp_path: Path) -> None:
    assert entrypoint(tmp_path, "status").returncode == 0
    folder = tmp_path / "config"
    (folder / "state").mkdir()
    (folder / "state" / "journal.sqlite3").write_bytes(b"x")
    os.chown(folder / "state", UID, GID)
    os.chown(folder / "state" / "journal.sqlite3", UID, GID)
    os.symlink("/etc/hostname", folder / "state" / "a-link")
    os.lchown(folder / "state" / "a-link", UID, GID)
    theirs = folder / "notes.txt"  # not ocrd's: left alone
    theirs.write_text("mine")
    os.chown(theirs, 4321, 4321)
    res = entrypoint(tmp_path, "status", PUID="1500", PGID="2600")
    assert res.returncode == 0, res.stderr
    assert "ocrd ran as 1500:2600" in res.stdout
    assert "it was 1234:2345" in res.stdout
    for path in ("web-token", "config.yaml", "state", "state/journal.sqlite3",
                 "state/a-link"):
        assert owner(folder / path) == (1500, 2600), path
    assert owner(Path("/etc/hostname")) == (0, 0)  # the link's target: untouched
    assert owner(theirs) == (4321, 4321)
