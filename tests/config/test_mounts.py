"""`required_mounts`: a folder on a share's mount point is used only while the share is
mounted there. What counts is /proc/self/mountinfo's top mount at that point, and that
it is another filesystem than the one holding the folder: systemd's sandbox bind-mounts
every ReadWritePaths= folder onto itself (measured in a booted container: the unit's
PrivateMounts/ProtectSystem=strict with ReadWritePaths=-/srv/nas shows /srv/nas as a
mount point before any share is mounted), and that must not pass for the share."""

from __future__ import annotations

from pathlib import Path

from ocrd.config.roots import is_mounted, mount_of

ROOT = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
PROC = "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
# the sandbox's bind mount of /srv/nas (a folder of the root filesystem) onto itself
BIND = "40 27 254:0 /srv/nas /srv/nas rw,relatime - ext4 /dev/vda rw\n"
# the share, mounted over it (propagated into the service's namespace)
SHARE_ON_BIND = "41 40 0:52 / /srv/nas rw,relatime - nfs4 nas:/scans rw\n"
SHARE = "41 27 0:52 / /srv/nas rw,relatime - nfs4 nas:/scans rw\n"
SPACE = "42 27 0:53 / /srv/my\\040nas rw,relatime - cifs //nas/scans rw\n"


def info(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "mountinfo"
    path.write_text("".join(lines))
    return str(path)


def test_only_another_filesystem_on_top_counts_as_mounted(tmp_path: Path) -> None:
    nas = Path("/srv/nas")
    assert not is_mounted(nas, info(tmp_path, ROOT, PROC))  # nothing there
    assert not is_mounted(nas, info(tmp_path, ROOT, BIND))  # the sandbox's bind mount
    assert is_mounted(nas, info(tmp_path, ROOT, BIND, SHARE_ON_BIND))
    assert is_mounted(nas, info(tmp_path, ROOT, SHARE))
    assert is_mounted(Path("/srv/my nas"), info(tmp_path, ROOT, SPACE))
    assert not is_mounted(nas, str(tmp_path / "no-such-file"))


def test_a_folder_belongs_to_the_deepest_required_mount_above_it() -> None:
    mounts = [Path("/srv"), Path("/srv/nas"), Path("/mnt/usb")]
    assert mount_of(Path("/srv/nas/scans/out"), mounts) == Path("/srv/nas")
    assert mount_of(Path("/srv/nas"), mounts) == Path("/srv/nas")
    assert mount_of(Path("/srv/other"), mounts) == Path("/srv")
    assert mount_of(Path("/srvx"), mounts) is None
