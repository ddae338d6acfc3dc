"""sd_notify, as systemd would receive it: the test binds the AF_UNIX datagram socket that
systemd would pass in NOTIFY_SOCKET and runs the real daemon against it ("Tell systemd
the truth": READY=1 only once the engine is up and the inboxes are watched, STATUS= with
the queue and throughput, WATCHDOG=1 while alive, RELOADING=1 … READY=1 around a reload,
STOPPING=1 on SIGTERM), and checks that no worker process inherits the socket."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import Daemon, drop, make_pdf, sentence_lines, wait_for
from simulated_engines import SIMULATED

from ocrd.config.load import parse_config
from ocrd.service import daemon as service

pytestmark = pytest.mark.e2e


@dataclass
class Datagram:
    fields: list[str]
    pid: int
    at: float

    def has(self, field: str) -> bool:
        return any(f == field or f.startswith(field) for f in self.fields)

    def value(self, key: str) -> str | None:
        for f in self.fields:
            if f.startswith(key + "="):
                return f.split("=", 1)[1]
        return None


class NotifySocket:
    """What systemd's end of NOTIFY_SOCKET sees: each datagram, with the sender's pid
    (SO_PASSCRED), as NotifyAccess=main checks it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.got: list[Datagram] = []
        self._lock = threading.Lock()
        self._done = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        space = socket.CMSG_SPACE(struct.calcsize("3i"))
        while not self._done:
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(65536, space)
            except TimeoutError:
                continue
            except OSError:
                return
            pid = 0
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("3i", payload[:12])[0]
            with self._lock:
                self.got.append(Datagram(data.decode().split("\n"), pid, time.monotonic()))

    def all(self) -> list[Datagram]:
        with self._lock:
            return list(self.got)

    def index(self, field: str, after: int = -1) -> int | None:
        for i, d in enumerate(self.all()):
            if i > after and d.has(field):
                return i
        return None

    def wait(self, field: str, after: int = -1, timeout: float = 30) -> int:
        return wait_for(lambda: self.index(field, after) is not None and
                        (self.index(field, after),), timeout, field)[0]

    def close(self) -> None:
        self._done = True
        self._thread.join(2)
        self.sock.close()


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(entry))
    return out


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                if "=" in item)


def start_notified(d: Daemon, notify: NotifySocket, watchdog_usec: int = 2_000_000) -> None:
    """`ocrd run` as systemd starts it: NOTIFY_SOCKET and WATCHDOG_USEC set."""
    d.start(wait_ready=False, systemd={"NOTIFY_SOCKET": str(notify.path),
                                       "WATCHDOG_USEC": str(watchdog_usec)})


def test_notify_sequence_reload_stop_and_no_leak_to_children(tmp_path: Path) -> None:
    notify = NotifySocket(tmp_path / "notify.sock")
    d = Daemon(tmp_path / "d", render={"workers": 2})
    with d:
        start_notified(d, notify)
        try:
            ready = notify.wait("READY=1", timeout=60)
            before = notify.all()[:ready]
            # Starting: the engine and its progress are reported, and nothing else.
            assert before and all(m.has("STATUS=") or m.has("EXTEND_TIMEOUT_USEC=")
                                  for m in before), before
            assert any("engine" in (m.value("STATUS") or "") for m in before), before
            assert d.event("ready") is not None, "READY=1 before the daemon logged ready"
            assert not any(m.has("WATCHDOG=1") for m in before)

            # Running: pings at about WATCHDOG_USEC/2, STATUS with queue and in-flight.
            first_ping = notify.wait("WATCHDOG=1", ready, timeout=10)
            notify.wait("WATCHDOG=1", first_ping, timeout=10)
            status = notify.wait("STATUS=queue", ready, timeout=15)
            text = notify.all()[status].value("STATUS") or ""
            assert "in flight" in text and "pages/s" in text, text

            # Throughput shows up in STATUS once a page is done.
            src = make_pdf(tmp_path / "one.pdf", [sentence_lines(5, 4)])
            drop(src, d.inbox / "one.pdf")
            wait_for(lambda: (d.outbox / "one.md").exists(), 60, "one.md")
            wait_for(lambda: any(m.has("STATUS=queue") and "0.00 pages/s" not in
                                 (m.value("STATUS") or "") for m in notify.all()[status:]),
                     15, "a STATUS with a non-zero page rate")

            # No worker inherits NOTIFY_SOCKET (their messages would be refused under
            # NotifyAccess=main, and the sender could not tell).
            kids = wait_for(lambda: children(d.proc.pid), 10, "worker processes")
            for kid in kids:
                leaked = {"NOTIFY_SOCKET", "WATCHDOG_USEC"} & environ_of(kid).keys()
                assert not leaked, f"child {kid} inherited {leaked}"

            # SIGHUP: RELOADING=1 with MONOTONIC_USEC in one datagram, then READY=1.
            mark = len(notify.all()) - 1
            d.proc.send_signal(signal.SIGHUP)
            reloading = notify.wait("RELOADING=1", mark, timeout=15)
            msg = notify.all()[reloading]
            usec = int(msg.value("MONOTONIC_USEC") or 0)
            assert abs(usec / 1e6 - time.monotonic()) < 15, msg
            notify.wait("READY=1", reloading, timeout=15)

            # A broken config on reload: the old one is kept, and READY=1 still comes.
            d.config_path.write_text("inboxes: [\n")
            mark = len(notify.all()) - 1
            d.proc.send_signal(signal.SIGHUP)
            reloading = notify.wait("RELOADING=1", mark, timeout=15)
            back = notify.wait("READY=1", reloading, timeout=15)
            assert "failed" in (notify.all()[back].value("STATUS") or "")

            # SIGTERM: STOPPING=1, a clean exit, and no READY=1 after it.
            mark = len(notify.all()) - 1
            d.proc.send_signal(signal.SIGTERM)
            stopping = notify.wait("STOPPING=1", mark, timeout=15)
            assert d.proc.wait(60) == 0
            after = notify.all()[stopping + 1:]
            assert not any(m.has("READY=1") for m in after), after
            # Every message came from the main process (NotifyAccess=main).
            assert {m.pid for m in notify.all()} == {d.proc.pid}
        except BaseException:
            print(d.log_text()[-4000:])
            print([m.fields for m in notify.all()])
            raise
        finally:
            notify.close()


class _SlowEngine:
    kind = "fake"
    model = "fake-model"
    max_concurrency = 1

    async def start(self) -> None:
        await asyncio.sleep(0.5)


def test_extend_timeout_while_engine_loads_fake_engine(tmp_path: Path, monkeypatch) -> None:
    """A real model takes minutes to load: while it does, EXTEND_TIMEOUT_USEC and STATUS
    keep coming. The engine is a fake that loads for 0.5 s, and the daemon's report
    interval (10 s) is shortened to 0.1 s."""
    notify = NotifySocket(tmp_path / "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify.path))
    real_wait = asyncio.wait

    async def quick_wait(fs, *, timeout=None, **kw):  # noqa: ANN001, ANN003
        return await real_wait(fs, timeout=None if timeout is None else min(timeout, 0.1),
                               **kw)

    cfg = parse_config({"state_dir": str(tmp_path / "state"), "metrics": {"listen": None}},
                       tmp_path)
    daemon = service.Daemon(cfg)
    daemon.engine = _SlowEngine()  # type: ignore[assignment]
    monkeypatch.setattr(service.asyncio, "wait", quick_wait)
    try:
        asyncio.run(daemon._start_engine())
        wait_for(lambda: sum(m.has("EXTEND_TIMEOUT_USEC=") for m in notify.all()) >= 2, 5,
                 "EXTEND_TIMEOUT_USEC")
    finally:
        notify.close()
    extends = [m for m in notify.all() if m.has("EXTEND_TIMEOUT_USEC=")]
    assert all(int(m.value("EXTEND_TIMEOUT_USEC") or 0) >= 10_000_000 for m in extends)
    assert all("loading the fake engine" in (m.value("STATUS") or "") for m in extends)
    assert not any(m.has("READY=1") for m in notify.all())


def _ping_gaps(notify: NotifySocket, start: float, end: float) -> float:
    """The longest time without WATCHDOG=1 between two monotonic instants."""
    pings = [m.at for m in notify.all() if m.has("WATCHDOG=1") and start <= m.at <= end]
    marks = [start, *pings, end]
    return max(b - a for a, b in zip(marks, marks[1:], strict=False))


@pytest.mark.slow
def test_watchdog_pings_go_on_through_a_long_document_and_after_idle(tmp_path: Path) -> None:
    """The liveness bug: 'pages are moving' used to advance only when a whole file
    finished, so a document longer than the stall threshold (page timeout + grace), or
    any document after an idle spell of that length, stopped WATCHDOG=1 and systemd
    killed a healthy daemon. Here page_timeout_seconds is 2 (threshold 17 s), a document
    takes 40 × 0.6 s = 24 s with one page in the engine at a time, the daemon then idles
    for 20 s, and a second document follows: pings (WATCHDOG_USEC = 2 s, as a supervisor
    would enforce it) never pause for more than the watchdog interval, and no `stalled`
    is logged."""
    notify = NotifySocket(tmp_path / "notify.sock")
    d = Daemon(tmp_path / "d", engine={"kind": SIMULATED, "options": {
        "max_batch": 1, "step_seconds": 0.05, "step_per_page_seconds": 0,
        "prefill_seconds_per_megapixel": 0, "decode_steps": 12, "decode_jitter": 0}},
        schedule={"pages_in_flight": 1, "page_timeout_seconds": 2},
        render={"workers": 1, "dpi": 36})
    long_doc = make_pdf(tmp_path / "long.pdf", [[f"page {i}"] for i in range(40)])
    short_doc = make_pdf(tmp_path / "short.pdf", [[f"page {i}"] for i in range(12)])
    with d:
        start_notified(d, notify)
        try:
            ready = notify.wait("READY=1", timeout=60)
            notify.wait("WATCHDOG=1", ready, timeout=10)
            t0 = time.monotonic()
            drop(long_doc, d.inbox / "long.pdf")
            wait_for(lambda: (d.outbox / "long.md").exists(), 120, "long.md")
            t1 = time.monotonic()
            assert t1 - t0 > 17, f"the document took {t1 - t0:.1f} s, not past the threshold"
            time.sleep(20)  # idle for longer than the stall threshold
            t2 = time.monotonic()
            drop(short_doc, d.inbox / "short.pdf")
            wait_for(lambda: (d.outbox / "short.md").exists(), 60, "short.md")
            t3 = time.monotonic()
            assert _ping_gaps(notify, t0, t1) <= 2.0, "pings paused during the long document"
            assert _ping_gaps(notify, t1, t3) <= 2.0, "pings paused after the idle spell"
            assert d.events("stalled") == []
            assert (d.outbox / "long.md").read_text().count("<!-- page ") == 40
            assert t3 - t2 < 30
        except BaseException:
            print(d.log_text()[-4000:])
            raise
        finally:
            notify.close()
