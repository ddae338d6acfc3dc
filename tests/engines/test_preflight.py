"""`ocrd check-config` runs every check of the daemon's start that needs no GPU: each
engine class's `preflight` (tesseract's languages installed, vLLM importable where
engine.kind asks for it, the remote servers' URLs well-formed), one line per problem
with its fix; the daemon's start asks the same and does not start. Real tesseract (its
`--list-langs`), the real absence of vLLM in the test environment."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
from daemon_process import ocrd_command, ocrd_env
from helpers import write_config

from ocrd import cli
from ocrd.config.engine import EngineConfig
from ocrd.engines import preflight
from ocrd.engines.remote import RemoteEngine
from ocrd.engines.tesseract import TesseractEngine, _languages


def installed_languages() -> set[str]:
    import shutil

    binary = shutil.which("tesseract")
    assert binary, "tesseract is needed (scripts/test installs it)"
    return _languages(binary)


def missing_language() -> str:
    """A language whose data this machine does not have (fra, else another)."""
    have = installed_languages()
    return next(x for x in ("fra", "ita", "spa", "nld", "pol") if x not in have)


def check(tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: dict) -> tuple[int,
                                                                                    list[str]]:
    path = write_config(tmp_path, engine=engine, web={"listen": None})
    rc = cli.main(["check-config", "-c", str(path)])
    return rc, capsys.readouterr().err.splitlines()


def test_a_tesseract_language_without_its_data_fails_check_config_with_the_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lang = f"eng+{missing_language()}"
    rc, err = check(tmp_path, capsys, {"kind": "tesseract", "tesseract": {"lang": lang}})
    assert rc == 2
    extra = lang.split("+")[1]
    line = f"ocrd: engine.tesseract.lang = {lang!r}: tesseract has no language data for " \
           f"{extra}: apt-get install tesseract-ocr-{extra}"
    assert [x for x in err if x.startswith(line)] and len(err) == 1, err
    rc, err = check(tmp_path, capsys, {"kind": "tesseract", "tesseract": {"lang": "eng"}})
    assert rc == 0, err


def test_the_apt_package_of_a_language_is_spelt_as_debian_spells_it() -> None:
    problems = TesseractEngine.preflight(EngineConfig(
        kind="tesseract", tesseract={"lang": "eng+chi_sim_vert+zzz"}))
    if "chi_sim_vert" not in installed_languages():
        assert "tesseract-ocr-chi-sim-vert" in problems[0], problems
    assert "tesseract-ocr-zzz" in problems[0] and len(problems) == 1, problems


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                    reason="vLLM is installed here: its absence cannot be shown")
def test_engine_kind_vllm_without_vllm_fails_check_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = check(tmp_path, capsys, {"kind": "vllm"})
    assert rc == 2
    assert any(x.startswith("ocrd: engine.kind = 'vllm': vLLM is not installed") and
               "pip install 'ocr-inbox-daemon[vllm]'" in x for x in err), err
    # auto falls back to tesseract, which is there
    rc, err = check(tmp_path, capsys, {"kind": "auto"})
    assert rc == 0, err


def test_remote_urls_that_do_not_parse_fail_check_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    urls = ["http://gpu1:8000/v1", "http://gpu2:80000/v1", "https:///v1",
            "http://gpu3:8000/v1?x=1"]
    rc, err = check(tmp_path, capsys, {"kind": "remote", "remote": {"urls": urls}})
    assert rc == 2
    problems = [x for x in err if x.startswith("ocrd: engine.remote.urls[")]
    assert [p.split(" = ")[0] for p in problems] == \
        ["ocrd: engine.remote.urls[1]", "ocrd: engine.remote.urls[2]",
         "ocrd: engine.remote.urls[3]"], err
    assert "port" in problems[0].lower() and "host" in problems[1], problems
    assert RemoteEngine.preflight(EngineConfig(kind="remote",
                                               remote={"urls": urls[:1]})) == []


def test_preflight_asks_the_engine_the_config_chooses() -> None:
    missing = missing_language()
    assert preflight(EngineConfig(kind="tesseract", tesseract={"lang": missing}))
    assert preflight(EngineConfig(kind="remote", remote={"urls": ["http://h:99999/v1"]}))
    assert preflight(EngineConfig(kind="tesseract")) == []


@pytest.mark.e2e
def test_the_daemon_does_not_start_with_what_check_config_refuses(tmp_path: Path) -> None:
    """`ocrd run` asks the same preflight first: no engine start, no READY, exit 2 and
    the same line (under systemd: the journal says what to install)."""
    lang = f"eng+{missing_language()}"
    path = write_config(tmp_path, engine={"kind": "tesseract", "tesseract": {"lang": lang}},
                        web={"listen": None})
    res = subprocess.run([*ocrd_command(), "run", "-c", str(path)], capture_output=True,
                         text=True, timeout=120, env=ocrd_env())
    assert res.returncode == 2, res.stderr
    assert f"ocrd: configuration error: engine.tesseract.lang = {lang!r}: tesseract has no " \
           f"language data" in res.stderr, res.stderr
    events = [json.loads(line) for line in (res.stdout + res.stderr).splitlines()
              if line.startswith("{")]
    assert [e for e in events if e.get("event") == "config_unusable"], res.stderr
    assert not [e for e in events if e.get("event") in ("engine_chosen", "ready")]
