"""Hyperparameters: the JSON file at $PCFLOW_HPARAMS, checked against hparams.schema.json, defaults filled in.

The schema is the one list of names, types, bounds and defaults (pcflow can read the same file to refuse
a bad value before a run spends anything); this module checks the part of JSON Schema that file uses:
`type`, `enum`, `minimum`, `maximum`, `exclusiveMinimum`, `minLength`, `required`, `additionalProperties`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("hparams.schema.json")
TYPES = {"integer": int, "number": (int, float), "boolean": bool, "string": str}


class HparamError(ValueError):
    """The hyperparameters cannot be used; the message names the value and what is allowed."""


def load_schema() -> dict[str, Any]:
    """The schema file beside this module: the one place names, bounds and defaults are written."""
    return json.loads(SCHEMA_FILE.read_text())


def problems(values: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """One line per value the schema refuses (empty: all good)."""
    known = schema["properties"]
    found = [f"{name}: required" for name in schema.get("required", []) if name not in values]
    if schema.get("additionalProperties") is False:
        unknown = sorted(set(values) - set(known))
        if unknown:
            found.append(f"unknown hyperparameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    for name, value in values.items():
        if name in known:
            found += [f"{name}: {line}" for line in value_problems(value, known[name])]
    return found


def value_problems(value: Any, rule: dict[str, Any]) -> list[str]:
    """What one rule refuses of one value (a bool is not an integer here, though Python says it is)."""
    kind = rule.get("type")
    is_bool = isinstance(value, bool)
    if kind and (not isinstance(value, TYPES[kind]) or (is_bool and kind != "boolean")):
        return [f"must be {kind}, got {value!r}"]
    found = []
    if "enum" in rule and value not in rule["enum"]:
        found.append(f"must be one of {rule['enum']}, got {value!r}")
    if "minimum" in rule and value < rule["minimum"]:
        found.append(f"must be >= {rule['minimum']}, got {value!r}")
    if "maximum" in rule and value > rule["maximum"]:
        found.append(f"must be <= {rule['maximum']}, got {value!r}")
    if "exclusiveMinimum" in rule and value <= rule["exclusiveMinimum"]:
        found.append(f"must be > {rule['exclusiveMinimum']}, got {value!r}")
    if "minLength" in rule and len(value) < rule["minLength"]:
        found.append(f"must not be empty, got {value!r}")
    return found


def from_dict(values: dict[str, Any]) -> SimpleNamespace:
    """The defaults with `values` laid over them; raises HparamError naming every bad value."""
    schema = load_schema()
    if lines := problems(values, schema):
        raise HparamError("bad hyperparameters:\n  " + "\n  ".join(lines))
    defaults = {name: rule.get("default") for name, rule in schema["properties"].items()}
    merged = {**defaults, **values}
    for name, rule in schema["properties"].items():
        if rule.get("type") == "number":
            merged[name] = float(merged[name])
    if merged["warmup_epochs"] > merged["epochs"]:
        raise HparamError(f"warmup_epochs ({merged['warmup_epochs']}) must not exceed epochs ({merged['epochs']})")
    return SimpleNamespace(**merged)


def from_env() -> SimpleNamespace:
    """The hyperparameters pcflow wrote for this job; HparamError when the file is missing or not an object."""
    path = os.environ.get("PCFLOW_HPARAMS")
    if not path:
        raise HparamError("PCFLOW_HPARAMS is not set: it must name the JSON file of hyperparameters")
    try:
        values = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HparamError(f"cannot read hyperparameters from {path}: {exc}") from exc
    if not isinstance(values, dict):
        raise HparamError(f"{path} must hold a JSON object, got {type(values).__name__}")
    return from_dict(values)
