"""The metrics listener as scrapers and load balancers meet it (ocrd/service/metrics.py): names in
Prometheus' conventions read back with prometheus_client's parser, HEAD and gzip, /readyz
saying why, a burst of 200 scrapers all answered, slow clients timed out without a
thread each, IPv6, and addresses that cannot be listened on refused before the start."""

from __future__ import annotations

import gzip
import http.client
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families

from ocrd import cli
from ocrd.config.load import parse_config
from ocrd.config.settings import ConfigError
from ocrd.service.metrics import HealthServer, ListenError, Metrics
from ocrd.service.systemd import Notifier


@pytest.fixture
def server() -> HealthServer:
    metrics = Metrics()
    metrics.file_seconds.observe(3.2)
    metrics.page_seconds.observe(0.4)
    metrics.files.labels("ok").inc()
    srv = HealthServer(metrics, "127.0.0.1:0", live=lambda: True, ready=lambda: True,
                       timeout=0.5)
    srv.start()
    yield srv
    srv.stop()


def request(address: str, method: str = "GET", path: str = "/metrics",
            headers: dict | None = None, family: int = socket.AF_INET,
            ) -> tuple[int, dict[str, str], bytes]:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def families(body: bytes) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_names_follow_prometheus_conventions(server: HealthServer) -> None:
    status, headers, body = request(server.address)
    assert status == 200 and headers["content-type"].startswith("text/plain; version=")
    fams = families(body)
    assert fams["ocrd_file_duration_seconds"].type == "histogram"
    assert fams["ocrd_page_duration_seconds"].type == "histogram"
    # the process collector
    for name in ("process_resident_memory_bytes", "process_cpu_seconds",
                 "process_open_fds", "process_start_time_seconds", "python_info"):
        assert name in fams, name
    samples = [s for f in fams.values() for s in f.samples]
    assert not [s.name for s in samples if s.name.endswith("_created")]
    assert [s.value for s in samples if s.name == "ocrd_file_duration_seconds_count"] == [1]
    # every duration is a *_duration_seconds histogram; no other histogram in seconds
    for f in fams.values():
        if f.type == "histogram" and f.name.startswith("ocrd_"):
            assert f.name.endswith("_duration_seconds"), f.name


def test_head_and_gzip_through_prometheus_clients_exposition(server: HealthServer) -> None:
    status, headers, body = request(server.address, "HEAD")
    assert status == 200 and body == b""
    assert headers["content-type"].startswith("text/plain; version=")
    assert int(headers["content-length"]) > 1000
    for path in ("/healthz", "/readyz"):
        status, _, body = request(server.address, "HEAD", path)
        assert (status, body) == (200, b"")
    status, headers, body = request(server.address, headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert "ocrd_files" in families(gzip.decompress(body))
    status, headers, _ = request(server.address, "POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"


def test_readyz_says_why_it_is_not_ready() -> None:
    notifier = Notifier()  # no NOTIFY_SOCKET: it still keeps the last STATUS=
    notifier.send("STATUS=loading the vllm engine (deepseek-ai/DeepSeek-OCR-2) (40 s)")
    srv = HealthServer(Metrics(), "127.0.0.1:0", live=lambda: False, ready=lambda: False,
                       why=lambda: notifier.status)
    srv.start()
    try:
        status, _, body = request(srv.address, path="/readyz")
        assert status == 503
        assert body == b"not ready: loading the vllm engine (deepseek-ai/DeepSeek-OCR-2) " \
            b"(40 s)\n"
        assert request(srv.address, path="/healthz")[:3:2] == (503, b"stalled\n")
    finally:
        srv.stop()


def test_200_concurrent_scrapes_are_all_answered(server: HealthServer) -> None:
    host, _, port = server.address.rpartition(":")
    start = threading.Barrier(200)
    results: list[object] = [None] * 200

    def scrape(i: int) -> None:
        start.wait()
        try:
            status, _, body = request(server.address)
            results[i] = (status, "ocrd_files" in families(body))
        except OSError as e:
            results[i] = e

    threads = [threading.Thread(target=scrape, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    failed = [r for r in results if r != (200, True)]
    assert not failed, f"{len(failed)} of 200 not answered, e.g. {failed[:3]}"


def test_slow_clients_are_timed_out_without_a_thread_each(server: HealthServer) -> None:
    """100 clients connect and send nothing: the server serves at most WORKERS of them at
    once (the rest wait in the backlog), drops each after its timeout (0.5 s here), and
    then answers a real scrape."""
    host, _, port = server.address.rpartition(":")
    before = threading.active_count()
    slow = [socket.create_connection((host, int(port)), timeout=60) for _ in range(100)]
    try:
        peak = [0]

        def dropped(s: socket.socket) -> bool:
            peak[0] = max(peak[0], threading.active_count() - before)
            return s.recv(1) == b""  # the server closed it

        for s in slow:
            wait_for(lambda s=s: dropped(s), 60, "a slow client dropped")
        assert peak[0] <= 8, f"{peak[0]} threads for 100 idle connections"
        status, _, _ = request(server.address)
        assert status == 200
    finally:
        for s in slow:
            s.close()


def test_ipv6_loopback(tmp_path: Path) -> None:
    cfg = parse_config({"state_dir": "s", "metrics": {"listen": "[::1]:0"}}, tmp_path)
    srv = HealthServer(Metrics(), cfg.metrics.listen, live=lambda: True, ready=lambda: True)
    srv.start()
    try:
        assert srv.address.startswith("[::1]:")
        assert request(srv.address, path="/readyz")[::2] == (200, b"ready\n")
    finally:
        srv.stop()


@pytest.mark.parametrize(("listen", "message"), [
    ("999.1.1.1:80", "'999.1.1.1' is not an IP address"),
    ("metrics.example:80", "'metrics.example' is not an IP address"),
    ("::1:9464", "an IPv6 address needs brackets: [::1]:9464"),
    ("127.0.0.1:99999", "must be HOST:PORT with a port from 0 to 65535"),
    ("9464", "must be HOST:PORT"),
])
def test_unusable_listen_addresses_are_config_errors(tmp_path: Path, listen: str,
                                                     message: str) -> None:
    with pytest.raises(ConfigError, match=f"metrics.listen = '{listen}': .*"
                       + message.replace("[", r"\[").replace("]", r"\]")):
        parse_config({"state_dir": "s", "metrics": {"listen": listen}}, tmp_path)


def test_check_config_refuses_an_address_not_on_this_host(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for folder in ("in", "o", "f"):
        (tmp_path / folder).mkdir()
    cfg = {"state_dir": str(tmp_path / "s"), "engine": {"kind": "tesseract"},
           "metrics": {"listen": "192.0.2.1:9464"},  # TEST-NET-1: bound, never reached
           "inboxes": [{"path": str(tmp_path / "in"), "outbox": str(tmp_path / "o"),
                        "failed": str(tmp_path / "f"), "on_success": "delete"}]}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["check-config", "-c", str(path)]) == 2
    assert "metrics.listen = '192.0.2.1:9464': cannot listen on 192.0.2.1:9464: Cannot " \
        "assign requested address" in capsys.readouterr().err
    # a port in use (by the running daemon, most likely) is not a problem for check-config
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        cfg["metrics"]["listen"] = f"127.0.0.1:{held.getsockname()[1]}"
        path.write_text(yaml.safe_dump(cfg))
        assert cli.main(["check-config", "-c", str(path)]) == 0


def test_a_listen_error_is_raised_not_swallowed() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ListenError, match=f"metrics.listen = '127.0.0.1:{port}': cannot "
                           f"listen on 127.0.0.1:{port}: Address already in use"):
            HealthServer(Metrics(), f"127.0.0.1:{port}", live=lambda: True,
                         ready=lambda: True)


@pytest.mark.e2e
def test_the_daemon_does_not_start_when_it_cannot_listen(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({
            "state_dir": str(tmp_path / "s"), "engine": {"kind": "tesseract"},
            "metrics": {"listen": f"127.0.0.1:{port}"}, "log": {"format": "json"},
            "inboxes": [{"path": str(tmp_path / "in"), "outbox": str(tmp_path / "o"),
                         "failed": str(tmp_path / "f"), "on_success": "delete"}]}))
        r = subprocess.run([sys.executable, "-m", "ocrd", "run", "-c", str(path)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert '"event": "metrics_listen_failed"' in r.stderr
    assert f"ocrd: configuration error: metrics.listen = '127.0.0.1:{port}': cannot listen " \
        "on" in r.stderr
    assert '"event": "ready"' not in r.stderr


def test_stop_ends_connections_in_progress() -> None:
    """Idle clients being served when the daemon stops do not hold it for their timeout
    (60 s here): their connections are ended, and the worker threads come free."""
    srv = HealthServer(Metrics(), "127.0.0.1:0", live=lambda: True, ready=lambda: True,
                       timeout=60)
    srv.start()
    host, _, port = srv.address.rpartition(":")
    idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(8)]
    try:
        wait_for(lambda: len(srv.server.active) == 8, 20, "8 connections being served")
        srv.stop()
        for s in idle:
            assert s.recv(1) == b""  # ended by the server, long before its 60 s
        wait_for(lambda: not srv.server.active, 20, "the workers free again")
    finally:
        for s in idle:
            s.close()
