"""A broken tesseract setup is never a blank page: a tessdata folder of *.traineddata
only (what a download of tessdata_best or tessdata_fast gives: no configs/) reads as
the system's does; output that is not tesseract's TSV table is an engine error; a setup
that cannot read a page at all keeps the engine from starting, with the fix in the
message, and check-config says so too. Real tesseract, real language data (linked into
folders made here), `ocrd convert` and `ocrd check-config` as subprocesses."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import Daemon, text_image, wait_for

from ocrd import errors
from ocrd.config.settings import EngineConfig
from ocrd.engines import tesseract
from ocrd.engines.base import PageRequest
from ocrd.engines.tesseract import TesseractEngine

LINES = ["Quarterly report on shipments", "Invoice number 4711 was paid in full"]


def system_tessdata() -> Path:
    out = subprocess.run(["tesseract", "--list-langs"], capture_output=True,
                         text=True).stdout
    m = re.search(r'"([^"]+)"', out)
    assert m, out
    return Path(m.group(1))


def traineddata_only(folder: Path) -> Path:
    """A tessdata folder as a download gives it: the language files, no configs/."""
    folder.mkdir()
    for name in ("eng", "osd"):
        (folder / f"{name}.traineddata").symlink_to(system_tessdata() / f"{name}.traineddata")
    return folder


def broken_tessdata(folder: Path) -> Path:
    """A tessdata folder whose English model is cut off (a download that stopped)."""
    folder.mkdir()
    data = (system_tessdata() / "eng.traineddata").read_bytes()
    (folder / "eng.traineddata").write_bytes(data[:100_000])
    (folder / "osd.traineddata").symlink_to(system_tessdata() / "osd.traineddata")
    return folder


def run(tmp_path: Path, *args: str, prefix: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ocrd", *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "OCRD_CONFIG": "", "TESSDATA_PREFIX": str(prefix)})


@pytest.mark.e2e
def test_a_tessdata_folder_without_configs_reads_the_words(tmp_path: Path) -> None:
    """tesseract asked for `tsv txt` by its config files' names printed `read_params_file:
    Can't open tsv`, wrote plain text and exited 0: the page was "blank", the run ok."""
    text_image(LINES).save(tmp_path / "page.png", dpi=(300, 300))
    prefix = traineddata_only(tmp_path / "tessdata")
    r = run(tmp_path, "convert", "page.png", "-o", "out", prefix=prefix)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "out" / "page.md").read_text()
    assert "(blank)" not in md
    for line in LINES:
        assert line in md, md
    side = json.loads((tmp_path / "out" / "page.json").read_text())
    assert side["pages"][0]["status"] == "ok"


def test_output_that_is_not_a_tsv_table_is_an_engine_error(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The real tesseract asked for its outputs by config name, with language data that
    has no configs/, writes the page's text without the TSV table: that is the engine's
    failure (the daemon stops, its pages stay claimed), never a blank page."""
    monkeypatch.setenv("TESSDATA_PREFIX", str(traineddata_only(tmp_path / "tessdata")))
    monkeypatch.setattr(tesseract, "OUTPUTS", ("tsv", "txt"))  # as ocrd asked before
    engine = TesseractEngine(EngineConfig())

    async def read() -> None:
        await engine.start()
        await engine.ocr(PageRequest(image=text_image(LINES), page_no=1, doc_id="d",
                                     dpi=300))

    with pytest.raises(errors.EngineDead, match="wrote no TSV table"):
        asyncio.run(read())


@pytest.mark.e2e
def test_a_setup_that_cannot_read_a_page_keeps_the_engine_from_starting(tmp_path: Path
                                                                        ) -> None:
    text_image(LINES).save(tmp_path / "page.png", dpi=(300, 300))
    prefix = broken_tessdata(tmp_path / "tessdata")
    (tmp_path / "c.yaml").write_text("schedule: {page_retries: 0}\n")
    r = run(tmp_path, "convert", "-c", "c.yaml", "page.png", "-o", "out", prefix=prefix)
    assert r.returncode == errors.ExitCode.ENGINE, r.stderr
    assert "the engine cannot start" in r.stderr, r.stderr
    assert f"TESSDATA_PREFIX='{prefix}'" in r.stderr and "eng.traineddata" in r.stderr
    assert not (tmp_path / "out" / "page.md").exists()


@pytest.mark.e2e
def test_check_config_runs_the_same_self_test(tmp_path: Path) -> None:
    for name in ("inbox", "outbox", "failed"):
        (tmp_path / name).mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"state_dir: {tmp_path}/state\nengine: {{kind: tesseract}}\n"
                   f"inboxes:\n  - {{path: {tmp_path}/inbox, outbox: {tmp_path}/outbox, "
                   f"failed: {tmp_path}/failed, on_success: delete}}\n")
    good = run(tmp_path, "check-config", "-c", str(cfg),
               prefix=traineddata_only(tmp_path / "complete"))
    assert good.returncode == 0, good.stderr
    bad = run(tmp_path, "check-config", "-c", str(cfg),
              prefix=broken_tessdata(tmp_path / "broken"))
    assert bad.returncode == errors.ExitCode.USAGE, bad.stderr
    assert "engine.tesseract: tesseract" in bad.stderr and "fails on a test page" in bad.stderr


@pytest.mark.e2e
def test_the_daemon_refuses_to_start_with_a_broken_setup(tmp_path: Path) -> None:
    """It would have started, and failed every page as engine_failed: it stops before
    it starts, as for any setup a restart would not mend (exit 2: the configuration's
    error), with what check-config says."""
    d = Daemon(tmp_path / "d", env={"TESSDATA_PREFIX": str(broken_tessdata(tmp_path / "td"))})
    with d:
        d.start(wait_ready=False)
        wait_for(d.died, 120, "the daemon to stop")
        assert d.proc is not None and d.proc.returncode == errors.ExitCode.USAGE
        (unusable,) = d.events("config_unusable")
        said = " ".join(unusable["problems"])
        assert "fails on a test page" in said and "TESSDATA_PREFIX" in said
        assert not d.events("engine_started")


def test_the_start_checks_run_tesseract_out_of_the_terminals_reach(tmp_path: Path) -> None:
    """A Ctrl-C in the terminal goes to its whole process group: tesseract run by the
    start's checks (--version, --list-langs, the test page) in ocrd's group would die of
    it and read as a broken setup (the daemon stopping with engine_dead, exit 1, instead
    of stopping as asked). Each runs in a session of its own."""
    record = tmp_path / "sessions"
    fake = tmp_path / "tesseract"
    fake.write_text(f"#!{sys.executable}\n"
                    "import os, sys\n"
                    f"open({str(record)!r}, 'a').write(f'{{os.getsid(0)}}\\n')\n"
                    "sys.stdin.buffer.read() if 'stdin' in sys.argv else None\n"
                    "print('List of available languages (1):\\neng' if '--list-langs' in "
                    "sys.argv else 'tesseract 5.3.0')\n")
    fake.chmod(0o755)
    cfg = EngineConfig.model_validate({"kind": "tesseract", "tesseract": {"lang": "eng"}})
    engine = TesseractEngine(cfg)
    engine.binary = str(fake)
    engine.orientation = False
    with pytest.raises(errors.EngineDead):  # the fake reads no page: its output is no TSV
        asyncio.run(engine.start())
    tesseract.self_test(cfg.tesseract, str(fake))
    sessions = [int(x) for x in record.read_text().split()]
    assert len(sessions) == 4, sessions  # --version, --list-langs, the test page twice
    assert os.getsid(0) not in sessions
