"""The remote engine's HTTP client on the network as it is: https servers signed by a CA
given in the config (and client certificates), proxies from the environment
(HTTP_PROXY, HTTPS_PROXY, NO_PROXY), never a proxy for the managed server on 127.0.0.1,
and connections kept alive yet still cut when a page is cancelled.

Real TLS (certificates made here with the openssl command), a real HTTP proxy (asyncio,
CONNECT tunnels and forwarded requests, counting both), and the fake `vllm serve` of
tests/fake_vllm.py; the managed-server test runs ocrd's launcher as it is, with that
fake standing in for the `vllm` package.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import ssl
import subprocess
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fake_vllm import FakeVllm, config, page
from helpers import write_config

from ocrd import cli
from ocrd.config.load import parse_config
from ocrd.config.settings import ConfigError, EngineConfig
from ocrd.engines.remote import RemoteEngine
from ocrd.engines.vllm.managed import ManagedServerEngine
from ocrd.errors import EngineUnavailable

ROOT = Path(__file__).resolve().parents[2]
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@dataclass
class Certs:
    ca: Path
    server: tuple[Path, Path]  # certificate, key
    client: tuple[Path, Path]

    def server_context(self, require_client_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(*self.server)
        if require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(self.ca)
        return ctx


def _openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA made for this test, a server certificate for 127.0.0.1 and a client
    certificate, both signed by it (EC keys: quick to make)."""
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(d, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=ocrd test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name, usage, san in (("server", "serverAuth", "IP:127.0.0.1,DNS:localhost"),
                             ("client", "clientAuth", "DNS:ocrd-client")):
        _openssl(d, "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN=ocrd test {name}")
        (d / f"{name}.ext").write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            f"extendedKeyUsage={usage}\nsubjectAltName={san}\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
        _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
                 "-extfile", f"{name}.ext")
    return Certs(d / "ca.pem", (d / "server.pem", d / "server.key"),
                 (d / "client.pem", d / "client.key"))


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No proxy and no CA settings from the machine running the tests."""
    for var in (*PROXY_VARS, "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.lower(), raising=False)
    return monkeypatch


@dataclass
class CountingProxy:
    """An HTTP proxy on 127.0.0.1, as squid is to a client: `CONNECT host:port` opens a
    tunnel (https), an absolute-form request (`POST http://host/...`) is forwarded (http,
    one request per connection). Remembers every request line and the credentials given
    (Proxy-Authorization, not passed on)."""

    port: int = 0
    requests: list[str] = field(default_factory=list)
    credentials: list[str] = field(default_factory=list)
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> CountingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode("latin-1")
            if not line:
                return
            self.requests.append(line.strip())
            method, target, version = line.split(" ", 2)
            headers = []
            while (header := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = header.decode("latin-1").partition(":")
                if name.lower() == "proxy-authorization":
                    self.credentials.append(value.strip())
                elif name.lower() not in ("connection", "proxy-connection"):
                    headers.append(header)
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                url = urllib.parse.urlsplit(target)
                up_reader, up_writer = await asyncio.open_connection(url.hostname, url.port)
                up_writer.write(f"{method} {url.path} {version}".encode("latin-1")
                                + b"".join(headers) + b"connection: close\r\n\r\n")
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, ValueError):
            pass
        finally:
            writer.close()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    finally:
        dst.close()


async def one_page(engine: RemoteEngine) -> Any:
    try:
        await engine.start()
        return await engine.ocr(page())
    except Exception as e:  # noqa: BLE001 - the test looks at what came out
        return e
    finally:
        await engine.close()


# ---- TLS ------------------------------------------------------------------------------


def test_https_server_signed_by_the_ca_in_the_config_is_trusted(
        certs: Certs, env: pytest.MonkeyPatch) -> None:
    async def run() -> tuple[Any, FakeVllm]:
        server = await FakeVllm(tls=certs.server_context()).start()
        out = await one_page(RemoteEngine(config(server.url, tls_ca_file=str(certs.ca))))
        await server.stop()
        return out, server

    out, server = asyncio.run(run())
    assert server.url.startswith("https://")
    assert out.text.endswith("Hello") and server.served == 1


@pytest.mark.usefixtures("fast_backoff")
def test_https_server_is_refused_without_its_ca(certs: Certs, env: pytest.MonkeyPatch) -> None:
    async def run() -> tuple[Any, FakeVllm]:
        server = await FakeVllm(tls=certs.server_context()).start()
        out = await one_page(RemoteEngine(config(server.url)))  # the system's CAs only
        await server.stop()
        return out, server

    out, server = asyncio.run(run())
    assert isinstance(out, EngineUnavailable)  # the page waits; it is not failed
    assert "certificate not trusted" in str(out) and "tls_ca_file" in str(out)
    assert server.served == 0 and server.requests == []


@pytest.mark.usefixtures("fast_backoff")
def test_client_certificate_from_the_config_is_shown(
        certs: Certs, env: pytest.MonkeyPatch) -> None:
    async def run() -> tuple[Any, Any, FakeVllm]:
        server = await FakeVllm(tls=certs.server_context(require_client_cert=True)).start()
        cert, key = certs.client
        with_cert = await one_page(RemoteEngine(config(
            server.url, tls_ca_file=str(certs.ca), tls_cert_file=str(cert),
            tls_key_file=str(key))))
        without = await one_page(RemoteEngine(config(server.url, tls_ca_file=str(certs.ca))))
        await server.stop()
        return with_cert, without, server

    with_cert, without, server = asyncio.run(run())
    assert with_cert.text.endswith("Hello")
    assert isinstance(without, EngineUnavailable)
    assert server.served == 1


def test_check_config_loads_the_tls_files(
        tmp_path: Path, certs: Certs, capsys: pytest.CaptureFixture[str]) -> None:
    def check(**tls: str) -> tuple[int, str]:
        path = write_config(tmp_path, engine={"kind": "remote", "remote": {
            "urls": ["https://127.0.0.1:9/v1"], **tls}})
        code = cli.main(["check-config", "-c", str(path)])
        return code, capsys.readouterr().err

    (tmp_path / "ca.pem").write_bytes(certs.ca.read_bytes())  # relative to the config
    assert check(tls_ca_file="ca.pem")[0] == 0
    code, err = check(tls_ca_file="missing.pem")
    assert code == 2
    assert f"engine.remote.tls_ca_file = '{tmp_path / 'missing.pem'}': cannot be read" in err
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    assert "no CA certificate (PEM) in it" in check(tls_ca_file="junk.pem")[1]
    cert, _ = certs.client
    code, err = check(tls_cert_file=str(cert), tls_key_file=str(certs.server[1]))
    assert code == 2 and "not a PEM certificate and its matching private key" in err
    assert check(tls_cert_file=str(cert), tls_key_file=str(certs.client[1]))[0] == 0
    with pytest.raises(ConfigError, match="tls_key_file is set without tls_cert_file"):
        parse_config({"state_dir": "s", "engine": {"remote": {"tls_key_file": "k.pem"}}},
                     tmp_path)


# ---- proxies --------------------------------------------------------------------------


def test_http_proxy_from_the_environment_is_used(env: pytest.MonkeyPatch) -> None:
    async def run() -> tuple[Any, FakeVllm, CountingProxy]:
        server, proxy = await FakeVllm().start(), await CountingProxy().start()
        env.setenv("HTTP_PROXY", proxy.url.replace("://", "://ocr%40d:pa%20ss@"))
        out = await one_page(RemoteEngine(config(server.url)))
        await server.stop()
        await proxy.stop()
        return out, server, proxy

    out, server, proxy = asyncio.run(run())
    assert out.text.endswith("Hello") and server.served == 1
    assert proxy.requests == [f"GET {server.url}/models HTTP/1.1",
                              f"POST {server.url}/chat/completions HTTP/1.1"]
    # the credentials in the proxy's URL, for the proxy alone
    assert proxy.credentials == ["Basic " + base64.b64encode(b"ocr@d:pa ss").decode()] * 2


def test_https_goes_through_the_proxy_in_a_connect_tunnel(
        certs: Certs, env: pytest.MonkeyPatch) -> None:
    async def run() -> tuple[Any, FakeVllm, CountingProxy]:
        server = await FakeVllm(tls=certs.server_context()).start()
        proxy = await CountingProxy().start()
        env.setenv("https_proxy", proxy.url.replace("://", "://ocrd:secret@"))  # any case
        out = await one_page(RemoteEngine(config(server.url, tls_ca_file=str(certs.ca))))
        await server.stop()
        await proxy.stop()
        return out, server, proxy

    out, server, proxy = asyncio.run(run())
    assert out.text.endswith("Hello") and server.served == 1
    # one tunnel, kept open for both requests (the probe and the page)
    assert proxy.requests == [f"CONNECT 127.0.0.1:{server.port} HTTP/1.1"]
    assert proxy.credentials == ["Basic " + base64.b64encode(b"ocrd:secret").decode()]


def test_no_proxy_hosts_are_reached_directly(env: pytest.MonkeyPatch) -> None:
    async def run() -> tuple[list[Any], FakeVllm, CountingProxy]:
        server, proxy = await FakeVllm().start(), await CountingProxy().start()
        env.setenv("HTTP_PROXY", proxy.url)
        outs = []
        for no_proxy in ("localhost,127.0.0.1", "example.org, 127.0.0.1"):
            env.setenv("NO_PROXY", no_proxy)
            outs.append(await one_page(RemoteEngine(config(server.url))))
        await server.stop()
        await proxy.stop()
        return outs, server, proxy

    outs, server, proxy = asyncio.run(run())
    assert all(o.text.endswith("Hello") for o in outs) and server.served == 2
    assert proxy.requests == []


FAKE_VLLM_CLI = """\
import asyncio, sys
from fake_vllm import FakeVllm

def main():
    args = sys.argv[1:]  # serve MODEL --flag value ...
    async def serve():
        await FakeVllm(port=int(args[args.index("--port") + 1]), model=args[1]).start()
        await asyncio.Event().wait()
    asyncio.run(serve())
"""


def fake_vllm_package(folder: Path) -> Path:
    """A `vllm` package whose command line (`vllm serve MODEL --port N ...`, as ocrd's
    launcher runs it) starts the fake server instead of vLLM."""
    cli = folder / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    (folder / "vllm" / "__init__.py").write_text('__version__ = "0.0+fake"\n')
    (folder / "vllm" / "entrypoints" / "__init__.py").write_text("")
    (cli / "__init__.py").write_text("")
    (cli / "main.py").write_text(FAKE_VLLM_CLI)
    return folder


def test_managed_local_server_is_never_reached_through_a_proxy(
        tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    model = tmp_path / "model"  # a local model folder: nothing fetched from the Hub
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = EngineConfig.model_validate({"kind": "vllm", "model": str(model), "loop_retries": 0,
                                       "vllm": {"mode": "managed", "api_servers": 2,
                                                "fast_encoder": False}})
    path = os.pathsep.join([str(fake_vllm_package(tmp_path / "fake")),
                            str(ROOT / "tests"), str(ROOT)])

    async def run() -> tuple[Any, CountingProxy]:
        proxy = await CountingProxy().start()
        env.setenv("HTTP_PROXY", proxy.url)  # and no NO_PROXY
        env.setenv("HTTPS_PROXY", proxy.url)
        engine = ManagedServerEngine(cfg, env={"PYTHONPATH": path})
        try:
            async with asyncio.timeout(60):
                await engine.start()
                out = await engine.ocr(page())
        finally:
            await engine.close()
            await proxy.stop()
        return out, proxy

    out, proxy = asyncio.run(run())
    assert out.text.endswith("Hello") and out.extra["engine"] == "vllm"
    assert proxy.requests == []  # /health, /v1/models and the page all went directly


# ---- connections kept alive, and cut on cancel ----------------------------------------


def test_connection_is_reused_and_still_cut_when_a_page_is_cancelled(
        env: pytest.MonkeyPatch) -> None:
    async def run() -> tuple[FakeVllm, RemoteEngine]:
        server = await FakeVllm().start()
        engine = RemoteEngine(config(server.url))
        await engine.ocr(page(1))
        server.latency = 30
        task = asyncio.create_task(engine.ocr(page(2)))
        while server.in_flight < 1:
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        async with asyncio.timeout(5):
            while server.disconnects < 1:
                await asyncio.sleep(0.01)
        await engine.close()
        await server.stop()
        return server, engine

    server, engine = asyncio.run(run())
    assert server.connections == 1  # the second page went over the first page's connection
    assert server.disconnects == 1 and server.served == 1
    assert engine.in_flight() == {server.url: 0}

