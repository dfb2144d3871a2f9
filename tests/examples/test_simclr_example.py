"""examples/simclr, the profiles' payload as a user project: its hparams.schema.json says what its hparams.py
checks (every name, type, default and bound), so a check of the schema before a run (pcflow's first task)
refuses exactly what train.py would refuse after the cluster is up. (Trained for real: tests/payloads/.)"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import types
from pathlib import Path
from typing import Any

import jsonschema
import pytest

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "simclr"
#: The JSON type each annotation of hparams.Hparams is (fail_at_epoch: an epoch or none).
JSON_TYPES = {
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "str": "string",
    "int | None": ["integer", "null"],
}
#: Values that no bound lets through unless the schema says so: a bound of hparams.py missing from the
#: schema (or one the schema has and hparams.py lacks) shows on one of them.
PROBES = (-1e9, -1, 0, 1e-9, 0.5, 1, 2, 3, 4, 224, 225, 1024, 1025, 4096, 4097, 1e9, 10**9)
#: Values of other types than a field's: refused by both (bool is not an integer in either).
WRONG_TYPES = (True, "1", None, [], {})


def load_hparams() -> types.ModuleType:
    """examples/simclr/hparams.py by path (resnet's has the same module name)."""
    spec = importlib.util.spec_from_file_location("simclr_example_hparams", PROJECT / "hparams.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass's string annotations are resolved in its module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hparams() -> types.ModuleType:
    return load_hparams()


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    document = json.loads((PROJECT / "hparams.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(document)
    return document


def test_the_schema_names_every_hyperparameter_with_its_type_and_default(hparams, schema):
    fields = {field.name: field for field in hparams.dataclasses.fields(hparams.Hparams)}
    assert schema["additionalProperties"] is False and schema["required"] == ["data_dir"]
    assert set(schema["properties"]) == set(fields)
    for name, field in fields.items():
        rule = schema["properties"][name]
        assert rule["type"] == JSON_TYPES[str(field.type)], name
        assert name == "data_dir" or rule["default"] == field.default, name
    assert hparams.Hparams.from_dict({"data_dir": "/d", **defaults(schema)}) == hparams.Hparams(data_dir="/d")


def defaults(schema: dict[str, Any]) -> dict[str, Any]:
    return {name: rule["default"] for name, rule in schema["properties"].items() if "default" in rule}


def candidates(rule: dict[str, Any]) -> list[Any]:
    """Values to try on one field: its bounds and either side of them, the probes, other types."""
    step = 1 if rule["type"] == "integer" else 1e-6
    values: list[Any] = [rule.get("default"), *PROBES, *WRONG_TYPES]
    for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if bound in rule:
            values += [rule[bound] - step, rule[bound], rule[bound] + step]
    if "integer" in rule["type"]:  # 2.0: JSON Schema's integer, not hparams.py's (nor a value JSON users send)
        values = [v for v in values if not (isinstance(v, float) and math.isfinite(v) and v.is_integer())]
    return values


def accepted(hparams: types.ModuleType, values: dict[str, Any]) -> bool:
    try:
        hparams.Hparams.from_dict(values)
    except hparams.HparamError:
        return False
    return True


def test_the_schema_accepts_and_refuses_each_value_as_hparams_py_does(hparams, schema):
    """Each field alone, the others valid (epochs high and warm-up 0: their one joint rule stays out of it)."""
    validator = jsonschema.Draft202012Validator(schema)
    base = {"data_dir": "/d", "epochs": 10**12, "warmup_epochs": 0}
    disagree = []
    for name, rule in schema["properties"].items():
        values = candidates(rule) + (["", "/data"] if name == "data_dir" else [])
        for value in values:
            document = {**base, name: value}
            if validator.is_valid(document) != accepted(hparams, document):
                disagree.append(f"{name}={value!r}: schema {validator.is_valid(document)}")
    assert disagree == []
    assert not validator.is_valid({"data_dir": "/d", "temprature": 0.1}), "a misspelt name is refused"
    assert not accepted(hparams, {"data_dir": "/d", "temprature": 0.1})
    assert not validator.is_valid({}) and not accepted(hparams, {})


def test_the_hyperparameters_each_profile_sends_pass_the_schema(schema):
    """What the shipped profiles and pcflow-runs.json send (with pcflow's data_dir) is valid for train.py."""
    from pcflow.runspec import resolve_run_spec

    validator = jsonschema.Draft202012Validator(schema)
    runs = json.loads((PROJECT / "pcflow-runs.json").read_text())
    for profile in ("local", "aws-gpu", "aws-gpu-rehearsal"):
        sent = resolve_run_spec(profile).training.hyperparameters
        assert list(validator.iter_errors({**sent, "data_dir": "/shared/x"})) == [], profile
    for profile, run in runs.items():
        sent = {**run["training"]["hyperparameters"], "data_dir": "/shared/x"}
        assert list(validator.iter_errors(sent)) == [], profile
