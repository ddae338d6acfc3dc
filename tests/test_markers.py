"""The `e2e` marker is kept honest by tests/conftest.py: a test that starts ocrd as a
subprocess without it fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import starts_ocrd

HERE = Path(__file__).resolve().parent


def test_what_counts_as_starting_ocrd() -> None:
    assert starts_ocrd([sys.executable, "-m", "ocrd", "run", "-c", "c.yaml"])
    assert starts_ocrd(["/opt/ocrd/bin/ocrd", "status"])
    assert starts_ocrd([Path("/x/.venv-user/bin/ocrd"), "convert"])
    assert starts_ocrd(["ocrd-container", "status"])
    assert not starts_ocrd(["tesseract", "page.png", "stdout"])
    assert not starts_ocrd([sys.executable, "-m", "pytest", "tests/ocrd"])
    assert not starts_ocrd(["ls", "/srv/ocrd-inbox"])
    assert starts_ocrd(["setpriv", "--inh-caps=-all", sys.executable, "-m", "ocrd", "run"])


def test_a_test_without_the_marker_that_starts_ocrd_fails(tmp_path: Path) -> None:
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    e2e: starts ocrd\n")
    (tmp_path / "test_probe.py").write_text(
        "import subprocess, sys\n"
        "import pytest\n"
        "def test_unmarked():\n"
        "    subprocess.run([sys.executable, '-m', 'ocrd', '--version'], check=True)\n"
        "@pytest.mark.e2e\n"
        "def test_marked():\n"
        "    subprocess.run([sys.executable, '-m', 'ocrd', '--version'], check=True)\n"
        "def test_other_programs():\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "test_unmarked starts ocrd as a subprocess" in out, out
    # the unmarked test's own call passes; the check fails it at teardown
    assert "3 passed, 1 error" in out, out
    assert "test_marked starts" not in out and "test_other_programs starts" not in out
