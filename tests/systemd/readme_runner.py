"""Runs inside the container of test_readme.py, as root, as the oneshot runner.service it
boots into: the README's quick start and its install-as-a-service commands (taken from
README.md by the test and put in /ocrd-test), run as written in a fresh copy of the
checkout, then a file dropped in each way. What happened goes to /out/results.json.

Only the standard library (and runner.py's helpers), with the container's
/usr/bin/python3: nothing of ocrd's is installed here but what the README's commands
install."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from runner import say, wait  # tests/systemd/runner.py, copied beside this file

OUT = Path("/out")
TEST = Path("/ocrd-test")
CHECKOUT = Path("/root/ocrd")
# pip takes ocrd's dependencies (and the build backend) from a folder of wheels: the
# container has no network of its own.
ENV = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wheelhouse",
       "HOME": "/root", "LANG": "C.UTF-8"}

results: dict[str, Any] = {}


def commands(name: str) -> list[str]:
    """The README block's command lines (comment lines left out)."""
    lines = (TEST / f"{name}.sh").read_text().splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def run_line(line: str, cwd: Path, timeout: float = 600) -> dict[str, Any]:
    """One README line, as a user types it into bash."""
    t0 = time.monotonic()
    res = subprocess.run(["bash", "-c", line], cwd=cwd, env=ENV, capture_output=True,
                         text=True, timeout=timeout)
    done = {"line": line, "rc": res.returncode, "seconds": round(time.monotonic() - t0, 1),
            "out": (res.stdout + res.stderr)[-4000:]}
    say("$", line, "->", res.returncode)
    return done


def expected_names(line: str) -> list[str]:
    """`ls outbox/   # a.md  a.json   (a.assets/ with figures)` → ['a.md', 'a.json']: the
    names a README line's comment says will be there (not those in parentheses)."""
    comment = line.partition("#")[2]
    comment = re.sub(r"\(.*?\)", "", comment)
    return [w for w in comment.split() if re.fullmatch(r"[\w.-]+\.\w+", w)]


def http(url: str, data: bytes | None = None) -> tuple[int, str, dict[str, str]]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, data=data), timeout=10) as r:
            return r.status, r.read().decode(errors="replace"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), dict(e.headers)
    except OSError:
        return 0, "", {}


def flash(cookie: str | None) -> dict | None:
    """The message the console's form left for the next page (its flash cookie)."""
    m = re.search(r'ocrd_flash="?([A-Za-z0-9_=-]+)', cookie or "")
    if not m:
        return None
    return json.loads(base64.urlsafe_b64decode(m.group(1).encode()))


class Background:
    """A long-running README command (./scripts/run-local) in its own process group,
    its output in a file."""

    def __init__(self, line: str, log: Path) -> None:
        self.log = log
        self.t0 = time.monotonic()
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(["bash", "-c", line], cwd=CHECKOUT, env=ENV,
                                         stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match:
        found = wait(lambda: re.search(pattern, self.text()) or self.proc.poll() is not None,
                     timeout, f"{pattern!r} from {self.log.name}")
        if found is True:
            raise RuntimeError(f"{self.log.name} ended ({self.proc.returncode}) before "
                               f"{pattern!r}:\n{self.text()[-3000:]}")
        return found

    def interrupt(self) -> int:
        """Ctrl-C, as in a terminal: SIGINT to the process group."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)


# -- the steps ----------------------------------------------------------------------------


def quick_start() -> None:
    (start,) = commands("quick-start")
    first = Background(start, OUT / "run-local-1.log")
    url = first.wait_for_line(r"Open the console in a browser: (http://\S+)", 600).group(1)
    r: dict[str, Any] = {"command": start, "console": url,
                         "install_seconds": round(time.monotonic() - first.t0, 1)}
    results["quick_start"] = r
    wait(lambda: http(url + "api/status")[0] == 200, 120, "the console")
    r["lines"] = []
    for line in commands("quick-start-files"):
        if line.startswith("ls "):
            folder = CHECKOUT / line.split()[1]
            names = expected_names(line)
            wait(lambda f=folder, n=names: all((f / x).exists() for x in n), 120,
                 f"{names} in {folder}")
        r["lines"].append(run_line(line, CHECKOUT))
    # the console's forms need python-multipart: Retry on a file that failed
    (CHECKOUT / "inbox" / "letter.docx").write_bytes((TEST / "letter.docx").read_bytes())
    wait(lambda: (CHECKOUT / "failed" / "letter.docx.error.json").exists(), 120,
         "letter.docx in failed/")
    r["failed_message"] = json.loads(
        (CHECKOUT / "failed" / "letter.docx.error.json").read_text())["message"]
    status, body, _ = http(url + "api/status")
    csrf = json.loads(body)["csrf"]
    failed = json.loads(http(url + "api/files?state=failed")[1])["files"][0]["id"]
    r["overview"] = http(url)[0]
    # unsupported: the console asks the person to confirm the cause is gone first
    form = urllib.parse.urlencode({"csrf": csrf}).encode()
    _, _, headers = http(url + f"files/{failed}/retry", form)
    r["retry_unconfirmed"] = flash(headers.get("set-cookie") or headers.get("Set-Cookie"))
    form = urllib.parse.urlencode({"csrf": csrf, "cause_gone": "1"}).encode()
    code, text, headers = http(url + f"files/{failed}/retry", form)
    r["retry"] = {"status": code, "location": headers.get("location"), "body": text[-500:],
                  "flash": flash(headers.get("set-cookie") or headers.get("Set-Cookie"))}
    wait(lambda: failed in [f["id"] for f in json.loads(
        http(url + "api/files?state=retried")[1] or '{"files": []}')["files"]],
        60, "the retried file's row")
    r["retried_row"] = True
    r["rc_after_ctrl_c"] = first.interrupt()
    r["output"] = first.text()

    second = Background(start, OUT / "run-local-2.log")
    second.wait_for_line(r"Open the console in a browser: http://\S+", 300)
    wait(lambda: http(url + "api/status")[0] == 200, 120, "the console, started again")
    r["second_start_seconds"] = round(time.monotonic() - second.t0, 1)
    r["second_output"] = second.text()[-4000:]
    r["rc_after_second_ctrl_c"] = second.interrupt()


def service() -> None:
    r: dict[str, Any] = {"lines": []}
    results["service"] = r
    # The unit waits for network-online.target; this container has no network, so
    # systemd-networkd-wait-online would wait its full 2 minutes for one.
    run_line("systemctl mask --runtime systemd-networkd-wait-online.service", CHECKOUT)
    for line in commands("service"):
        done = run_line(line, CHECKOUT)
        r["lines"].append(done)
        if done["rc"]:
            raise RuntimeError(f"README line failed: {line}\n{done['out']}")
    r["active"] = run_line("systemctl is-active ocrd", CHECKOUT)["out"].strip()
    t0 = time.monotonic()
    run_line("cp samples/scan_0042.pdf /srv/scans/inbox/", CHECKOUT)  # as the README says
    md = Path("/srv/scans/markdown/scan_0042.md")
    wait(md.exists, 180, str(md))
    st = md.stat()
    r["converted"] = {"seconds": round(time.monotonic() - t0, 1), "text": md.read_text(),
                      "uid": st.st_uid, "gid": st.st_gid, "mode": oct(st.st_mode & 0o777),
                      "archived": Path("/srv/scans/archive/scan_0042.pdf").exists()}
    r["status"] = run_line("/opt/ocrd/bin/ocrd status", CHECKOUT)
    r["owner"] = run_line("stat -c '%U:%G' /srv/scans/markdown/scan_0042.md",
                          CHECKOUT)["out"].strip()
    r["warnings"] = run_line("journalctl --no-pager --output=cat -p warning -u ocrd",
                             CHECKOUT)["out"].strip()


def main() -> None:
    (OUT / "started").write_text(str(time.monotonic()))
    try:
        for step in (quick_start, service):
            say("step", step.__name__)
            results["failed_step"] = step.__name__
            step()
        del results["failed_step"]
    except BaseException as e:
        results["error"] = f"{type(e).__name__}: {e}"
        results["traceback"] = traceback.format_exc()
        say(results["traceback"])
    finally:
        with open(OUT / "journal.log", "w") as f:
            subprocess.run(["journalctl", "--boot", "--no-pager"], stdout=f, timeout=60)
        (OUT / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
