"""A project's hyperparameter schema file (`hparams.schema.json`, or `training.hparams_schema`) as the
trigger form shows it: where it is, its bytes read from a local tree (bounded, never through a link out of
the tree), and its properties in one line. The form reads it when a DAG file is parsed, so this module stays
small: the check of a run's hyperparameters against the schema (jsonschema, RE2, the code's sources) is
`pcflow.code.hparams`, loaded when a run starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pcflow.errors import ConfigurationError
from pcflow.paths import payload_roots, roots_holding, within

SCHEMA_FILE = "hparams.schema.json"
MAX_SCHEMA_BYTES = 256 << 10
#: Names the trigger form lists at most.
SHOWN = 40


class SchemaRefused(ConfigurationError):
    """The code's hyperparameter schema cannot be used as it is: the project's author fixes the file."""


def read_local(directory: Path, path: str) -> bytes | None:
    """`directory/path`, bounded, or None when there is no such file; one that leaves the directory (a link
    out of it) or is over the cap is refused (SchemaRefused)."""
    try:
        target = within(directory / path, directory)
    except ValueError as exc:
        raise SchemaRefused(f"{path}: {exc}") from None
    if not target.is_file():
        return None
    if target.stat().st_size > MAX_SCHEMA_BYTES:
        raise SchemaRefused(f"{path} is {target.stat().st_size} bytes, over the cap of {MAX_SCHEMA_BYTES}")
    with target.open("rb") as handle:
        return handle.read(MAX_SCHEMA_BYTES + 1)


def schema_path(hparams_schema: str | None) -> str:
    """Where the schema is in the code: `training.hparams_schema` (given here), else SCHEMA_FILE."""
    return hparams_schema or SCHEMA_FILE


def local_summary(training: dict[str, Any]) -> str | None:
    """The schema of a profile's code as the trigger form lists it (`summary`), where the code is on this
    machine (a directory, the admin's payload), read when the DAG file is parsed: no network, no S3. None
    for a git or S3 code (read when a run starts) or a code without one; a note for one it cannot read."""
    code, path = training.get("code") or {}, schema_path(training.get("hparams_schema"))
    if code.get("dir"):
        directory = Path(code["dir"])
    elif not code and isinstance(training.get("payload"), str):
        # the first root that has it (paths.payload_source refuses a name in two when a run starts)
        found = roots_holding(training["payload"])
        directory = (found[0] if found else payload_roots()[0]) / training["payload"]  # absent: no schema
    else:
        return None
    try:
        data = read_local(directory, path) if directory.is_dir() else None
        schema = json.loads(data) if data is not None else None
    except (SchemaRefused, ValueError, OSError) as exc:
        return f"its {path} cannot be read ({exc}); the first task refuses the run until it is fixed"
    return summary(schema) if isinstance(schema, dict) else None


def summary(schema: dict[str, Any]) -> str:
    """The schema's hyperparameters in one line for the trigger form: name (type, bounds or choices)."""
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    shown = [f"{name} ({_rule(rule)})" for name, rule in list(properties.items())[:SHOWN] if isinstance(rule, dict)]
    more = f"; and {len(properties) - SHOWN} more" if len(properties) > SHOWN else ""
    closed = "; no other names" if schema.get("additionalProperties") is False else ""
    return "; ".join(shown) + more + closed


def _rule(rule: dict[str, Any]) -> str:
    """One property's type and bounds, as the form lists it."""
    parts = [str(rule.get("type", "any"))]
    if "enum" in rule:
        parts.append("one of " + ", ".join(json.dumps(value) for value in rule["enum"]))
    low = rule.get("minimum", rule.get("exclusiveMinimum"))
    high = rule.get("maximum", rule.get("exclusiveMaximum"))
    if low is not None or high is not None:
        left = "(" if "exclusiveMinimum" in rule else "["
        right = ")" if "exclusiveMaximum" in rule else "]"
        parts.append(f"{left}{'' if low is None else low}, {'' if high is None else high}{right}")
    if "default" in rule:
        parts.append(f"default {json.dumps(rule['default'])}")
    return ", ".join(parts)
