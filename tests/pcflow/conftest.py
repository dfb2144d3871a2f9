"""The trust boundary's test plumbing: the first task (`validate`) run on its own, offline, with the
params Airflow hands it (the form's defaults with the run's conf laid over them)."""

from __future__ import annotations

import types
import uuid
from typing import Any

import pytest
from run_factories import make_planned_run, make_resolved_run
from taskcontext import FakeTI


def form_params(conf: dict[str, Any], *, sweep: bool = False) -> dict[str, Any]:
    """What the validate task receives as `params`: every form field's default, then the conf."""
    from pcflow.pipeline import sweep_params, training_params

    form = training_params(partition="default", extra=sweep_params() if sweep else None)
    return {**{name: param.value for name, param in form.items()}, **conf}


def validate(conf: dict[str, Any], *, sweep: bool = False, dated: bool = False, logical_date=None) -> dict[str, Any]:
    """The validate task's own function, with every check it runs except those that ask AWS."""
    from pcflow.pipeline import validate_run

    ti = FakeTI(dag_id="pretrain", run_id=f"manual__{uuid.uuid4().hex}", task_id="validate")
    run_type = "scheduled" if logical_date else "manual"
    context = {"ti": ti, "dag_run": types.SimpleNamespace(run_type=run_type), "logical_date": logical_date}
    return validate_run.function(dated, params=form_params(conf, sweep=sweep), **context)


@pytest.fixture
def offline(monkeypatch):
    """`validate` without the checks that ask AWS (instance types, ParallelCluster's EC2 checks, the
    account preflight: tested against moto in tests/dags and tests/pcflow/test_preflight.py), the Price
    List API (tests/pcflow/test_budget_price_list.py: the table prices) nor the bucket's record of a git
    commit's hyperparameter schema (tests/pcflow/code/test_code_hparams.py: read from the commit instead),
    for unit tests that run without the local stack."""
    from pcflow.code import hparams
    from pcflow.pipeline import validation
    from pcflow.pricing import price_list

    monkeypatch.setattr(validation, "check_against_aws", lambda run: None)
    monkeypatch.setattr(validation, "account_preflight", lambda run: None)
    monkeypatch.setattr(hparams, "recorded_schema", lambda run, s3, path: hparams.MISSING)  # read from git
    monkeypatch.setattr(price_list, "pricing_client", lambda *args, **kwargs: None)
    monkeypatch.setenv("PCFLOW_DEFAULT_PROFILE", "local")
    return validate


@pytest.fixture
def form():
    """`form_params`: the params a task of the run receives (the train task's env is resolved from them)."""
    return form_params


@pytest.fixture
def schemaless_payload(tmp_path, monkeypatch) -> str:
    """An admin payload `plain` that declares no hyperparameters (no hparams.schema.json), in a private
    payloads directory: for tests of how any hyperparameter travels, which the shipped payload (SimCLR,
    whose schema lists its own names only) would refuse in the first task."""
    payloads = tmp_path / "payloads"
    (payloads / "plain").mkdir(parents=True)
    (payloads / "plain" / "train.py").write_text("print('plain')\n")
    (payloads / "plain" / "requirements.txt").write_text("torch==2.13.0\n")
    monkeypatch.setattr("pcflow.paths.payloads_dir", lambda: payloads)
    return "plain"


@pytest.fixture
def planned_run():
    """`make_planned_run`: tests build the planned run as a valid model, not as a dict."""
    return make_planned_run


@pytest.fixture
def resolved_run():
    """`make_resolved_run`: tests build the first task's document as a valid model, not as a dict."""
    return make_resolved_run
