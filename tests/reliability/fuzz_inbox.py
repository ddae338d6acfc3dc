"""A stateful fuzzer of the inbox: a seeded random sequence of what users of a shared
inbox do — create documents (whole, or written in chunks), rename them, replace files
and folders by symbolic links to a folder outside, make folders named like outputs, use
odd bytes in names, delete, hard-link (from inside and from outside) — against a running
daemon, and then the invariants:

- the daemon stayed alive;
- every file outside the configured folders is byte-identical and in place, and so is
  every decoy planted in the destinations under names ocrd would like to use;
- every original the fuzzer left in the inbox ended in exactly one place (archive/ when
  converted, failed/ beside an .error.json when not) with its bytes, every link it left
  ended in failed/ as a link, and nothing else is there;
- the work areas are empty and no temporary file is left.

    .venv/bin/python tests/reliability/fuzz_inbox.py --minutes 30 --seed 1 --out DIR

Every destructive step first renames its target out of the inbox into the fuzzer's own
folder (deleting is taking it there too): what ends up in that folder the fuzzer took;
everything else it produced must be in ocrd's folders. The expectation is computed at
the end — produced minus taken, by content — so it stays exact however the daemon races
the fuzzer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers import Daemon, claimed_files, make_pdf, text_image, wait_for  # noqa: E402
from simulated_engines import SIMULATED

ODD = [b"\xff", b"\xe9", b" ", b"\n", b"-", b"$(x)", b"\xe2\x82", b"\\", b":", b"*"]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Fuzz:
    root: Path
    rng: random.Random
    inbox: Path
    outside: Path
    private: Path  # the fuzzer's own folder (outside the inbox), where it takes things
    docs: list[bytes] = field(default_factory=list)
    produced: Counter = field(default_factory=Counter)  # sha256 of originals put in
    links: Counter = field(default_factory=Counter)  # targets of links put in
    decoys: dict[Path, bytes] = field(default_factory=dict)
    # files being written in chunks, by inode: [fd, data, bytes done]
    writing: dict[int, list] = field(default_factory=dict)
    ops: Counter = field(default_factory=Counter)
    seq: int = 0

    # -- names ----------------------------------------------------------------------------

    def name(self, ext: bytes = b".pdf") -> bytes:
        self.seq += 1
        parts = [b"doc", str(self.seq).encode()]
        if self.rng.random() < 0.4:
            parts.insert(1, self.rng.choice(ODD))
        if self.rng.random() < 0.05:
            parts.append(b"x" * 200)  # near the name limit
        return b"".join(parts) + ext

    def folders(self) -> list[bytes]:
        out = [b""]
        for folder, dirs, _files in os.walk(os.fsencode(self.inbox)):
            dirs[:] = [d for d in dirs if not d.startswith(b".")]
            rel = os.path.relpath(folder, os.fsencode(self.inbox))
            if rel != b".":
                out.append(rel + b"/")
        return out

    def entries(self, kind: str = "file") -> list[bytes]:
        out = []
        for folder, dirs, files in os.walk(os.fsencode(self.inbox)):
            dirs[:] = [d for d in dirs if not d.startswith(b".")]
            names = files if kind == "file" else dirs
            out += [os.path.join(folder, n) for n in names if not n.startswith(b".")]
        if kind != "file":
            return out
        return [p for p in out if not os.path.islink(p) and _ino(p) not in self.writing]

    def content(self) -> bytes:
        """A document of the pool, made unique by trailing bytes (PDFs after %%EOF, PNGs
        after IEND: readers ignore them), or garbage now and then."""
        if self.rng.random() < 0.1:
            return self.rng.randbytes(self.rng.randint(0, 3000))
        tail = f"\n%fuzz {self.seq} {self.rng.random()}\n".encode()
        return self.rng.choice(self.docs) + tail

    # -- taking things out of the inbox (the bookkeeping) -------------------------------

    def take(self, path: bytes) -> bool:
        """Rename path into the private folder. True: the fuzzer took it (it was there);
        False: gone (ocrd claimed it)."""
        self.seq += 1
        dest = os.path.join(os.fsencode(self.private), b"taken-%d" % self.seq)
        try:
            os.rename(path, dest)
        except OSError:
            return False
        return True

    def expected(self) -> tuple[Counter, Counter]:
        """(originals, link targets) that must be in ocrd's folders: produced minus what
        the fuzzer holds in its private folder at the end."""
        files, links, _temps, _paths = originals_in((self.private,), set())
        return self.produced - files, self.links - links

    # -- the operations -----------------------------------------------------------------

    def op_create(self) -> None:
        data = self.content()
        path = os.path.join(os.fsencode(self.inbox), self.rng.choice(self.folders()),
                            self.name(self.rng.choice([b".pdf", b".png", b".PDF", b""])))
        stage = os.path.join(os.fsencode(self.private), b"stage-%d" % self.seq)
        with open(stage, "wb") as f:
            f.write(data)
        try:  # a careful writer: complete when it appears (link: never replaces)
            os.link(stage, path)
        except OSError:
            return  # the name is taken (a folder made by op_mkdir)
        finally:
            os.unlink(stage)
        self.produced[sha(data)] += 1

    def op_write_chunked(self) -> None:
        """A slow writer (a scanner over SMB): a PDF, its trailer last."""
        data = self.rng.choice(self.docs[:2]) + f"\n%fuzz {self.seq}\n".encode()
        data = data.replace(b"%%EOF", b"") + b"%%EOF\n"
        path = os.path.join(os.fsencode(self.inbox), self.rng.choice(self.folders()),
                            self.name())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError:
            return  # the name is taken
        self.writing[os.fstat(fd).st_ino] = [fd, data, 0]

    def continue_writes(self) -> None:
        for ino, w in list(self.writing.items()):
            fd, data, done = w
            n = self.rng.randint(1, max(1, len(data) // 3))
            os.write(fd, data[done:done + n])
            w[2] = done + n
            if w[2] >= len(data):
                os.close(fd)
                del self.writing[ino]
                self.produced[sha(data)] += 1

    def op_rename(self) -> None:
        files = self.entries()
        if files:
            src = self.rng.choice(files)
            dest = os.path.join(os.path.dirname(src), self.name())
            try:
                os.rename(src, dest)  # same file, new name: still expected once
            except OSError:
                pass  # claimed meanwhile: fine, still expected once

    def op_file_to_link(self) -> None:
        files = self.entries()
        if files:
            path = self.rng.choice(files)
            if self.take(path):
                self._link(path, os.fsencode(self.outside / "secret.pdf"))

    def op_folder_to_link(self) -> None:
        folders = self.entries("dir")
        if folders:
            path = self.rng.choice(folders)
            if self.take(path):
                self._link(path, os.fsencode(self.outside))

    def _link(self, path: bytes, target: bytes) -> None:
        try:
            os.symlink(target, path)
        except FileExistsError:
            return
        self.links[target] += 1

    def op_mkdir(self) -> None:
        """A folder named like an output or an archived original ("x.md", "sub")."""
        base = self.rng.choice([b"doc%d.md" % self.rng.randint(1, self.seq + 1),
                                b"sub", b"doc%d" % self.rng.randint(1, self.seq + 1)])
        try:
            os.mkdir(os.path.join(os.fsencode(self.inbox), base))
        except OSError:
            pass

    def op_delete(self) -> None:
        files = self.entries()
        if files:
            self.take(self.rng.choice(files))  # taken = deleted, as far as ocrd goes

    def op_hardlink(self) -> None:
        if self.rng.random() < 0.5:
            src = os.fsencode(self.outside / "shared.pdf")
        else:
            files = self.entries()
            if not files:
                return
            src = self.rng.choice(files)
        dest = os.path.join(os.fsencode(self.inbox), self.rng.choice(self.folders()),
                            self.name())
        try:
            with open(src, "rb") as f:
                data = f.read()
            os.link(src, dest)
        except OSError:
            return  # the source was claimed meanwhile
        self.produced[sha(data)] += 1

    OPS = [("create", 6), ("write_chunked", 2), ("rename", 2), ("file_to_link", 1),
           ("folder_to_link", 1), ("mkdir", 1), ("delete", 1), ("hardlink", 1)]

    def step(self) -> None:
        names = [n for n, _ in self.OPS]
        weights = [w for _, w in self.OPS]
        op = self.rng.choices(names, weights)[0]
        self.ops[op] += 1
        getattr(self, "op_" + op)()
        self.continue_writes()

    def finish_writes(self) -> None:
        while self.writing:
            self.continue_writes()


def plant_decoys(f: Fuzz, d: Daemon) -> None:
    """Files of someone else's in the destinations, at names ocrd would like."""
    for folder, names in ((d.outbox, [b"doc%d.md" % i for i in range(1, 40)] + [b"doc.json"]),
                          (d.failed, [b"doc%d.pdf.error.json" % i for i in range(1, 40)]),
                          (d.archive, [b"doc%d.pdf" % i for i in range(1, 40)])):
        folder.mkdir(parents=True, exist_ok=True)
        for n in names:
            if f.rng.random() < 0.3:
                p = Path(os.fsdecode(os.path.join(os.fsencode(folder), n)))
                data = b"decoy " + n
                p.write_bytes(data)
                f.decoys[p] = data


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def originals_in(folders: tuple[Path, ...], decoys: set[Path]
                 ) -> tuple[Counter, Counter, list[str], dict[str, str]]:
    """(sha256 of regular originals, link targets, stray temporaries, path → sha256) in
    ocrd's folders."""
    files, links, temps, paths = Counter(), Counter(), [], {}
    skip = {os.fsencode(p) for p in decoys}
    for root in folders:
        for folder, dirs, names in os.walk(os.fsencode(root)):
            for n in names + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
                p = os.path.join(folder, n)
                if b".ocrd-tmp-" in n:
                    temps.append(os.fsdecode(p))
                elif os.path.islink(p):
                    links[os.readlink(p)] += 1
                elif p not in skip and not n.endswith(b".error.json"):
                    with open(p, "rb") as fh:
                        h = sha(fh.read())
                    files[h] += 1
                    paths[os.fsdecode(p)] = h
    return files, links, temps, paths


def _ino(path: bytes) -> int:
    try:
        return os.lstat(path).st_ino
    except OSError:
        return -1


def run(tmp: Path, seed: int, seconds: float, ops_per_second: float = 20) -> dict:
    rng = random.Random(seed)
    outside = tmp / "outside"
    outside.mkdir()
    make_pdf(outside / "secret.pdf", [["secret outside data"]])
    make_pdf(outside / "shared.pdf", [["shared outside data"]])
    private = tmp / "fuzzer"
    private.mkdir()
    d = Daemon(tmp / "d", engine={"kind": SIMULATED, "options": {"instant": True}},
               render={"dpi": 36, "workers": 1}, rescan_seconds=2,
               log={"level": "info", "format": "json"})
    d.config["inboxes"][0].update(recursive=True, quiet_seconds=0.3, incomplete_seconds=30)
    f = Fuzz(tmp, rng, d.inbox, outside, private)
    docs = tmp / "docs"
    docs.mkdir()
    f.docs = [make_pdf(docs / "a.pdf", [["alpha beta"]]).read_bytes(),
              make_pdf(docs / "b.pdf", [["gamma delta"], ["epsilon"]]).read_bytes()]
    text_image(["zeta eta"], (300, 120)).save(docs / "c.png")
    f.docs.append((docs / "c.png").read_bytes())
    before_outside = snapshot(outside)
    plant_decoys(f, d)
    report: dict = {"seed": seed, "seconds": seconds}
    t0 = time.monotonic()
    with d:
        d.start()
        alive = True
        while time.monotonic() - t0 < seconds:
            f.step()
            if d.proc.poll() is not None:
                alive = False
                break
            time.sleep(rng.expovariate(ops_per_second))
        f.finish_writes()
        report["ops"] = dict(f.ops)
        if alive:
            settled = _settle(d)
            report["settled"] = settled
        report["alive"] = alive and d.proc.poll() is None
        events = Counter(e.get("event") for e in d.events())
        report["daemon_events"] = {k: v for k, v in events.items() if k in (
            "file_claimed", "file_converted", "file_failed", "claim_swapped", "claim_lost",
            "check_failed", "task_failed", "internal_error", "output_unwritable",
            "failed_folder_unwritable", "stalled", "claim_undone")}
    files, links, temps, paths = originals_in((d.archive, d.failed), set(f.decoys))
    want, want_links = f.expected()
    temps += [str(p) for p in d.outbox.rglob("*") if ".ocrd-tmp-" in p.name]
    report.update(
        expected=sum(want.values()), found=sum(files.values()),
        missing=sum((want - files).values()), extra=sum((files - want).values()),
        extra_files=sorted(p for p, h in paths.items() if h in files - want)[:10],
        links_expected=sum(want_links.values()), links_found=sum(links.values()),
        links_wrong=sum(((want_links - links) + (links - want_links)).values()),
        temporaries=temps, work_left=claimed_files(d.inbox),
        outside_changed=snapshot(outside) != before_outside,
        decoys_changed=[str(p) for p, data in f.decoys.items()
                        if not p.is_file() or p.read_bytes() != data],
        secret_converted=_secret_converted(d, outside))
    return report


def _settle(d: Daemon) -> bool:
    """Until nothing is left to do: no document in the inbox, nothing claimed."""
    def quiet() -> bool:
        return not _left_in(d.inbox) and not claimed_files(d.inbox) and \
            d.metric("ocrd_queue_depth") == 0
    try:
        wait_for(quiet, 180, "the daemon to settle", every=0.5)
    except AssertionError:
        return False
    return True


def _left_in(inbox: Path) -> list[str]:
    """Files and links still in the inbox (dot-folders aside). os.walk, not rglob: the
    daemon removes folders meanwhile, and os.walk passes over what vanished."""
    left = []
    for folder, dirs, files in os.walk(inbox):
        links = [x for x in dirs if os.path.islink(os.path.join(folder, x))]
        left += [os.path.join(folder, n) for n in files + links if not n.startswith(".")]
        dirs[:] = [x for x in dirs if not x.startswith(".") and x not in links]
    return left


def _secret_converted(d: Daemon, outside: Path) -> bool:
    secret = sha((outside / "secret.pdf").read_bytes())
    for side in d.outbox.rglob("*.json"):
        try:
            if json.loads(side.read_text()).get("source", {}).get("sha256") == secret:
                return True
        except (ValueError, OSError):
            continue
    return False


def problems(report: dict) -> list[str]:
    out = []
    if not report.get("alive"):
        out.append("the daemon died")
    if not report.get("settled"):
        out.append("the daemon did not settle")
    for key in ("missing", "extra", "links_wrong"):
        if report.get(key):
            out.append(f"{key}: {report[key]}")
    for key in ("temporaries", "work_left", "decoys_changed"):
        if report.get(key):
            out.append(f"{key}: {report[key][:5]}")
    if report.get("outside_changed"):
        out.append("a file outside the configured folders changed")
    if report.get("secret_converted"):
        out.append("the secret outside was converted")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=20, help="operations per second")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report = run(args.out, args.seed, args.minutes * 60, args.rate)
    report["problems"] = problems(report)
    print(json.dumps(report, indent=2, default=str))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
