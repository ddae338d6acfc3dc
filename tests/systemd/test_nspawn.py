"""ocrd under a real systemd: the container boots this machine's own /usr with
`systemd-nspawn --volatile=yes` (a throwaway root, nothing persists) into runner.service,
which drives the project's unit with systemctl (tests/systemd/runner.py) and writes what
it saw to a folder bound from here. The unit, sysusers and tmpfiles files are the ones in
systemd/, unchanged; this checkout's ocrd is presented at /opt/ocrd, where the unit
expects it. One drop-in shortens WatchdogSec from 60 s to 8 s so the watchdog step takes
seconds, not minutes.

Shown: `systemctl start` returns only once ocrd sent READY=1; a dropped file converts;
`systemctl reload` brings up a new inbox; a blocked main loop is killed by the watchdog
and restarted; `systemctl stop` lets the file in flight finish and ends with
Result=success; the journal has ocrd's events as fields (EVENT=, OCRD_FILE=, …).

The container itself: tests/systemd/nspawn.py."""

from __future__ import annotations

import json
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nspawn
import pytest
import yaml
from nspawn import cannot_run

pytestmark = [pytest.mark.systemd, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
UNITS = REPO / "systemd"
BOOT_TIMEOUT = 420  # the whole container run; runner.service's own limit is 360 s
# Where ProtectHome=yes leaves nothing: an interpreter there cannot run the service.
HIDDEN = ("/root/", "/home/", "/run/user/")
CHECKOUT = "/opt/ocrd-checkout"

WATCHDOG_DROPIN = f"""\
[Service]
# Test only: the watchdog step waits seconds, not a minute.
WatchdogSec=8s
# Test only: the liveness step's engine, named by class path (tests/simulated_engines.py).
Environment=PYTHONPATH={CHECKOUT}/tests
"""

def inbox(n: str = "") -> dict[str, Any]:
    return {"path": f"/srv/scans/inbox{n}", "outbox": f"/srv/scans/markdown{n}",
            "failed": f"/srv/scans/failed{n}", "archive": f"/srv/scans/archive{n}",
            "quiet_seconds": 0.5, "file_mode": "0660", "dir_mode": "2770"}


def config(*inboxes: dict[str, Any]) -> str:
    return yaml.safe_dump({
        "state_dir": "/var/lib/ocrd",
        # tesseract, inside the test's fault wrapper: the watchdog step makes it block
        # the event loop (tests/simulated_engines.py, FaultyEngine.block_loop_while)
        "engine": {"kind": "simulated_engines:FaultyEngine", "options": {
            "inner": {"kind": "tesseract"}, "block_loop_while": "/run/ocrd-test/stall"}},
        "render": {"workers": 1},
        "metrics": {"listen": "127.0.0.1:0"},
        # debug: page_done events tell the runner a file is mid-conversion
        "log": {"level": "debug"},
        "inboxes": list(inboxes),
    })


def liveness_config() -> str:
    """The liveness step's daemon: a simulated engine at 1 s a page, one page in the
    engine at a time, page timeout 3 s (stall threshold 3 + 15 s): a 40-page document
    takes 40 s whatever the machine's speed, five times WatchdogSec."""
    return yaml.safe_dump({
        "state_dir": "/var/lib/ocrd",
        "engine": {"kind": "simulated_engines:SimulatedEngine", "options": {
            "max_batch": 1, "step_seconds": 0.1, "step_per_page_seconds": 0,
            "prefill_seconds_per_megapixel": 0, "decode_steps": 10, "decode_jitter": 0}},
        "render": {"workers": 1, "dpi": 36},
        "schedule": {"pages_in_flight": 1, "page_timeout_seconds": 3},
        "metrics": {"listen": "127.0.0.1:0"},
        "log": {"level": "debug"},
        "inboxes": [inbox()],
    })


def service_python() -> tuple[str, list[str]] | str:
    """(interpreter for /opt/ocrd, extra folders to bind) or why there is none. The
    venv's own interpreter if the service can see it, else the system's python of the
    same version (the venv's packages are built for that ABI)."""
    real = os.path.realpath(sys.executable)
    if not real.startswith(HIDDEN):
        base = os.path.realpath(sys.base_prefix)
        return real, ([] if base.startswith("/usr") else [base])
    system = f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"
    if os.path.exists(system):
        return system, []
    return (f"the venv's python ({real}) is under a folder ProtectHome=yes hides, and "
            f"there is no {system} to use instead")


def under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def checkout_binds() -> tuple[list[str], str]:
    """(--bind-ro= values, the venv's site-packages as the container sees it). The
    checkout appears at /opt/ocrd-checkout: where CI clones it (/home/runner/...) the
    service could not see it (ProtectHome=yes)."""
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    binds = [f"{REPO}:{CHECKOUT}"]
    if under(site, str(REPO)):
        return binds, CHECKOUT + site[len(str(REPO)):]
    if site.startswith(HIDDEN):
        return [*binds, f"{site}:/opt/ocrd-site"], "/opt/ocrd-site"
    return [*binds, site], site


def make_opt_ocrd(root: Path, python: str, site: str) -> None:
    """A virtual environment at /opt/ocrd (the unit's ExecStart) that runs this
    checkout: the venv's interpreter (or the system's of the same version), this
    checkout's ocrd first on sys.path, then the venv's site-packages."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    (root / "bin").mkdir(parents=True)
    lib = root / "lib" / f"python{version}" / "site-packages"
    lib.mkdir(parents=True)
    (root / "pyvenv.cfg").write_text(f"home = {os.path.dirname(python)}\n"
                                     "include-system-site-packages = false\n"
                                     f"version = {version}\n")
    (root / "bin" / "python").symlink_to(python)
    (root / "bin" / "python3").symlink_to("python")
    (lib / "ocrd-checkout.pth").write_text(
        f"import sys, site; sys.path.insert(0, {CHECKOUT!r}); site.addsitedir({site!r})\n")
    # The venv's own console script (pip's: main() under `if __name__ == "__main__"`,
    # which multiprocessing's spawn relies on), with the interpreter line changed.
    script = (Path(sys.executable).parent / "ocrd").read_text().split("\n", 1)[1]
    ocrd = root / "bin" / "ocrd"
    ocrd.write_text("#!/opt/ocrd/bin/python\n" + script)
    ocrd.chmod(0o755)


def make_documents(folder: Path) -> None:
    from helpers import make_pdf, sentence_lines  # tests/conftest.py puts tests/ on sys.path

    folder.mkdir()
    make_pdf(folder / "one.pdf", [sentence_lines(1)])
    make_pdf(folder / "two.pdf", [sentence_lines(2)])
    # Enough pages that stopping after the first leaves work in flight.
    make_pdf(folder / "big.pdf", [sentence_lines(10 + i, 30) for i in range(12)])
    make_pdf(folder / "long.pdf", [sentence_lines(40 + i, 30) for i in range(40)])


def unavailable() -> str | None:
    why = nspawn.unavailable()
    if why:
        return why
    python = service_python()
    return python if isinstance(python, str) else None


@dataclass
class Run:
    out: Path
    results: dict[str, Any]
    journal: list[dict[str, Any]]
    console: str

    def step(self, name: str) -> dict[str, Any]:
        if name not in self.results:
            pytest.fail(f"the runner did not get to step {name!r}: "
                        f"{self.results.get('error')}\n{self.results.get('traceback', '')}\n"
                        f"console (tail):\n{self.console[-3000:]}")
        return self.results[name]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    why = unavailable()
    if why:
        cannot_run(why)
    python, binds = service_python()  # type: ignore[misc]
    work = tmp_path_factory.mktemp("nspawn")
    out = work / "out"
    out.mkdir()
    test = work / "ocrd-test"
    test.mkdir()
    shutil.copy(HERE / "runner.py", test / "runner.py")
    (test / "config.yaml").write_text(config(inbox()))
    (test / "config2.yaml").write_text(config(inbox(), inbox("2")))
    (test / "config-liveness.yaml").write_text(liveness_config())
    make_documents(test / "files")
    binds_ro, site = checkout_binds()
    make_opt_ocrd(work / "opt-ocrd", python, site)
    dropin = work / "ocrd.service.d"
    dropin.mkdir()
    (dropin / "test-watchdog.conf").write_text(WATCHDOG_DROPIN)
    ro = [*binds_ro, *binds]
    etc = "/etc/systemd/system"
    console, rc = nspawn.boot(work, "/opt/ocrd/bin/python /ocrd-test/runner.py", [
        *(f"--bind-ro={p}" for p in ro),
        f"--bind-ro={work / 'opt-ocrd'}:/opt/ocrd",
        f"--bind-ro={test}:/ocrd-test",
        f"--bind-ro={UNITS / 'ocrd.service'}:{etc}/ocrd.service",
        f"--bind-ro={dropin}:{etc}/ocrd.service.d",
        f"--bind-ro={UNITS / 'ocrd.sysusers'}:/etc/sysusers.d/ocrd.conf",
        f"--bind-ro={UNITS / 'ocrd.tmpfiles'}:/etc/tmpfiles.d/ocrd.conf",
        f"--bind={out}:/out"], timeout=BOOT_TIMEOUT, runner_timeout=360)
    if not (out / "started").exists():
        cannot_run(f"the container did not boot (exit {rc}):\n{console[-3000:]}")
    results = json.loads((out / "results.json").read_text()) \
        if (out / "results.json").exists() else {"error": "no results.json"}
    journal = [json.loads(line) for line in (out / "journal.json").read_text().splitlines()
               if line.startswith("{")] if (out / "journal.json").exists() else []
    print(json.dumps(results, indent=2))
    return Run(out, results, journal, console)


def test_start_returns_only_after_ready(run: Run) -> None:
    r = run.step("start")
    assert r["rc"] == 0 and r["state"] == "active" and r["sub"] == "running", r
    # Type=notify: the unit became active when READY=1 arrived (ActiveEnter), well after
    # the process started (Python, render workers, engine, inboxes), and systemctl start
    # returned only after that. The STATUS= that came with READY=1 is still shown.
    assert r["active_enter_us"] - r["main_start_us"] >= 100_000, r
    assert r["active_enter_us"] <= r["returned_us"], r
    assert r["main_start_us"] < r["engine_started_us"] and r["inbox_added_us"], r
    assert r["status"].startswith("ready; watching 1 inbox") or "queue" in r["status"], r


def test_dropped_file_converts_with_the_share_permissions(run: Run) -> None:
    r = run.step("convert")
    assert "<!-- page 1 -->" in (run.out / "one.md").read_text()
    assert r["archived"], r
    # UMask=0007 + the setgid folder from ocrd.tmpfiles + file_mode 0660
    assert (r["owner"], r["group"], r["mode"]) == ("ocrd", "scans", "0o660"), r


def test_a_long_document_after_idle_is_not_killed_by_the_watchdog(run: Run) -> None:
    r = run.step("liveness")
    # Idle past the stall threshold (18 s), then a document five times WatchdogSec long.
    assert r["idle_s"] > 18 and r["seconds"] > 36, r
    assert r["pages"] == 40, r
    assert r["nrestarts"] == r["nrestarts_before"] and r["same_pid"], r
    assert r["watchdog_timeouts_during"] == 0 and r["stalled"] == 0, r


def test_reload_adds_an_inbox_without_restarting(run: Run) -> None:
    r = run.step("reload")
    assert r["rc"] == 0 and r["same_pid"] and r["inbox2_added"], r
    assert "<!-- page 1 -->" in (run.out / "two.md").read_text()


def test_stalled_main_loop_is_killed_by_the_watchdog_and_restarted(run: Run) -> None:
    r = run.step("watchdog")
    assert r["nrestarts"] >= r["nrestarts_before"] + 1, r
    assert "Watchdog timeout" in r["timeout_message"], r
    # WatchdogSec=8s: pings stop at the stall, the timeout follows within ~8 s.
    assert r["stall_to_timeout_s"] <= 8 + 4, r
    assert r["sigabrt"] and r["result_watchdog"], r
    # faulthandler printed where the loop was stuck.
    assert r["stack_shows_the_blocked_call"], r


def test_stop_lets_the_file_in_flight_finish_and_exits_cleanly(run: Run) -> None:
    r = run.step("stop")
    assert r["rc"] == 0 and r["state"] == "inactive", r
    assert r["result"] == "success" and r["exec_main_status"] == "0", r
    assert r["converted_after_stop_request"], r
    assert r["pages_done_before_stop"] < 12 and r["pages_in_markdown"] == 12, r


def test_a_configuration_it_cannot_start_with_is_not_restarted_in_a_loop(run: Run) -> None:
    r = run.step("bad_config")
    assert r["rc"] != 0 and r["state"] == "failed" and r["result"] == "exit-code", r
    assert r["exec_main_status"] == "2" and r["nrestarts"] == 0, r
    assert r["said"], r  # the journal names the bad key


def test_journal_has_ocrd_events_as_fields(run: Run) -> None:
    converted = [e for e in run.journal if e.get("EVENT") == "file_converted"]
    assert {e.get("OCRD_FILE") for e in converted} >= {"one.pdf", "two.pdf", "big.pdf"}
    one = next(e for e in converted if e.get("OCRD_FILE") == "one.pdf")
    assert one["SYSLOG_IDENTIFIER"] == "ocrd" and one["PRIORITY"] == "6"
    assert one["OCRD_PAGES"] == "1" and float(one["OCRD_SECONDS"]) > 0
    assert one["MESSAGE"].startswith("file_converted file=one.pdf")
    assert any(e.get("EVENT") == "page_done" and e.get("OCRD_PAGE") for e in run.journal)
    # Library records (stdlib logging: asyncio here, vLLM on a GPU) arrive as entries of
    # their own, with the logger's name and without EVENT=.
    ours = [e for e in run.journal if e.get("SYSLOG_IDENTIFIER") == "ocrd"
            and e.get("_TRANSPORT") == "journal"]
    assert any(e.get("OCRD_LOGGER") == "asyncio" and "EVENT" not in e for e in ours)
    # Nothing of ocrd's own went the stderr way (no "<6>{...}" lines, no JSON lines).
    stream = [e for e in run.journal if e.get("SYSLOG_IDENTIFIER") == "ocrd"
              and e.get("_TRANSPORT") == "stdout"]
    assert not any(str(e.get("MESSAGE", "")).lstrip().startswith("{") for e in stream), \
        stream[:3]


def test_large_and_multiline_values_reach_journald(run: Run) -> None:
    r = run.step("large_entry")
    assert r["rc"] == 0 and r["blob_len"] == 300000, r
    assert r["lines"] == "first\nsecond", r
