"""Config: the reference and the example generated from the models, a config of inbox
folders only, every problem reported at once with the key and the value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ocrd.config import reference as configdoc
from ocrd.config.check import section_model
from ocrd.config.load import load_config, parse_config
from ocrd.config.settings import Config, ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _documented_keys(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Every key of the configuration that users set (inboxes' as `inboxes[].key`), and
    every key only ocrd's tests use, apart."""
    out = {}
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        out[key] = info
        section = section_model(info.annotation)
        if section is not None:
            out |= _documented_keys(section, key + ("[]." if name == "inboxes" else "."))
    return out


def test_generated_config_files_are_what_the_model_says() -> None:
    """docs/configuration.md and config.example.yaml are generated from the models'
    descriptions (ocrd/config/reference.py): an edit to either side alone fails here."""
    for rel, text in configdoc.generated().items():
        assert (ROOT / rel).read_text(encoding="utf-8") == text, \
            f"{rel} differs from what the configuration's models say: run " \
            "`python -m ocrd.config.reference` and commit the result"


def test_every_key_has_its_text_in_the_reference_and_no_key_is_a_test_hook() -> None:
    """Every key a user can set is documented, and none exists for ocrd's own tests:
    those name their engines by class path (tests/simulated_engines.py)."""
    reference = (ROOT / "docs" / "configuration.md").read_text()
    example = (ROOT / "config.example.yaml").read_text()
    keys = _documented_keys(Config)
    assert not [k for k in keys if "simulated" in k or "testing" in k or "fault" in k]
    for key, info in keys.items():
        if section_model(info.annotation) is None:
            assert info.description and len(info.description) > 10, f"{key} has no text"
            assert f"### `{key}`" in reference, f"{key} is not in the reference"
    for text in (reference, example):
        assert "simulated" not in text and "testing_faults" not in text
        assert "OCRD_TEST" not in text and "round " not in text.lower()
        assert not re.search(r"\bissue \d|H200|GPU_RESULTS", text)


def test_the_example_is_short_valid_and_matches_the_tmpfiles_folders() -> None:
    text = (ROOT / "config.example.yaml").read_text()
    assert len(text.splitlines()) <= 60
    data = yaml.safe_load(text)
    assert next(iter(data)) == "inboxes", "the inboxes come first: they are what one edits"
    cfg = parse_config(data, Path("/etc/ocrd"))
    assert cfg.state_dir == Path("/var/lib/ocrd")
    # the keys shown commented out are right too
    uncommented = re.sub(r"^(\s*)# (\w+: \S+)$", r"\1\2", text, flags=re.M)
    assert uncommented != text
    parse_config(yaml.safe_load(uncommented), Path("/etc/ocrd"))
    # the folders and modes systemd/ocrd.tmpfiles makes for the service
    made = {Path(line.split()[1]): line.split()[2]
            for line in (ROOT / "systemd" / "ocrd.tmpfiles").read_text().splitlines()
            if line.startswith("d /srv/")}
    (box,) = cfg.inboxes
    for folder in [box.path, *box.destinations().values()]:
        assert made.get(folder) == box.dir_mode, (folder, made)
    assert box.file_mode_bits == box.dir_mode_bits & 0o666


def test_a_config_of_inbox_folders_only_works(tmp_path: Path) -> None:
    """state_dir defaults to `state` beside the file (/var/lib/ocrd for one under /etc);
    originals stay in the inbox unless an archive folder is named."""
    path = tmp_path / "config.yaml"
    path.write_text("inboxes:\n  - {path: in, outbox: out, failed: failed}\n")
    cfg = load_config(path)
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.inboxes[0].on_success == "keep" and cfg.inboxes[0].archive is None
    path.write_text("inboxes:\n  - {path: in, outbox: out, failed: failed, archive: a}\n")
    box = load_config(path).inboxes[0]
    assert box.on_success == "archive" and box.archive == tmp_path / "a"
    etc = parse_config({"inboxes": [{"path": "/srv/in", "outbox": "/srv/out",
                                     "failed": "/srv/failed"}]}, Path("/etc/ocrd"))
    assert etc.state_dir == Path("/var/lib/ocrd")
    assert parse_config({}, tmp_path).state_dir == tmp_path / "state"


@pytest.mark.e2e
def test_check_config_reports_every_problem_at_once_one_line_each(tmp_path: Path) -> None:
    """Mistakes that pydantic, a section's own checks, the layout and the folders find
    (each stage used to stop at its first): all of them in one run, one line each,
    every key in one notation."""
    import subprocess
    import sys

    for folder in ("in", "failed", "out2", "failed2"):  # the folders are there
        (tmp_path / folder).mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
inboxes:
  - path: {tmp_path}/in
    outbox: {tmp_path}/in
    failed: {tmp_path}/failed
    on_success: archive
    file_mode: "0999"
    quiet_secnds: 3
  - path: {tmp_path}/nowhere
    outbox: {tmp_path}/out2
    failed: {tmp_path}/failed2
  - path: {tmp_path}/other
    failed: {tmp_path}/failed3
engine: {{kind: gpu}}
web: {{listen: "0.0.0.0:9465"}}
""")
    res = subprocess.run([sys.executable, "-m", "ocrd", "check-config", "-c", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    expected = [
        "engine.kind = 'gpu': not an engine: one of auto, tesseract, remote, vllm, or an "
        "engine's class path `package.module:Class`",
        "web.listen = '0.0.0.0:9465': not a loopback address",
        "inboxes[0].file_mode = '0999': must be an octal mode",
        "inboxes[0].quiet_secnds: unknown key (value 3); did you mean 'quiet_seconds'?",
        "inboxes[0].on_success = 'archive': no 'archive' folder is set",
        "inboxes[2].outbox: missing (where the Markdown goes)",
        f"inboxes[0].outbox '{tmp_path}/in' overlaps its inbox",
        f"inboxes[1].path = '{tmp_path}/nowhere': folder does not exist",
    ]
    assert len(lines) == len(expected), res.stderr
    for want in expected:
        assert sum(line.startswith("ocrd: " + want) for line in lines) == 1, (want, lines)


def _base(tmp_path: Path, **inbox: object) -> dict:
    box = {"path": str(tmp_path / "in"), "outbox": str(tmp_path / "out"),
           "failed": str(tmp_path / "failed"), "on_success": "delete", **inbox}
    return {"state_dir": str(tmp_path / "s"), "inboxes": [box]}


def test_unknown_key_is_named_with_its_value(tmp_path: Path) -> None:
    data = _base(tmp_path, recursve=True)
    with pytest.raises(ConfigError, match=r"inboxes\[0\]\.recursve: unknown key \(value "
                       r"True\); did you mean 'recursive'\?"):
        parse_config(data, tmp_path)


def test_bad_value_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"inboxes\[0\]\.file_mode = '0999'"):
        parse_config(_base(tmp_path, file_mode="0999"), tmp_path)
    with pytest.raises(ConfigError, match="no 'archive' folder"):
        parse_config(_base(tmp_path, on_success="archive"), tmp_path)


def test_output_inside_inbox_is_refused(tmp_path: Path) -> None:
    data = _base(tmp_path)
    data["inboxes"][0]["outbox"] = str(tmp_path / "in")
    with pytest.raises(ConfigError, match=r"inboxes\[0\]\.outbox .* overlaps its inbox"):
        parse_config(data, tmp_path)
    data = _base(tmp_path, recursive=True)
    data["inboxes"][0]["failed"] = str(tmp_path / "in" / "failed")
    with pytest.raises(ConfigError, match="outputs would be read back"):
        parse_config(data, tmp_path)


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    cfg_file = tmp_path / "etc" / "c.yaml"
    cfg_file.parent.mkdir()
    cfg_file.write_text("state_dir: st\ninboxes:\n - {path: in, outbox: out, failed: f, "
                        "on_success: keep}\n")
    cfg = load_config(cfg_file)
    assert cfg.state_dir == tmp_path / "etc" / "st"
    assert cfg.inboxes[0].path == tmp_path / "etc" / "in"


def test_remote_needs_urls(tmp_path: Path) -> None:
    data = _base(tmp_path)
    data["engine"] = {"kind": "remote"}
    with pytest.raises(ConfigError, match="urls"):
        parse_config(data, tmp_path)


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("state_dir: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_a_tab_in_the_yaml_is_named_in_one_line_with_the_file_and_where(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("inboxes:\n\t- path: /srv/in\n")
    with pytest.raises(ConfigError) as caught:
        load_config(bad)
    (problem,) = caught.value.problems
    assert problem == (f"config file {str(bad)!r} is not valid YAML: line 2, column 1: a tab, "
                       "which YAML does not take for indenting: use spaces"), problem
    assert "\n" not in problem and "<unicode string>" not in problem


def test_an_unknown_key_gets_a_did_you_mean_from_another_section(tmp_path: Path) -> None:
    data = _base(tmp_path)
    data["engine"] = {"languages": "eng+deu"}
    data["outbox"] = "/srv/out"
    data["inboxes"][0]["lang"] = "eng"
    data["inboxes"][0]["recursiv"] = True
    from ocrd.config.check import check

    problems = check(data, tmp_path).problems
    assert "engine.languages: unknown key (value 'eng+deu'); did you mean " \
           "'engine.tesseract.lang'?" in problems, problems
    assert "outbox: unknown key (value '/srv/out'); did you mean 'inboxes[].outbox'?" \
        in problems, problems
    assert "inboxes[0].lang: unknown key (value 'eng'); did you mean " \
           "'engine.tesseract.lang'?" in problems, problems
    # the key's own section first
    assert "inboxes[0].recursiv: unknown key (value True); did you mean 'recursive'?" \
        in problems, problems
    data = _base(tmp_path)
    data["zzzqqq"] = 1
    assert "zzzqqq: unknown key (value 1); check its spelling" in \
        check(data, tmp_path).problems


# -- layouts that destroy state or loop, compared after resolving links (issue 15.6) --


def _layout(tmp_path: Path, state: Path, *boxes: dict) -> list[str]:
    """The problems of a configuration with these folders (each key and value is right
    on its own: only the layout's checks can find anything)."""
    from ocrd.config.check import check

    return check({"state_dir": str(state), "inboxes": list(boxes)}, tmp_path).problems


def _box(tmp_path: Path, name: str, **kw: object) -> dict:
    base = tmp_path / name
    return {"path": str(base / "in"), "outbox": str(base / "out"),
            "failed": str(base / "failed"), "on_success": "delete", **kw}


def test_layout_state_dir_inside_or_equal_to_an_inbox_is_refused(tmp_path: Path) -> None:
    box = _box(tmp_path, "a", recursive=True)
    inside = _layout(tmp_path, tmp_path / "a" / "in" / "state", box)
    assert len(inside) == 1 and "claim its own journal" in inside[0], inside
    flat = _box(tmp_path, "b")
    equal = _layout(tmp_path, tmp_path / "b" / "in", flat)
    assert len(equal) == 1 and "state_dir" in equal[0], equal
    assert _layout(tmp_path, tmp_path / "state", box) == []


def test_layout_an_inbox_that_is_a_link_to_its_own_destinations_is_refused(
        tmp_path: Path) -> None:
    """inbox -> a folder that holds the outbox and failed/: the old checks compared the
    unresolved paths and passed it; then outputs were read back forever."""
    real = tmp_path / "real"
    (real / "out").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    box = {"path": str(tmp_path / "link"), "outbox": str(real / "out"),
           "failed": str(real / "failed"), "on_success": "delete", "recursive": True}
    problems = _layout(tmp_path, tmp_path / "state", box)
    assert len(problems) == 2, problems
    assert all("links resolved" in p and "read back" in p for p in problems)


def test_layout_one_inboxs_outbox_inside_another_recursive_inbox_is_refused(
        tmp_path: Path) -> None:
    a = _box(tmp_path, "a", recursive=True)
    b = _box(tmp_path, "b", outbox=str(tmp_path / "a" / "in" / "from-b"))
    problems = _layout(tmp_path, tmp_path / "state", a, b)
    assert len(problems) == 1 and "inboxes[1].outbox" in problems[0] and \
        "inboxes[0].path" in problems[0], problems


def test_layout_nested_and_duplicate_inboxes_are_refused(tmp_path: Path) -> None:
    a = _box(tmp_path, "a", recursive=True)
    nested = _box(tmp_path, "n")
    nested["path"] = str(tmp_path / "a" / "in" / "sub")
    problems = _layout(tmp_path, tmp_path / "state", a, nested)
    assert len(problems) == 1 and "both would claim" in problems[0], problems
    (tmp_path / "x").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "x")
    one = _box(tmp_path, "p", path=str(tmp_path / "x"))
    two = _box(tmp_path, "q", path=str(tmp_path / "alias"))
    problems = _layout(tmp_path, tmp_path / "state", one, two)
    assert len(problems) == 1 and "same folder" in problems[0], problems


@pytest.mark.e2e
def test_check_config_prints_one_line_per_overlap(tmp_path: Path) -> None:
    import subprocess
    import sys

    box = _box(tmp_path, "a", recursive=True)
    for folder in ("in", "out", "failed"):
        (tmp_path / "a" / folder).mkdir(parents=True)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "a" / "in" / ".state"),
                                   "inboxes": [box]}))
    res = subprocess.run([sys.executable, "-m", "ocrd", "check-config", "-c", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    lines = [x for x in res.stderr.splitlines() if x.startswith("ocrd: ")]
    assert len(lines) == 1 and "state_dir" in lines[0], res.stderr
    run = subprocess.run([sys.executable, "-m", "ocrd", "run", "-c", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "state_dir" in run.stderr, run.stderr
