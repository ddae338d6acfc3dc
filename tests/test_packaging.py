"""ocrd as a user installs it: a wheel named ocr-inbox-daemon whose `ocrd` command starts,
and refuses to, with a sentence, where OCR-D's `ocrd` shares the package.

OCR-D's real wheel (downloaded by scripts/test into .test-wheels/) is installed without
its dependencies: ocrd's check reads the environment's metadata and must stop before
anything of the other program is imported, so its dependencies play no part, and the
throwaway venvs cost seconds instead of a minute of OpenCV and friends.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from ocrd import __version__
from ocrd.service import owner

ROOT = Path(__file__).resolve().parents[1]
OCRD_D_WHEEL = ROOT / ".test-wheels" / "ocrd-3.13.3-py3-none-any.whl"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pip(target_python: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--python", str(target_python), "install",
                    "-q", "--no-deps", "--no-index", *args], check=True)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ocrd built as the wheel `pip install .` would install."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(ROOT)], check=True,
                   capture_output=True)
    (found,) = out.glob("*.whl")
    return found


def venv(root: Path, *wheels: Path) -> Path:
    """A fresh venv with `wheels` installed in this order, finding ocrd's dependencies
    (pydantic, …) in the test venv's site-packages, after its own."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    for w in wheels:
        _pip(python, str(w))
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                           "get_paths()['purelib'])"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (Path(site) / "deps-from-the-test-venv.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    return root


def run(exe: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60)


@pytest.mark.e2e
def test_the_wheel_is_ocr_inbox_daemon_and_its_command_tells_its_version(
        wheel: Path, tmp_path: Path) -> None:
    assert wheel.name == f"ocr_inbox_daemon-{__version__}-py3-none-any.whl"
    env = venv(tmp_path / "v", wheel)
    r = run(env / "bin" / "ocrd", "--version", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"ocrd {__version__} (ocr-inbox-daemon)"
    shown = run(env / "bin" / "python", "-c", "from importlib import metadata as m; "
                "d = m.distribution('ocr-inbox-daemon'); print(d.version, d.entry_points"
                "['ocrd'].value)", cwd=tmp_path)
    assert shown.stdout.split() == [__version__, "ocrd.__main__:main"]
    # a check-config of nothing: the command really runs, up to its own message
    r = run(env / "bin" / "ocrd", "check-config", "-c", str(tmp_path / "none.yaml"),
            cwd=tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_the_wheel_carries_the_consoles_files(wheel: Path) -> None:
    """Package data a plain `pip install .` must not drop: every template and static
    file of the console (ocrd/web/)."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    files = [f.relative_to(ROOT).as_posix() for f in ROOT.joinpath("ocrd").rglob("*")
             if f.suffix in (".html", ".js", ".css")]
    assert len(files) >= 5
    assert sorted(set(files) - names) == []


@pytest.mark.e2e
def test_ocrd_refuses_to_start_beside_ocr_d(wheel: Path, tmp_path: Path) -> None:
    assert OCRD_D_WHEEL.exists(), "run ./scripts/test: it downloads OCR-D's wheel"
    # OCR-D first, ocrd second: the `ocrd` command is ours, OCR-D's ocrd/cli/ package
    # shadows ocrd/cli.py
    env = venv(tmp_path / "v", OCRD_D_WHEEL, wheel)
    for args in (["run", "-c", "/etc/ocrd/config.yaml"], ["status"], ["--version"]):
        r = run(env / "bin" / "ocrd", *args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("ocrd: cannot start: the Python package 'ocrd' in this "
                                   "environment also belongs to ocrd 3.13.3 (OCR-D framework)")
        assert "pip install ocr-inbox-daemon" in r.stderr and "Traceback" not in r.stderr
    r = run(env / "bin" / "python", "-m", "ocrd", "run", cwd=tmp_path)
    assert r.returncode == 2 and "OCR-D framework" in r.stderr


def test_an_install_under_the_old_name_is_named_as_such(tmp_path: Path) -> None:
    """The distribution was `ocrd` 0.1.0 before; such an install left beside the new one
    gets its own advice (pip uninstall ocrd, reinstall)."""
    site = tmp_path / "site"
    info = site / "ocrd-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ocrd\nVersion: 0.1.0\n"
                                   f"Summary: {owner.OLD_SUMMARY} -> Markdown\n")
    (info / "RECORD").write_text("ocrd/__init__.py,,\nocrd/cli.py,,\n")
    problem = owner.refusal([str(site)])
    assert problem is not None and "its old distribution name 'ocrd'" in problem
    assert "pip uninstall ocrd" in problem


def test_this_environment_is_clean() -> None:
    assert owner.other_owners() == []
    assert metadata.distribution(owner.DISTRIBUTION).version == __version__


def test_every_extra_is_used_by_ocrd() -> None:
    """No extra installs a package that ocrd never imports (the `systemd` extra did)."""
    sources = "\n".join(p.read_text() for p in (ROOT / "ocrd").rglob("*.py"))
    for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items():
        if extra == "test":
            continue
        for req in reqs:
            module = Requirement(req).name.replace("-", "_")
            assert f"import {module}" in sources or f"from {module}" in sources, \
                f"extra {extra!r}: {req} is installed but ocrd never imports it"


def test_watchdog_is_pinned_to_the_major_version_tested() -> None:
    """ocrd/intake/watch.py uses watchdog's inotify internals (watchdog.observers.inotify_c):
    the next major version may move them."""
    (req,) = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]
              if Requirement(r).name == "watchdog"]
    installed = Version(metadata.version("watchdog"))
    assert installed in req.specifier
    assert Version(f"{installed.major + 1}.0") not in req.specifier
