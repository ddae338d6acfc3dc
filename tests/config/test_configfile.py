"""Where the commands find their config (-c, else $OCRD_CONFIG, else /etc/ocrd/config.yaml,
pointed at a temporary file here) and say which one they read; the remote servers' API
key from a file or a systemd credential ($CREDENTIALS_DIRECTORY), sent to a real HTTP
server by `ocrd convert`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from helpers import make_pdf, sentence_lines, wait_for, write_config

from ocrd import cli
from ocrd.config import source
from ocrd.config.load import parse_config
from ocrd.config.settings import ConfigError, EngineConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """/etc/ocrd/config.yaml, as far as ocrd can tell, and no $OCRD_CONFIG."""
    path = tmp_path / "etc" / "ocrd" / "config.yaml"
    monkeypatch.setattr(source, "DEFAULT", path)
    monkeypatch.delenv("OCRD_CONFIG", raising=False)
    return path


def test_check_config_reads_ocrd_config_then_the_default(
        tmp_path: Path, default: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-config"]) == 2
    err = capsys.readouterr().err
    assert "no config file: give one with -c FILE, name it in $OCRD_CONFIG, or write " \
        f"{default}" in err

    default.parent.mkdir(parents=True)
    write_config(tmp_path / "a").rename(default)
    assert cli.main(["check-config"]) == 0
    assert capsys.readouterr().out.startswith(f"{default} (the default): OK (1 inbox(es)")

    named = write_config(tmp_path / "b")
    monkeypatch.setenv("OCRD_CONFIG", str(named))
    assert cli.main(["check-config"]) == 0
    assert capsys.readouterr().out.startswith(f"{named} (from $OCRD_CONFIG): OK")
    assert cli.main(["check-config", "-c", str(default)]) == 0
    assert capsys.readouterr().out.startswith(f"{default} (given with -c): OK")

    monkeypatch.setenv("OCRD_CONFIG", str(tmp_path / "gone.yaml"))
    assert cli.main(["check-config"]) == 2
    assert "does not exist [config file: " f"{tmp_path / 'gone.yaml'} (from $OCRD_CONFIG)]" \
        in capsys.readouterr().err


def test_status_says_which_config_it_read(tmp_path: Path, default: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    default.parent.mkdir(parents=True)
    write_config(tmp_path).rename(default)
    assert cli.main(["status"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"config: {default} (the default)"
    assert cli.main(["status", "--json"]) == 0
    out = capsys.readouterr().out
    assert "no journal" in out  # the daemon never ran with it


def _start(args: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, *args], stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, **env}, cwd=cwd, start_new_session=True)


def _events(log: Path) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["env", "default"])
def test_run_without_c_reads_ocrd_config_or_the_default(tmp_path: Path, where: str) -> None:
    cfg = write_config(tmp_path)
    env = {"OCRD_CONFIG": ""}  # empty counts as unset
    if where == "env":
        args, env["OCRD_CONFIG"] = ["-m", "ocrd", "run"], str(cfg)
    else:
        # the default path, pointed at the test's file the way the tests above do it
        args = ["-c", "import sys; from pathlib import Path; import ocrd.config.source as c; "
                "c.DEFAULT = Path(sys.argv[1]); from ocrd.cli import main; "
                "sys.exit(main(['run']))", str(cfg)]
    log = tmp_path / "daemon.log"
    proc = _start(args, env, log, tmp_path)
    try:
        wait_for(lambda: any(e["event"] == "ready" for e in _events(log))
                 or proc.poll() is not None, 60, "daemon ready")
        assert proc.poll() is None, log.read_text()
        (read,) = [e for e in _events(log) if e["event"] == "config_read"]
        assert read["path"] == str(cfg)
        assert read["origin"] == ("$OCRD_CONFIG" if where == "env" else "default")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_api_key_file_and_credential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ocrd.config import secrets

    (tmp_path / "key").write_text("s3cret-from-file\n")
    cfg = parse_config({"state_dir": "s", "engine": {"kind": "remote", "remote": {
        "urls": ["http://x/v1"], "api_key_file": "key"}}}, tmp_path)
    assert cfg.engine.remote.api_key_file == tmp_path / "key"  # relative to the config's folder
    assert secrets.api_key(cfg.engine.remote) == "s3cret-from-file"

    engine = EngineConfig(kind="remote", remote={"urls": ["http://x/v1"],
                                                 "api_key_credential": "api-key"}).remote
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(ConfigError, match=r"engine.remote.api_key_credential = 'api-key': "
                       r"\$CREDENTIALS_DIRECTORY is not set; systemd sets it for a unit "
                       r"with LoadCredential=api-key:/path/to/the/key"):
        secrets.api_key(engine)
    creds = tmp_path / "creds"
    creds.mkdir()
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    with pytest.raises(ConfigError, match="does not exist"):
        secrets.api_key(engine)
    (creds / "api-key").write_text("s3cret-from-systemd")
    assert secrets.api_key(engine) == "s3cret-from-systemd"
    (creds / "api-key").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        secrets.api_key(engine)

    with pytest.raises(ConfigError, match="api_key and api_key_file are both set"):
        parse_config({"state_dir": "s", "engine": {"remote": {"api_key": "a",
                                                              "api_key_file": "k"}}},
                     tmp_path)
    with pytest.raises(ConfigError, match="api_key_credential"):
        parse_config({"state_dir": "s", "engine": {"remote": {
            "api_key_credential": "../etc/x"}}}, tmp_path)


def test_check_config_reports_an_unreadable_key_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, engine={"kind": "remote", "remote": {
        "urls": ["http://127.0.0.1:9/v1"], "api_key_file": str(tmp_path / "nokey")}})
    assert cli.main(["check-config", "-c", str(path)]) == 2
    assert f"engine.remote.api_key_file = '{tmp_path / 'nokey'}': '{tmp_path / 'nokey'}' " \
        "does not exist" in capsys.readouterr().err


class _OpenAIServer(BaseHTTPRequestHandler):
    """Enough of `vllm serve` for one page, remembering each Authorization header."""

    seen: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.seen.append(self.headers.get("Authorization"))
        self._json({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802
        self.seen.append(self.headers.get("Authorization"))
        self.rfile.read(int(self.headers["Content-Length"]))
        self._json({"id": "c1", "object": "chat.completion", "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {
                        "role": "assistant", "content": "Hello from the server"}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 4,
                              "total_tokens": 14}})

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.e2e
def test_convert_sends_the_systemd_credential_as_the_api_key(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OpenAIServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _OpenAIServer.seen = []
    try:
        creds = tmp_path / "creds"
        creds.mkdir()
        (creds / "api-key").write_text("s3cret-from-systemd\n")
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump({"state_dir": str(tmp_path), "metrics": {"listen": None},
                                       "engine": {"kind": "remote", "model": "m", "remote": {
                                           "urls": [f"http://127.0.0.1:{server.server_port}/v1"],
                                           "api_key_credential": "api-key"}}}))
        pdf = make_pdf(tmp_path / "a.pdf", [sentence_lines(1, 2)])
        r = subprocess.run([sys.executable, "-m", "ocrd", "convert", str(pdf), "-o",
                            str(tmp_path / "out"), "-c", str(cfg), "--quiet"],
                           env={**os.environ, "CREDENTIALS_DIRECTORY": str(creds)},
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "Hello from the server" in (tmp_path / "out" / "a.md").read_text()
        assert _OpenAIServer.seen and set(_OpenAIServer.seen) == {"Bearer s3cret-from-systemd"}
    finally:
        server.shutdown()
        server.server_close()
