"""ocrd as a user installs it (`pip install .`, no extras, a virtual environment of its
own) is what the second pytest run of scripts/test starts as the daemon and as `ocrd`:
this checks that it is that and nothing more, so that a dependency only the test
environment has cannot make those tests pass. Skipped when $OCRD_TEST_OCRD is not set."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from daemon_process import USER_OCRD, ocrd_command, ocrd_env

REPO = Path(__file__).resolve().parents[1]
TEST_TOOLS = ("pytest", "selenium", "httpx", "reportlab", "jsonschema", "ruff", "vllm")

pytestmark = pytest.mark.skipif(not os.environ.get(USER_OCRD),
                                reason=f"${USER_OCRD} names no user's install of ocrd")


def test_the_users_ocrd_is_the_product_alone(tmp_path: Path) -> None:
    (command,) = ocrd_command()
    python = Path(command).parent / "python"
    probe = ("import importlib.util, json, ocrd; print(json.dumps({'ocrd': ocrd.__file__, "
             f"'tools': [m for m in {TEST_TOOLS!r} if importlib.util.find_spec(m)]}}))")
    r = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                       env=ocrd_env(), cwd=tmp_path, timeout=60, check=True)
    found = json.loads(r.stdout)
    assert found["tools"] == [], f"the user's environment has test tools: {found['tools']}"
    installed = Path(found["ocrd"]).resolve()
    assert installed.parent != REPO / "ocrd", f"ocrd comes from the checkout: {installed}"
    assert "site-packages" in installed.parts, installed
    check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True,
                           text=True, env=ocrd_env(), timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
