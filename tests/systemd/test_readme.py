"""The README is run, not read: its quick start and its install-as-a-service commands,
taken from README.md itself (the fenced blocks after `<!-- run: NAME -->`), run as
written in a booted container of this machine's Debian (tests/systemd/nspawn.py), in a
fresh copy of this checkout, by tests/systemd/readme_runner.py; a file dropped in comes
out each way. A README edit that breaks a command fails here.

The container has no network (its ports and folders are its own): pip takes ocrd's
dependencies, and the build backend, from a folder of wheels made here beforehand."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nspawn
import pytest
from nspawn import cannot_run

pytestmark = [pytest.mark.systemd, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BOOT_TIMEOUT = 1200  # the whole container run; runner.service's own limit is 1080 s
BLOCK = re.compile(r"^<!-- run: ([\w-]+) -->\n```sh\n(.*?)^```", re.S | re.M)
NAMES = ("quick-start", "quick-start-files", "service")


def readme_blocks(text: str) -> dict[str, str]:
    """The README's runnable blocks by name."""
    return {m.group(1): m.group(2) for m in BLOCK.finditer(text)}


def checkout_copy(dest: Path) -> None:
    """What a fresh clone of this checkout holds: its files, with what is not yet
    committed, without what git ignores (.venv, config.local.yaml, state …)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, listed):
        src = REPO / name.decode()
        if src.is_file() and not src.is_symlink():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def wheelhouse(dest: Path) -> None:
    """Wheels of ocrd's dependencies and of the build backend, for pip without a network."""
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--wheel-dir", str(dest), str(REPO)], check=True,
                   timeout=900)
    subprocess.run([*pip, "download", "--only-binary", ":all:", "--dest", str(dest),
                    "setuptools>=77"], check=True, timeout=300)
    for built in dest.glob("ocr_inbox_daemon-*.whl"):
        built.unlink()  # the README's commands build ocrd themselves


@dataclass
class Run:
    results: dict[str, Any]
    console: str

    def step(self, name: str) -> dict[str, Any]:
        if name not in self.results or self.results.get("failed_step") == name:
            pytest.fail(f"the runner did not get through {name!r}: "
                        f"{self.results.get('error')}\n{self.results.get('traceback', '')}\n"
                        f"console (tail):\n{self.console[-3000:]}")
        return self.results[name]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    blocks = readme_blocks((REPO / "README.md").read_text())
    missing = [n for n in NAMES if n not in blocks]
    assert not missing, f"README.md has no `<!-- run: NAME -->` block for {missing}"
    why = nspawn.unavailable()
    if why:
        cannot_run(why)
    from helpers import office_open_xml

    work = tmp_path_factory.mktemp("readme")
    out, test, checkout, wheels = (work / n for n in ("out", "test", "checkout", "wheels"))
    for folder in (out, test, checkout, wheels):
        folder.mkdir()
    checkout_copy(checkout)  # with samples/scan_0042.pdf, the README's file
    office_open_xml(test / "letter.docx", "word")
    for name in NAMES:
        (test / f"{name}.sh").write_text(blocks[name])
    for runner in ("readme_runner.py", "runner.py"):
        shutil.copy(HERE / runner, test / runner)
    wheelhouse(wheels)
    console, rc = nspawn.boot(work, "/usr/bin/python3 /ocrd-test/readme_runner.py", [
        f"--bind={checkout}:/root/ocrd", f"--bind-ro={wheels}:/wheelhouse",
        f"--bind-ro={test}:/ocrd-test", f"--bind={out}:/out"],
        timeout=BOOT_TIMEOUT, runner_timeout=BOOT_TIMEOUT - 120, private_network=True)
    if not (out / "started").exists():
        cannot_run(f"the container did not boot (exit {rc}):\n{console[-3000:]}")
    results = json.loads((out / "results.json").read_text()) \
        if (out / "results.json").exists() else {"error": "no results.json"}
    print(json.dumps(results, indent=2)[-20000:])
    return Run(results, console)


def test_the_readme_marks_its_runnable_blocks() -> None:
    """The blocks this test runs are the README's own, under the sections a newcomer
    reads first."""
    text = (REPO / "README.md").read_text()
    blocks = readme_blocks(text)
    assert blocks["quick-start"].strip() == "./scripts/run-local"
    assert "cp samples/scan_0042.pdf inbox/" in blocks["quick-start-files"]
    assert (REPO / "samples" / "scan_0042.pdf").is_file()
    assert "systemctl daemon-reload && systemctl enable --now ocrd" in blocks["service"]
    install = text.index("## Install as a systemd service")
    assert text.index("<!-- run: quick-start -->") < install < text.index("<!-- run: service")


def test_the_quick_start_runs_as_written(run: Run) -> None:
    r = run.step("quick_start")
    assert r["console"] == "http://127.0.0.1:9465/", r
    for line in r["lines"]:
        assert line["rc"] == 0, line
    ls_outbox = next(x for x in r["lines"] if x["line"].startswith("ls outbox/"))
    assert "scan_0042.md" in ls_outbox["out"] and "scan_0042.json" in ls_outbox["out"]
    status = next(x for x in r["lines"] if " status " in x["line"])
    assert re.search(r"done 1\b", status["out"]), status


def test_run_local_console_and_its_forms_work(run: Run) -> None:
    """The console at the address run-local printed, and its Retry form (a form post:
    python-multipart, which only the product's dependencies bring here)."""
    r = run.step("quick_start")
    assert r["overview"] == 200
    assert r["failed_message"].startswith("a ZIP/Office document (.docx): save it as PDF")
    assert r["retry_unconfirmed"]["kind"] == "bad", r["retry_unconfirmed"]
    assert "confirm that the cause is gone" in r["retry_unconfirmed"]["text"]
    assert r["retry"]["status"] == 303, r["retry"]
    assert r["retry"]["location"] == "/failed", r["retry"]
    assert r["retry"]["flash"]["kind"] == "good", r["retry"]
    assert r["retry"]["flash"]["text"].startswith("Put back into its inbox as "), r["retry"]
    assert r["retried_row"]


def test_run_local_speaks_plainly_and_installs_once(run: Run) -> None:
    r = run.step("quick_start")
    out = r["output"]
    assert "Open the console in a browser: http://127.0.0.1:9465/" in out
    assert not re.search(r"deprecat|!!\n", out, re.I), out
    assert r["rc_after_ctrl_c"] in (0, 130), r["rc_after_ctrl_c"]
    # the second run installs nothing: no pip, no "installing"
    assert "installing" in out and "installing" not in r["second_output"], r["second_output"]
    assert r["rc_after_second_ctrl_c"] in (0, 130)


def test_the_service_install_runs_as_written_and_a_dropped_file_comes_out(run: Run) -> None:
    r = run.step("service")
    assert [x["rc"] for x in r["lines"]] == [0] * len(r["lines"]), r["lines"]
    assert r["active"] == "active"
    converted = r["converted"]
    assert "<!-- page 1 -->" in converted["text"] and converted["archived"], converted
    # the example config's modes, in the folders systemd/ocrd.tmpfiles made
    assert r["owner"] == "ocrd:scans" and converted["mode"] == "0o660", (r["owner"], converted)
    assert r["status"]["rc"] == 0 and "done 1" in r["status"]["out"], r["status"]
    # nothing went wrong on the way (a folder ocrd could not make, say)
    assert r["warnings"] in ("", "-- No entries --"), r["warnings"]
