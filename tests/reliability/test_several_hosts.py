"""Several ocrd hosts in front of one shared inbox — how a site adds GPUs without a
router — each with a state folder of its own, the inbox polled as on NFS or SMB: every
file is converted exactly once, whatever `on_success` says (with `keep` the originals
stay in the inbox, and no host may take one back in that another converted)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from helpers import Daemon, files_under, make_pdf, sentence_lines, wait_for
from simulated_engines import SIMULATED

from ocrd.outputs.destinations import Reservations, reservation_name, sweep_temporaries
from ocrd.safefs import Dir

pytestmark = [pytest.mark.reliability]

HOSTS = 3
FILES = 24


@pytest.mark.e2e
@pytest.mark.parametrize("on_success", ["keep", "archive"])
def test_three_daemons_on_one_inbox_convert_each_file_exactly_once(
        tmp_path: Path, on_success: str) -> None:
    shared = tmp_path / "share"
    inbox = shared / "inbox"
    inbox.mkdir(parents=True)
    box = {"path": str(inbox), "outbox": str(shared / "out"),
           "failed": str(shared / "failed"), "on_success": on_success,
           "watch": "polling", "quiet_seconds": 0.3}
    if on_success == "archive":
        box["archive"] = str(shared / "archive")
    hosts = [Daemon(tmp_path / f"host{k}", inboxes=[box], render={"dpi": 36},
                    engine={"kind": SIMULATED, "options": {"instant": True}})
             for k in range(HOSTS)]
    docs = [make_pdf(tmp_path / f"src{i}.pdf", [sentence_lines(i, 2)]).read_bytes()
            for i in range(4)]
    names = [f"doc{i:03d}.pdf" for i in range(FILES)]
    originals = {n: docs[i % len(docs)] + f"% {n}\n".encode() for i, n in enumerate(names)}
    try:
        for d in hosts:
            d.start()
        for name, data in originals.items():
            part = inbox / (name + ".part")
            part.write_bytes(data)
            part.rename(inbox / name)
        wait_for(lambda: len(list((shared / "out").glob("*.md"))) >= FILES, 180,
                 f"{FILES} files converted")
        # every host looks at the inbox several more times: nothing is taken again
        scans = [d.metric("ocrd_rescans_total") or 0 for d in hosts]
        wait_for(lambda: all((d.metric("ocrd_rescans_total") or 0) >= n + 4
                             for d, n in zip(hosts, scans, strict=True)), 60,
                 "four more polls by every host")
        claimed = sorted(e["file"] for d in hosts for e in d.events("file_claimed"))
        converted = sorted(e["file"] for d in hosts for e in d.events("file_converted"))
        for d in hosts:
            assert d.proc.poll() is None
    finally:
        for d in hosts:
            d.stop()
    assert claimed == names, [n for n in claimed if claimed.count(n) > 1]
    assert converted == names
    assert sorted(p.name for p in (shared / "out").glob("*.md")) == \
        [n.replace(".pdf", ".md") for n in names]  # no name-2.md
    assert files_under(shared / "failed") == []
    kept_or_archived = inbox if on_success == "keep" else shared / "archive"
    left = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in kept_or_archived.iterdir() if p.is_file()}
    assert left == {n: hashlib.sha256(b).hexdigest() for n, b in originals.items()}


def test_two_hosts_converting_same_named_files_never_share_an_output_name(
        tmp_path: Path) -> None:
    """Host A converts scan.pdf while host B converts scan.png into the same shared
    outbox: each process's own bookkeeping cannot see the other's, so the name is
    reserved on the share; a crashed host's reservation is swept at its next start
    (never another host's)."""
    out = tmp_path / "out"
    out.mkdir()
    host_a, host_b = Reservations("aaaaaaaa"), Reservations("bbbbbbbb")
    with Dir.open_root(out) as folder:
        first = host_a.choose(folder, "scan", "sha-pdf", "scan.pdf")
        second = host_b.choose(folder, "scan", "sha-png", "scan.png")
        assert (first, second) == ("scan", "scan-2")
        host_a.release(folder, first)
        host_b.release(folder, second)
        assert files_under(out) == []  # nothing left behind
        host_a.choose(folder, "report", "sha-1", "report.pdf")  # host A crashes here
        assert host_b.choose(folder, "report", "sha-2", "report.png") == "report-2"
        host_b.choose(folder, "memo", "sha-3", "memo.pdf")  # host B still at work
    assert sweep_temporaries(out, "aaaaaaaa") == 1  # host A starts again
    assert files_under(out) == [reservation_name("memo"), reservation_name("report-2")]
