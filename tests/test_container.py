"""The container for NAS users, built and run as they would: the image from the
Containerfile (on a Debian base made here with mmdebstrap: no image registry is reachable),
started with what compose.yaml says (its environment, volumes and port; the user and group
ids set as a NAS user sets them), with Debian's podman. A file dropped into the mounted
inbox comes out in the mounted outbox, owned by those ids; the console answers and asks
for the token the container wrote; `podman stop` ends it cleanly.

Needs root, podman, buildah, runc and mmdebstrap (scripts/test installs them). Without
them the tests skip, or fail when OCRD_REQUIRE_CONTAINER=1 (CI). The build time and the
image's size are printed (pytest -s) and written to test-artifacts/container.json."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from helpers import free_port, make_pdf, sentence_lines, wait_for

pytestmark = [pytest.mark.container, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
BASE = "localhost/debian:bookworm"  # made here: mmdebstrap, podman import
IMAGE = f"localhost/ocrd-test-{os.getpid()}"  # its own: sessions side by side
UID, GID = 1234, 2345  # the NAS share's owner, as compose.yaml's PUID/PGID say
ARTIFACTS = Path(os.environ.get("OCRD_TEST_ARTIFACTS") or REPO / "test-artifacts")
# podman's defaults fail on these machines (notes: crun's rlimits, cgroups v1 hybrid)
PODMAN_CONF = "[containers]\ndefault_ulimits = []\n"
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "podman's container tests run as root"
    missing = [t for t in ("podman", "buildah", "runc", "mmdebstrap") if not shutil.which(t)]
    return f"missing {', '.join(missing)} (apt-get install podman buildah runc " \
        "mmdebstrap)" if missing else None


def cannot_run(why: str) -> None:
    if os.environ.get("OCRD_REQUIRE_CONTAINER") == "1":
        pytest.fail(f"OCRD_REQUIRE_CONTAINER=1 but the container cannot be built here: {why}")
    pytest.skip(why)


@dataclass
class Built:
    image: str
    env: dict[str, str]
    build_seconds: float
    base_seconds: float
    size_bytes: int


def run(*args: str, env: dict[str, str], timeout: float = 120,
        check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), env=env, capture_output=True, text=True,
                          timeout=timeout, check=check)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    why = unavailable()
    if why:
        cannot_run(why)
    work = tmp_path_factory.mktemp("container")
    conf = work / "containers.conf"
    conf.write_text(PODMAN_CONF)
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    t0 = time.monotonic()
    if run("podman", "image", "exists", BASE, env=env, check=False).returncode:
        rootfs = work / "rootfs.tar"
        run("mmdebstrap", "--variant=minbase", "--quiet", "bookworm", str(rootfs), env=env,
            timeout=900)
        run("podman", "import", "--quiet", str(rootfs), BASE, env=env, timeout=300)
        rootfs.unlink()
    base_seconds = time.monotonic() - t0
    # This machine reaches PyPI through a proxy with a CA of its own: the RUN steps get
    # the host's CA bundle and a pip.conf naming it, as mounts that stay out of the image.
    pip_conf = work / "pip.conf"
    pip_conf.write_text("[global]\ncert = /etc/ocrd-build-ca.pem\n")
    t0 = time.monotonic()
    res = run("buildah", "bud", "--isolation", "chroot", "--layers=false",
              "--build-arg", f"BASE={BASE}",
              "--volume", "/etc/ssl/certs/ca-certificates.crt:/etc/ocrd-build-ca.pem:ro",
              "--volume", f"{pip_conf}:/etc/pip.conf:ro",
              "-t", IMAGE, "-f", str(REPO / "Containerfile"), str(REPO),
              env=env, timeout=1800, check=False)
    build_seconds = time.monotonic() - t0
    assert res.returncode == 0, f"the build failed:\n{(res.stdout + res.stderr)[-5000:]}"
    size = int(run("podman", "image", "inspect", "--format", "{{.Size}}", IMAGE,
                   env=env).stdout)
    facts = Built(IMAGE, env, round(build_seconds, 1), round(base_seconds, 1), size)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "container.json").write_text(json.dumps(facts.__dict__ | {"env": None}))
    print(f"\ncontainer: base image {facts.base_seconds} s, build {facts.build_seconds} s, "
          f"image {size / 1e6:.0f} MB")
    yield facts
    run("podman", "rmi", "--force", IMAGE, env=env, check=False)


def compose_service() -> dict:
    return yaml.safe_load((REPO / "compose.yaml").read_text())["services"]["ocrd"]


def http(url: str, data: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object) -> None:
            return None

    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=10) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode()
    except OSError:
        return 0, {}, ""


def test_the_compose_file_says_what_a_nas_user_sets() -> None:
    service = compose_service()
    assert service["build"] == "." and {"PUID", "PGID", "TZ"} <= set(service["environment"])
    mounts = {v.split(":")[1] for v in service["volumes"]}
    assert mounts == {"/inbox", "/outbox", "/failed", "/archive", "/config"}
    assert service["ports"] == ["9465:9465"]
    containerfile = (REPO / "Containerfile").read_text()
    assert "ARG BASE=" in containerfile and "ARG ENGINE=tesseract" in containerfile
    assert "[vllm]" in containerfile  # the GPU variant: --build-arg ENGINE=vllm


def test_a_file_dropped_in_comes_out_owned_by_the_configured_ids(
        built: Built, tmp_path: Path) -> None:
    service = compose_service()
    project = tmp_path / "nas"
    for volume in service["volumes"]:
        (project / volume.split(":")[0]).mkdir(parents=True)
    # the share belongs to the NAS user, as PUID/PGID say
    for name in ("inbox", "outbox", "failed", "archive"):
        os.chown(project / name, UID, GID)
    env_args = []
    for key, value in {**service["environment"], "PUID": str(UID), "PGID": str(GID)}.items():
        env_args += ["-e", f"{key}={value}"]
    volume_args = []
    for volume in service["volumes"]:
        host, inside = volume.split("#")[0].strip().split(":")
        volume_args += ["-v", f"{(project / host).resolve()}:{inside}"]
    port = free_port()
    (published,) = service["ports"]
    name = f"ocrd-test-{uuid.uuid4().hex[:8]}"
    run(*PODMAN, "run", "-d", "--name", name, *env_args, *volume_args,
        "-p", f"127.0.0.1:{port}:{published.split(':')[1]}", built.image, env=built.env)
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        wait_for(lambda: http(base + "/healthz")[0] == 200, 120, "the console")
        started = time.monotonic() - t0
        make_pdf(project / "inbox" / ".scan.pdf.part", [sentence_lines(7), sentence_lines(8)])
        os.rename(project / "inbox" / ".scan.pdf.part", project / "inbox" / "scan.pdf")
        md = project / "outbox" / "scan.md"
        archived = project / "archive" / "scan.pdf"
        wait_for(lambda: md.exists() and archived.exists(), 180, "outbox/scan.md, archived")
        assert "<!-- page 2 -->" in md.read_text()
        for written in (md, project / "outbox" / "scan.json", archived):
            st = written.stat()
            assert (st.st_uid, st.st_gid) == (UID, GID), (written, st.st_uid, st.st_gid)
        # the config and token it wrote at its first start, the user's and private
        token_file = project / "config" / "web-token"
        assert token_file.stat().st_uid == UID and token_file.stat().st_mode & 0o077 == 0
        assert (project / "config" / "config.yaml").exists()
        assert (project / "config" / "state" / "journal.sqlite3").exists()

        # the console: off loopback in the container, so it asks for the token
        code, headers, _ = http(base + "/")
        assert code == 303 and headers["location"] == "/login"
        token = token_file.read_text().strip()
        form = urllib.parse.urlencode({"token": token}).encode()
        code, headers, _ = http(base + "/login", form)
        assert code == 303, code
        cookie = headers["set-cookie"].split(";")[0]
        code, _, page = http(base + "/", headers={"Cookie": cookie})
        assert code == 200 and "scan.pdf" in page

        # compose's health check, and a command run as the NAS user
        health = service["healthcheck"]["test"]
        assert health[0] == "CMD"
        run(*PODMAN, "exec", name, *health[1:], env=built.env)
        status = run(*PODMAN, "exec", name, "ocrd-container", "status", env=built.env)
        assert "done 1" in status.stdout, status.stdout
        print(f"container: console up {started:.1f} s after `podman run`")
    finally:
        stop = run(*PODMAN, "stop", "--time", "60", name, env=built.env, check=False)
        code = run(*PODMAN, "inspect", "--format", "{{.State.ExitCode}}", name,
                   env=built.env, check=False).stdout.strip()
        logs = run(*PODMAN, "logs", name, env=built.env, check=False)
        run(*PODMAN, "rm", "--force", name, env=built.env, check=False)
    assert stop.returncode == 0 and code == "0", (code, logs.stdout[-3000:])
    assert '"event": "stopped"' in logs.stdout + logs.stderr
    assert "Traceback" not in logs.stdout + logs.stderr


# -- the entrypoint as root, in the image: links, ids, the folders compose makes ------------

def _nas(tmp_path: Path, owned: bool) -> Path:
    """The folders compose.yaml mounts; `owned`: the share's (else root's, empty, 0755,
    as compose creates a missing one)."""
    project = tmp_path / "nas"
    for volume in compose_service()["volumes"]:
        folder = project / volume.split(":")[0]
        folder.mkdir(parents=True)
        os.chmod(folder, 0o755)
        if owned:
            os.chown(folder, UID, GID)
    return project


def _start(built: Built, project: Path, ids: tuple[int, int],
           extra_env: dict[str, str] | None = None) -> tuple[str, str]:
    """`podman run` as compose.yaml says, with these PUID:PGID; (name, console URL)."""
    service = compose_service()
    env_args = []
    for key, value in {**service["environment"], "PUID": str(ids[0]), "PGID": str(ids[1]),
                       **(extra_env or {})}.items():
        env_args += ["-e", f"{key}={value}"]
    volume_args = []
    for volume in service["volumes"]:
        host, inside = volume.split("#")[0].strip().split(":")
        volume_args += ["-v", f"{(project / host).resolve()}:{inside}"]
    port = free_port()
    name = f"ocrd-test-{uuid.uuid4().hex[:8]}"
    run(*PODMAN, "run", "-d", "--name", name, *env_args, *volume_args,
        "-p", f"127.0.0.1:{port}:9465", built.image, env=built.env)
    return name, f"http://127.0.0.1:{port}"


def _exited(built: Built, name: str, timeout: float = 60) -> bool:
    """Whether the container has ended by itself within the timeout."""
    def ended() -> bool:
        return run(*PODMAN, "inspect", "--format", "{{.State.Running}}", name,
                   env=built.env, check=False).stdout.strip() == "false"
    try:
        wait_for(ended, timeout, "the container to end")
    except AssertionError:
        return False
    return True


def _finish(built: Built, name: str) -> tuple[str, str]:
    """Stop and remove the container; (exit code, its log)."""
    run(*PODMAN, "stop", "--time", "30", name, env=built.env, check=False)
    code = run(*PODMAN, "inspect", "--format", "{{.State.ExitCode}}", name,
               env=built.env, check=False).stdout.strip()
    logs = run(*PODMAN, "logs", name, env=built.env, check=False)
    run(*PODMAN, "rm", "--force", name, env=built.env, check=False)
    return code, logs.stdout + logs.stderr


def test_a_link_planted_in_config_is_not_followed_by_the_root_entrypoint(
        built: Built, tmp_path: Path) -> None:
    """/config belongs to PUID: whoever runs as PUID can plant `web-token ->
    /etc/ld.so.preload`; the start must neither create that file as root nor hand it
    to PUID (a way to root at the next start)."""
    project = _nas(tmp_path, owned=True)
    config = project / "config"
    os.chown(config, UID, GID)
    for name in ("web-token", "config.yaml"):
        link = config / name
        os.symlink("/etc/ld.so.preload", link)
        os.lchown(link, UID, GID)
        container, _ = _start(built, project, (UID, GID))
        try:
            ended = _exited(built, container)
            changed = run(*PODMAN, "diff", container, env=built.env).stdout
        finally:
            code, logs = _finish(built, container)
        assert ended and code != "0", (code, logs[-3000:])
        assert "symbolic link" in logs, logs[-3000:]
        assert "ld.so.preload" not in changed, changed
        assert os.readlink(link) == "/etc/ld.so.preload"
        link.unlink()


def test_root_ids_are_refused_in_the_container(built: Built, tmp_path: Path) -> None:
    project = _nas(tmp_path, owned=True)
    container, _ = _start(built, project, (0, 0))
    try:
        ended = _exited(built, container)
    finally:
        code, logs = _finish(built, container)
    assert ended and code != "0" and "OCRD_RUN_AS_ROOT=yes" in logs, (code, logs[-3000:])
    assert not (project / "config" / "web-token").exists()


def test_compose_made_folders_are_the_groups_and_a_puid_change_is_followed(
        built: Built, tmp_path: Path) -> None:
    """The folders compose creates (root's, 0755, empty) become PUID:PGID's, writable for
    the group and setgid (a scanner account in the group drops files into inbox/). Then
    the container starts again with other ids: it takes ocrd's own files along (the
    token was unreadable to the new user: a restart loop) and says what else to do."""
    project = _nas(tmp_path, owned=False)
    container, base = _start(built, project, (UID, GID))
    try:
        wait_for(lambda: http(base + "/healthz")[0] == 200, 120, "the console")
    finally:
        code, logs = _finish(built, container)
    assert code == "0", logs[-3000:]
    for name in ("inbox", "outbox", "failed", "archive"):
        st = (project / name).stat()
        assert (st.st_uid, st.st_gid) == (UID, GID), name
        assert stat.S_IMODE(st.st_mode) == 0o2775, (name, oct(st.st_mode))
    token = project / "config" / "web-token"
    assert (token.stat().st_uid, token.stat().st_gid) == (UID, GID)

    new = (UID + 100, GID + 100)
    container, base = _start(built, project, new)
    try:
        wait_for(lambda: http(base + "/healthz")[0] == 200, 120,
                 "the console after the PUID change")
        restarts = run(*PODMAN, "inspect", "--format", "{{.RestartCount}}", container,
                       env=built.env).stdout.strip()
    finally:
        code, logs = _finish(built, container)
    assert code == "0" and restarts == "0", logs[-3000:]
    assert (token.stat().st_uid, token.stat().st_gid) == new
    journal = project / "config" / "state" / "journal.sqlite3"
    assert (journal.stat().st_uid, journal.stat().st_gid) == new
    assert f"it was {UID}:{GID}" in logs, logs[-3000:]
    # the share's folders are the earlier user's: the start says what to run
    assert f"chown -R {new[0]}:{new[1]}" in logs, logs[-3000:]
    assert "Traceback" not in logs
