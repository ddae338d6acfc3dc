"""The sidecar and the error file's JSON Schemas (schemas/) as validators, with RFC 3339
date-times checked: `valid(SIDECAR, doc)` fails with every problem found."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jsonschema
from referencing import Registry, Resource

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
FORMATS = jsonschema.FormatChecker(formats=())


@FORMATS.checks("date-time", raises=ValueError)
def _iso_utc(value: object) -> bool:
    """RFC 3339 as Python reads it; jsonschema's own check needs an extra package and is
    skipped silently without it."""
    return not isinstance(value, str) or datetime.fromisoformat(value).tzinfo is not None


def validator(name: str) -> jsonschema.protocols.Validator:
    schemas = {p.name: json.loads(p.read_text()) for p in SCHEMAS.glob("*.schema.json")}
    registry = Registry().with_resources(
        (s["$id"], Resource.from_contents(s)) for s in schemas.values())
    schema = schemas[name]
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, registry=registry, format_checker=FORMATS)


SIDECAR = validator("sidecar.schema.json")
ERROR = validator("error.schema.json")


def valid(v: jsonschema.protocols.Validator, doc: dict) -> None:
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in v.iter_errors(doc)]
    assert not problems, problems
