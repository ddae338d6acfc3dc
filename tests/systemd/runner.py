"""Runs inside the systemd-nspawn container of test_nspawn.py, as root, as the oneshot
runner.service that the container boots into. It drives ocrd.service with systemctl the
way an administrator would, measures, and writes what it saw to /out/results.json (plus
the journal) for the test to assert on. Every wait has a deadline; whatever happens,
runner.service ends and its SuccessAction=/FailureAction= power the container off.

Only the standard library: it runs with the interpreter of the ocrd under test."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUT = Path("/out")
TEST = Path("/ocrd-test")
SCANS = Path("/srv/scans")
INBOX, MARKDOWN, ARCHIVE = SCANS / "inbox", SCANS / "markdown", SCANS / "archive"
INBOX2, MARKDOWN2 = SCANS / "inbox2", SCANS / "markdown2"
STALL = Path("/run/ocrd-test/stall")
UNIT = "ocrd.service"

results: dict[str, Any] = {}


def say(*parts: object) -> None:
    line = f"[{time.monotonic():.2f}] " + " ".join(str(p) for p in parts)
    print(line, flush=True)
    with open(OUT / "runner.log", "a") as f:
        f.write(line + "\n")


def sh(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    res = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if res.returncode:
        say("$", *args, "->", res.returncode, res.stdout[-1500:], res.stderr[-1500:])
    return res


def show(*props: str) -> dict[str, str]:
    res = sh("systemctl", "show", UNIT, *(f"--property={p}" for p in props))
    return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)


def journal(*matches: str, unit: str = UNIT) -> list[dict[str, Any]]:
    res = sh("journalctl", "--all", "--output=json", "--no-pager", f"--unit={unit}", *matches)
    out = []
    for line in res.stdout.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        for key, value in entry.items():
            if isinstance(value, list):  # journalctl's form for non-printable values
                entry[key] = bytes(value).decode(errors="replace")
        out.append(entry)
    return out


def events(name: str, **fields: str) -> list[dict[str, Any]]:
    return [e for e in journal(f"EVENT={name}")
            if all(e.get(k) == v for k, v in fields.items())]


def usec(entry: dict[str, Any]) -> int:
    return int(entry["__MONOTONIC_TIMESTAMP"])


def wait(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        time.sleep(every)


def drop(name: str, inbox: Path) -> None:
    """Write under a hidden name (ocrd ignores dotfiles), then rename into place."""
    part = inbox / f".{name}.part"
    shutil.copy(TEST / "files" / name, part)
    os.rename(part, inbox / name)


def folder_for_ocrd(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, pwd.getpwnam("ocrd").pw_uid, grp.getgrnam("scans").gr_gid)
    os.chmod(path, 0o2770)


def now_us() -> int:
    return time.monotonic_ns() // 1000


# -- the steps ----------------------------------------------------------------------------


def setup() -> None:
    config = Path("/etc/ocrd/config.yaml")
    shutil.copy(TEST / "config.yaml", config)
    os.chown(config, 0, grp.getgrnam("ocrd").gr_gid)
    os.chmod(config, 0o640)
    STALL.parent.mkdir(parents=True, exist_ok=True)
    results["setup"] = {"user": pwd.getpwnam("ocrd").pw_dir,
                        "inbox_mode": oct(INBOX.stat().st_mode & 0o7777)}


def start() -> None:
    t0 = now_us()
    res = sh("systemctl", "start", UNIT, timeout=240)
    t1 = now_us()
    st = show("ActiveState", "SubState", "ExecMainStartTimestampMonotonic",
              "ActiveEnterTimestampMonotonic", "StatusText", "MainPID")
    engine = events("engine_started")
    inboxes = events("inbox_added")
    results["start"] = {
        "rc": res.returncode, "called_us": t0, "returned_us": t1,
        "state": st["ActiveState"], "sub": st["SubState"], "status": st["StatusText"],
        "main_start_us": int(st["ExecMainStartTimestampMonotonic"]),
        "active_enter_us": int(st["ActiveEnterTimestampMonotonic"]),
        "engine_started_us": usec(engine[0]) if engine else None,
        "inbox_added_us": usec(inboxes[-1]) if inboxes else None,
    }
    if res.returncode:
        raise RuntimeError(f"systemctl start failed: {res.stderr.strip()}")


def convert() -> None:
    t0 = time.monotonic()
    drop("one.pdf", INBOX)
    wait(lambda: (MARKDOWN / "one.md").exists(), 90, "markdown/one.md")
    st = (MARKDOWN / "one.md").stat()
    shutil.copy(MARKDOWN / "one.md", OUT / "one.md")
    results["convert"] = {
        "seconds": time.monotonic() - t0, "archived": (ARCHIVE / "one.pdf").exists(),
        "owner": pwd.getpwuid(st.st_uid).pw_name, "group": grp.getgrgid(st.st_gid).gr_name,
        "mode": oct(st.st_mode & 0o777)}


def liveness() -> None:
    """A healthy daemon is never killed by the watchdog: after an idle spell longer than
    the stall threshold, a document that takes five times WatchdogSec (8 s) converts
    with no restart. Runs last: the daemon is started with the liveness config (a
    simulated engine at a fixed 1 s a page, page timeout 3 s: threshold 18 s)."""
    shutil.copy(TEST / "config-liveness.yaml", "/etc/ocrd/config.yaml")
    res = sh("systemctl", "start", UNIT, timeout=240)
    if res.returncode:
        raise RuntimeError(f"systemctl start failed: {res.stderr.strip()}")
    before = show("MainPID", "NRestarts")
    t_ready = now_us()
    timeouts_before = sum("Watchdog timeout" in str(e.get("MESSAGE", ""))
                          for e in journal("_PID=1"))
    wait(lambda: now_us() - t_ready > 20_000_000, 60, "an idle spell of 20 s")
    idle_s = (now_us() - t_ready) / 1e6
    t0 = time.monotonic()
    drop("long.pdf", INBOX)
    wait(lambda: (MARKDOWN / "long.md").exists(), 240, "markdown/long.md")
    seconds = time.monotonic() - t0
    after = show("MainPID", "NRestarts")
    text = (MARKDOWN / "long.md").read_text()
    results["liveness"] = {
        "idle_s": idle_s, "seconds": seconds, "pages": text.count("<!-- page "),
        "nrestarts_before": int(before["NRestarts"]), "nrestarts": int(after["NRestarts"]),
        "same_pid": after["MainPID"] == before["MainPID"],
        "watchdog_timeouts_during": sum("Watchdog timeout" in str(e.get("MESSAGE", ""))
                                        for e in journal("_PID=1")) - timeouts_before,
        "stalled": len([e for e in events("stalled") if usec(e) >= t_ready]),
    }
    sh("systemctl", "stop", UNIT, timeout=300)


def reload() -> None:
    for name in ("inbox2", "markdown2", "archive2", "failed2"):
        folder_for_ocrd(SCANS / name)
    pid = show("MainPID")["MainPID"]
    shutil.copy(TEST / "config2.yaml", "/etc/ocrd/config.yaml")
    t0 = time.monotonic()
    res = sh("systemctl", "reload", UNIT)
    wait(lambda: events("reloaded"), 30, "reloaded event")
    wait(lambda: show("SubState")["SubState"] == "running", 30, "running after reload")
    drop("two.pdf", INBOX2)
    wait(lambda: (MARKDOWN2 / "two.md").exists(), 90, "markdown2/two.md")
    shutil.copy(MARKDOWN2 / "two.md", OUT / "two.md")
    results["reload"] = {
        "rc": res.returncode, "seconds": time.monotonic() - t0,
        "same_pid": show("MainPID")["MainPID"] == pid,
        "inbox2_added": any(e.get("OCRD_INBOX") == str(INBOX2) for e in events("inbox_added")),
    }


def watchdog() -> None:
    before = show("MainPID", "NRestarts")
    STALL.touch()
    # the engine (tesseract inside the test's FaultyEngine) blocks the event loop at
    # this file's first page, while STALL exists
    drop("one.pdf", INBOX)
    blocked = wait(lambda: events("engine_blocks_the_loop"), 60, "the loop blocked")
    t0 = usec(blocked[0])

    def timed_out() -> dict[str, Any] | None:
        hits = [e for e in journal("_PID=1")
                if "Watchdog timeout" in str(e.get("MESSAGE", ""))]
        return hits[0] if hits else None

    try:
        hit = wait(timed_out, 90, "watchdog timeout", every=0.5)
    finally:
        STALL.unlink(missing_ok=True)  # the restarted daemon must not stall again

    def back() -> dict[str, str] | None:
        st = show("MainPID", "NRestarts", "ActiveState", "SubState")
        ok = (int(st["NRestarts"]) >= 1 and st["SubState"] == "running"
              and st["MainPID"] not in ("0", before["MainPID"]))
        return st if ok else None

    st = wait(back, 90, "restart after the watchdog")
    t_back = now_us()
    text = "\n".join(str(e.get("MESSAGE", "")) for e in journal() if usec(e) >= t0)
    starts = [e for e in journal("_PID=1") if usec(e) >= t0
              and str(e.get("MESSAGE", "")).startswith("Started ")]
    results["watchdog"] = {
        "nrestarts_before": int(before["NRestarts"]), "nrestarts": int(st["NRestarts"]),
        "stall_to_timeout_s": (usec(hit) - t0) / 1e6,
        "stall_to_restarted_s": ((usec(starts[0]) if starts else t_back) - t0) / 1e6,
        "timeout_message": hit.get("MESSAGE"),
        "sigabrt": "SIGABRT" in text or "ABRT" in text,
        "stack_shows_the_blocked_call": "simulated_engines.py" in text and " ocr" in text,
        "result_watchdog": "result 'watchdog'" in text,
    }


def stop() -> None:
    drop("big.pdf", INBOX)
    wait(lambda: events("page_done", OCRD_FILE="big.pdf"), 120, "first page of big.pdf")
    t0 = time.monotonic()
    res = sh("systemctl", "stop", UNIT, timeout=300)
    seconds = time.monotonic() - t0
    st = show("Result", "ExecMainStatus", "ExecMainCode", "ActiveState")
    requested = events("stop_requested")
    converted = events("file_converted", OCRD_FILE="big.pdf")
    done = events("page_done", OCRD_FILE="big.pdf")
    md = MARKDOWN / "big.md"
    text = md.read_text() if md.exists() else ""
    results["stop"] = {
        "rc": res.returncode, "seconds": seconds, "result": st["Result"],
        "exec_main_status": st["ExecMainStatus"], "exec_main_code": st["ExecMainCode"],
        "state": st["ActiveState"], "pages_in_markdown": text.count("<!-- page "),
        "pages_done_before_stop": sum(usec(e) < usec(requested[-1]) for e in done)
        if requested else None,
        "converted_after_stop_request": bool(converted and requested
                                             and usec(converted[-1]) > usec(requested[-1])),
    }


def bad_config() -> None:
    """A configuration the daemon cannot start with (a key it does not know): the start
    fails with exit status 2, and systemd does not start it again and again (the unit's
    RestartPreventExitStatus=2). Waits past RestartSec, when a restart would come."""
    config = Path("/etc/ocrd/config.yaml")
    good = config.read_bytes()
    config.write_bytes(good + b"\nno_such_key: 1\n")
    try:
        res = sh("systemctl", "start", UNIT, timeout=120)
        wait(lambda: show("ActiveState")["ActiveState"] in ("failed", "inactive"), 60,
             "the start to fail")
        time.sleep(12)  # RestartSec is 5 s
        st = show("ActiveState", "Result", "ExecMainStatus", "NRestarts")
    finally:
        config.write_bytes(good)
    results["bad_config"] = {
        "rc": res.returncode, "state": st["ActiveState"], "result": st["Result"],
        "exec_main_status": st["ExecMainStatus"], "nrestarts": int(st["NRestarts"]),
        "said": [e.get("MESSAGE", "") for e in journal()
                 if "no_such_key" in str(e.get("MESSAGE", ""))][-1:]}
    sh("systemctl", "reset-failed", UNIT)


def large_entry() -> None:
    """A log entry larger than a datagram (sent as a memfd) and a multi-line value (the
    binary form), through a real journald."""
    code = ("import structlog; from ocrd.service import log; log.setup('info'); "
            "structlog.get_logger('ocrd.test').info('big_event', blob='x' * 300000, "
            "lines='first' + chr(10) + 'second')")
    # A unit of its own (systemd-run would need D-Bus, which this container lacks), so
    # that stderr is a journal stream as it is for ocrd.service.
    Path("/etc/systemd/system/ocrd-logcheck.service").write_text(
        f'[Service]\nType=oneshot\nUser=ocrd\nExecStart=/opt/ocrd/bin/python -c "{code}"\n')
    sh("systemctl", "daemon-reload")
    res = sh("systemctl", "start", "ocrd-logcheck.service", timeout=120)
    found = wait(lambda: journal("EVENT=big_event", unit="ocrd-logcheck.service"), 15,
                 "big_event in the journal")
    results["large_entry"] = {"rc": res.returncode, "blob_len": len(found[0]["OCRD_BLOB"]),
                              "lines": found[0].get("OCRD_LINES")}


def main() -> None:
    (OUT / "started").write_text(str(now_us()))
    try:
        for step in (setup, start, convert, reload, watchdog, stop, liveness, bad_config,
                     large_entry):
            say("step", step.__name__)
            step()
            say("done", step.__name__, json.dumps(results.get(step.__name__)))
    except BaseException as e:
        results["error"] = f"{type(e).__name__}: {e}"
        results["traceback"] = traceback.format_exc()
        say(results["traceback"])
    finally:
        with open(OUT / "journal.json", "w") as f:
            subprocess.run(["journalctl", "--all", "--output=json", "--no-pager",
                            f"--unit={UNIT}"], stdout=f, timeout=60)
        with open(OUT / "boot.log", "w") as f:
            subprocess.run(["journalctl", "--boot", "--no-pager"], stdout=f, timeout=60)
        (OUT / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
