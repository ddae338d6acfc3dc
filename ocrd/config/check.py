"""Every problem of a configuration at once, one line each, keys named as
`inboxes[0].outbox`: what pydantic refuses is put in the user's words, left out, and the
rest checked again, so that the checks behind a problem run too."""

from __future__ import annotations

import copy
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from ocrd.config.engine import moved_keys
from ocrd.config.settings import Config, ConfigError, InboxConfig

# Each pass leaves out at least one wrong value; a file has far fewer.
MAX_PASSES = 100

Loc = tuple[str | int, ...]


@dataclass
class Checked:
    """A configuration's problems, and the configuration without what is wrong in it
    (None when nothing usable is left). `numbers`: each usable inbox's place in the
    file's list, for messages about it; `listed`: the inboxes the file lists."""

    config: Config | None
    problems: list[str] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    listed: int = 0
    # keys still read from an old place, one line each (not problems: the file works)
    notes: list[str] = field(default_factory=list)

    def config_or_raise(self) -> Config:
        if self.problems or self.config is None:
            raise ConfigError(*(self.problems or ["the configuration cannot be used"]))
        return self.config


def key_path(loc: Loc) -> str:
    """('inboxes', 0, 'outbox') → 'inboxes[0].outbox'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def check(data: Any, base: Path) -> Checked:
    """Every problem of the configuration `data` (a YAML document's value), paths
    relative to `base`."""
    from ocrd.config.folders import layout_problems

    if data is None:
        data = {}
    if not isinstance(data, dict):
        return Checked(None, ["the configuration must be a YAML mapping of keys to values"])
    top = dict(data)
    top["engine"], notes = moved_keys(top.get("engine"))
    if top["engine"] is None:
        del top["engine"]
    raw_boxes = top.pop("inboxes", None) or []
    problems: list[str] = []
    if not isinstance(raw_boxes, list):
        problems.append("inboxes: must be a list of inboxes, each starting with '- path:'")
        raw_boxes = []
    config, found = _usable(Config, top, ())
    problems += found
    boxes: list[InboxConfig] = []
    numbers: list[int] = []
    for i, raw in enumerate(raw_boxes):
        if not isinstance(raw, dict):
            problems.append(f"inboxes[{i}]: must be a mapping of keys to values "
                            "(path:, outbox:, failed:)")
            continue
        box, found = _usable(InboxConfig, raw, ("inboxes", i))
        problems += found
        if box is not None:
            boxes.append(box)
            numbers.append(i)
    if config is None:
        return Checked(None, _unique(problems), listed=len(raw_boxes), notes=notes)
    assert isinstance(config, Config)
    config = config.model_copy(update={"inboxes": boxes}).resolve(base)
    problems += layout_problems(config, numbers)
    return Checked(config, _unique(problems), numbers, len(raw_boxes), notes)


def _unique(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def _usable(model: type[BaseModel], data: dict, prefix: Loc) -> tuple[BaseModel | None,
                                                                      list[str]]:
    """`model` validated from `data` with every wrong value left out, and the problems
    met on the way; None when a problem cannot be left out (a required key)."""
    data = copy.deepcopy(data)
    problems: list[str] = []
    for _ in range(MAX_PASSES):
        try:
            return model.model_validate(data), problems
        except ValidationError as e:
            left_out = False
            for err in e.errors():
                loc = _where(err)
                problems.append(describe(model, err, loc, prefix, _value_at(data, loc)))
                left_out |= _leave_out(data, loc, err.get("type") == "missing")
            problems = _unique(problems)
            if not left_out:
                return None, problems
    return None, problems


def _where(err: Any) -> Loc:
    """The key a pydantic error is about: its location, or for a section's own check
    (configcheck's key_problem) the key it names."""
    loc = tuple(err.get("loc", ()))
    if err.get("type") == "ocrd_key":
        loc = (*loc, err["ctx"]["key"])
    return loc


def _leave_out(data: Any, loc: Loc, missing: bool) -> bool:
    """Remove the value at `loc` (of a list item: the whole list; else, if there is no
    such value, the nearest section holding it) so that it takes its default. False if
    there is nothing to remove, as for a `missing` key."""
    if loc and isinstance(loc[-1], int):
        loc = loc[:-1]
    while loc:
        parent = _value_at(data, loc[:-1])
        if isinstance(parent, dict) and loc[-1] in parent:
            del parent[loc[-1]]
            return True
        if missing:
            return False
        loc = loc[:-1]
    return False


_MISSING = object()


def _value_at(data: Any, loc: Loc) -> Any:
    for part in loc:
        found = (isinstance(data, dict) and part in data) or (
            isinstance(data, list) and isinstance(part, int) and part < len(data))
        if not found:
            return _MISSING
        data = data[part]
    return data


def describe_error(model: type[BaseModel], err: Any, prefix: Loc = ()) -> str:
    """One error of validating `model` (whose keys sit at `prefix`) on its own, in the
    words check() uses."""
    loc = _where(err)
    value = err.get("input", _MISSING)
    if err.get("type") == "ocrd_key":
        value = value.get(loc[-1], _MISSING) if isinstance(value, dict) else _MISSING
    return describe(model, err, loc, prefix, value)


def describe(model: type[BaseModel], err: Any, loc: Loc, prefix: Loc, value: Any) -> str:
    """One pydantic error as a line that names the key (`prefix` + `loc`, in the
    model) and its value (_MISSING: none to show)."""
    key = key_path((*prefix, *loc))
    kind = err.get("type")
    if kind == "extra_forbidden":
        return f"{key}: unknown key (value {value!r}){_did_you_mean(model, loc)}"
    if kind == "missing":
        info = field_at(model, loc)
        what = f" ({_first_sentence(info.description)})" if info and info.description else ""
        return f"{key}: missing{what}"
    if kind == "ocrd_key":
        message = err["ctx"]["message"]
    elif kind == "literal_error":
        message = "must be one of " + ", ".join(choices(model, loc))
    else:
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if value is _MISSING or isinstance(value, dict):
        return f"{key}: {message}"
    return f"{key} = {value!r}: {message}"


def _did_you_mean(model: type[BaseModel], loc: Loc) -> str:
    """A key of the same section close to the unknown one; else one anywhere in the
    configuration (`engine.languages` → `engine.tesseract.lang`), by its full path."""
    section = model_at(model, loc[:-1])
    if section is None or not isinstance(loc[-1], str):
        return ""
    names = list(section.model_fields)
    close = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    elsewhere = dict(all_keys(Config))
    by_leaf = difflib.get_close_matches(loc[-1], list(set(elsewhere.values())), n=1,
                                        cutoff=0.6)
    if by_leaf:
        paths = sorted(p for p, leaf in elsewhere.items() if leaf == by_leaf[0])
        return f"; did you mean {' or '.join(repr(p) for p in paths[:2])}?"
    return "; check its spelling"


def all_keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str]]:
    """(full path, key) of every key a person may set in `model`, sections included:
    `engine.tesseract.lang`, `inboxes[].outbox`."""
    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        out.append((path, name))
        sub = section_model(info.annotation)
        if sub is not None:
            listed = typing.get_origin(info.annotation) is list
            out += all_keys(sub, path + ("[]" if listed else ""))
    return out


def _first_sentence(text: str) -> str:
    """'Where the Markdown goes: NAME.md, … . More.' → 'where the Markdown goes'."""
    head = text.partition(". ")[0].partition(": ")[0].rstrip(".")
    return head[:1].lower() + head[1:] if head[1:2].islower() else head


def choices(model: type[BaseModel], loc: Loc) -> list[str]:
    """The values a Literal key takes."""
    info = field_at(model, tuple(p for p in loc if not isinstance(p, int)))
    return [] if info is None else [str(c) for c in literal_choices(info.annotation)]


def literal_choices(annotation: Any) -> list[Any]:
    """The values of a Literal, also inside Optional[...] or list[...]."""
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    for arg in typing.get_args(annotation):
        found = literal_choices(arg)
        if found:
            return found
    return []


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The model of a section-valued annotation (X, X | None, list[X])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = section_model(arg)
            if found is not None:
                return found
    return None


def model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        if current is None or part not in current.model_fields:
            return None
        current = section_model(current.model_fields[part].annotation)
    return current


def field_at(model: type[BaseModel], loc: Loc) -> FieldInfo | None:
    names = [p for p in loc if isinstance(p, str)]
    if not names:
        return None
    section = model_at(model, tuple(names[:-1]))
    return section.model_fields.get(names[-1]) if section is not None else None
