"""Config: every key documented in config.example.yaml, errors that name key and value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from ocrd.config import Config, ConfigError, InboxConfig, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent


def _keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        out.add(prefix + name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _keys(ann, prefix + name + ".")
    return out


def _yaml_keys(data: object, prefix: str = "") -> set[str]:
    out = set()
    if isinstance(data, dict):
        for k, v in data.items():
            out.add(prefix + k)
            if isinstance(v, dict) and k != "engine_args":
                out |= _yaml_keys(v, prefix + k + ".")
            if k == "inboxes" and isinstance(v, list):
                for item in v:
                    out |= _yaml_keys(item, "inboxes[].")
    return out


def test_example_config_is_valid_and_documents_every_key() -> None:
    data = yaml.safe_load((ROOT / "config.example.yaml").read_text())
    parse_config(data, ROOT)
    documented = _yaml_keys(data)
    expected = _keys(Config) - {"inboxes"} | {"inboxes"} | {
        "inboxes[]." + k for k in _keys(InboxConfig)}
    missing = expected - documented
    assert not missing, f"config.example.yaml lacks: {sorted(missing)}"


def _base(tmp_path: Path, **inbox: object) -> dict:
    box = {"path": str(tmp_path / "in"), "outbox": str(tmp_path / "out"),
           "failed": str(tmp_path / "failed"), "on_success": "delete", **inbox}
    return {"state_dir": str(tmp_path / "s"), "inboxes": [box]}


def test_unknown_key_is_named_with_its_value(tmp_path: Path) -> None:
    data = _base(tmp_path, recursve=True)
    with pytest.raises(ConfigError, match=r"inboxes\[0\]\.recursve: unknown key \(value True\); did you "
                       r"mean 'recursive'\?"):
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


# -- layouts that destroy state or loop, compared after resolving links (issue 15.6) --


def _layout(tmp_path: Path, state: Path, *boxes: dict) -> list[str]:
    """The problems of a configuration with these folders (each key and value is right
    on its own: only the layout's checks can find anything)."""
    from ocrd.configcheck import check

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


def test_check_config_prints_one_line_per_overlap(tmp_path: Path) -> None:
    import subprocess
    import sys

    box = _box(tmp_path, "a", recursive=True)
    (tmp_path / "a" / "in").mkdir(parents=True)
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
