"""The tests mirror the package: tests/config, intake, work, render, pipeline, engines,
outputs, service and web hold each package's tests; tests/reliability the faults, hostile
input and load; tests/systemd what needs a real systemd; tests/vllm_engine the real vLLM
engine (CPU build); the tests of the product as a whole (e2e, CLI, packaging, the
user's install, container, real files, fuzz, architecture) stay at the top, beside the
support modules every test imports (helpers, daemon_process, fake_vllm, record_schemas,
console_site, structure_pages, document_fuzz), which this file puts on sys.path.

Shared fixtures: `browser` (the headless Chromium of the console's tests) and
`fast_backoff`; and the check that keeps the `e2e` marker honest: a test that starts
ocrd as a subprocess without it fails, so that `-m 'not e2e'` is the fast part it says
it is."""

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "reliability"))
# Every ocrd the tests start finds the engines they name by class path
# (simulated_engines.py) here; daemon_process.ocrd_env says the same for the user's install.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(HERE), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                  if p and p != str(HERE))])

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The remote engine's retry backoff made short, for tests of servers that fail."""
    from ocrd.engines import remote

    monkeypatch.setattr(remote, "BACKOFF_BASE_SECONDS", 0.05)
    monkeypatch.setattr(remote, "BACKOFF_MAX_SECONDS", 0.4)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail("chromium and chromium-driver are needed (scripts/test installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1440,1100", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def starts_ocrd(args: Any) -> bool:
    """Whether a subprocess's argv runs ocrd: `python -m ocrd …`, an `ocrd` command (the
    user's install in $OCRD_TEST_OCRD too), or the container's `ocrd-container`."""
    if isinstance(args, (str, bytes, os.PathLike)):
        args = [args]
    argv = [os.fsdecode(a) for a in args]
    def program(i: int, a: str) -> bool:  # the command itself, or one a prefix runs
        return os.path.basename(a) in ("ocrd", "ocrd-container") and (
            i == 0 or (os.path.isfile(a) and os.access(a, os.X_OK)))

    return any(a == "ocrd" and i > 0 and argv[i - 1] == "-m" for i, a in enumerate(argv)) or \
        any(program(i, a) for i, a in enumerate(argv))


@pytest.fixture(autouse=True)
def _ocrd_subprocess_needs_the_e2e_marker(request: pytest.FixtureRequest,
                                           monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.get_closest_marker("e2e") is not None:
        yield
        return
    started: list[Any] = []
    real_init = subprocess.Popen.__init__

    def init(self: subprocess.Popen, args: Any, *a: Any, **kw: Any) -> None:
        if starts_ocrd(args):
            started.append(args)
        real_init(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", init)
    yield
    if started:
        pytest.fail(f"{request.node.nodeid} starts ocrd as a subprocess ({started[0]!r}) "
                    "without the e2e marker", pytrace=False)
