"""Every settings path the pipeline's operators read (`run_value("dotted.path")`) exists in the document
the first task hands them, for every profile an admin ships: a renamed run-spec field fails here, when
the DAG is changed, not in the middle of a run after the cluster was paid for."""

from __future__ import annotations

import ast
import itertools
import types
import uuid
from pathlib import Path

import pytest
from airflow.sdk import DAG
from taskcontext import FakeTI

import pcflow.checks
import pcflow.pipeline
from pcflow.metrics import price_list
from pcflow.paths import profile_names
from pcflow.pipeline import settings, sweep_params, training_params, validation
from pcflow.runspec import resolve_run_spec

PIPELINE_SOURCES = sorted(Path(pcflow.pipeline.__file__).parent.glob("*.py"))


def literal_run_value_paths() -> set[str]:
    """Every `run_value("...")` written in the pipeline's code, read from its syntax tree."""
    paths = set()
    for source in PIPELINE_SOURCES:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "run_value":
                (argument,) = node.args
                assert isinstance(argument, ast.Constant), f"{source.name}:{node.lineno}: run_value of a non-literal"
                paths.add(argument.value)
    return paths


@pytest.fixture(scope="module")
def declared_paths() -> set[str]:
    """The paths recorded while every variant of the pipeline is declared (each branch's reads)."""
    settings.RUN_VALUE_PATHS.clear()
    for number, (run_scoped, sweep, dated) in enumerate(itertools.product((True, False), repeat=3)):
        with DAG(f"variant_{number}", schedule=None, params=training_params(extra=sweep_params() if sweep else None)):
            pcflow.pipeline.build_training_pipeline(run_scoped=run_scoped, sweep=sweep, dated_partitions=dated)
    return set(settings.RUN_VALUE_PATHS)


def validated_document(profile: str) -> dict:
    """The validate task's own document for a sweep on `profile` (a sweep adds `trials`), priced on demand
    (a spot price asks EC2) on one node, within the profile's largest budget."""
    form = training_params(partition="default", extra=sweep_params())
    budget = resolve_run_spec(profile).budget.max_usd
    conf = {"profile": profile, "capacity_type": "ondemand", "nodes": 1, "budget_usd": budget}
    params = {**{name: param.value for name, param in form.items()}, **conf}
    ti = FakeTI(dag_id="pretrain_sweep", run_id=f"manual__{uuid.uuid4().hex}", task_id="validate")
    context = {"ti": ti, "dag_run": types.SimpleNamespace(run_type="manual"), "logical_date": None}
    return validation.validate_run.function(False, params=params, **context)


def test_the_code_and_the_declared_pipeline_read_the_same_paths(declared_paths):
    assert declared_paths == literal_run_value_paths()
    assert {"dataset.bucket", "training.program", "cost", "run_key"} <= declared_paths


@pytest.mark.parametrize("profile", profile_names())
def test_every_path_read_exists_in_the_validated_run_document(declared_paths, profile, monkeypatch, admin_profiles):
    # What only AWS can answer is asked of moto in tests/dags; here the document's shape is the point.
    for check in ("check_against_aws", "account_preflight", "check_cluster_settings"):
        monkeypatch.setattr(validation, check, lambda run: None)
    monkeypatch.setattr(price_list, "pricing_client", lambda *args, **kwargs: None)  # the table prices
    monkeypatch.setattr(pcflow.checks, "check_dataset_source", lambda run: None)  # S3, for an s3:// source
    if not resolve_run_spec(profile).network.get("ssh_ingress_cidrs"):  # aws-gpu: the admin's to set (deploy.md)
        profile = admin_profiles.make(profile, {"network": {"ssh_ingress_cidrs": ["203.0.113.0/24"]}})
    document = validated_document(profile)
    missing = []
    for path in sorted(declared_paths):
        node = document
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                missing.append(path)
                break
            node = node[key]
    assert not missing, f"{profile}: the pipeline reads {missing}, which the validated document lacks"
