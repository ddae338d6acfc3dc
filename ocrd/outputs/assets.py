"""A document's figures (NAME.assets/): built under a temporary name next to their
final place, and put in place in one rename once the document is done."""

from __future__ import annotations

import os

from ocrd import safefs
from ocrd.outputs import destinations


class Staging:
    """NAME.assets/ built under a temporary name next to its final place."""

    def __init__(self, folder: safefs.Dir, base: str, perms: destinations.Perms) -> None:
        self.folder = folder
        self.final = destinations.assets_name(base)
        self.perms = perms
        self.tmp: str | None = None
        self.dir: safefs.Dir | None = None
        self.files = 0

    @property
    def used(self) -> bool:
        return self.files > 0

    def add(self, name: str, data: bytes) -> None:
        if self.dir is None:
            self.tmp = self.perms.tmp_name(self.final)
            self.folder.mkdir(self.tmp, 0o700)  # fails if the name exists
            self.dir = self.folder.sub(self.tmp)
        destinations.write_atomic(self.dir, name, data, self.perms, replace=False)
        self.files += 1

    def commit(self) -> None:
        if self.dir is None or self.tmp is None:
            # No figures this time: remove assets an earlier run of this document left.
            self.folder.remove_tree(self.final)
            return
        self.dir.fsync()
        os.fchmod(self.dir.fd, self.perms.dir_mode)
        if self.perms.gid is not None:
            os.fchown(self.dir.fd, -1, self.perms.gid)
        self.dir.close()
        self.dir = None
        self.folder.remove_tree(self.final)  # this document's earlier figures
        self.folder.rename(self.tmp, self.folder, self.final)
        self.tmp = None

    def discard(self) -> None:
        if self.dir is not None:
            self.dir.close()
            self.dir = None
        if self.tmp is not None:
            self.folder.remove_tree(self.tmp)
            self.tmp = None
