"""Every settings path the pipeline's operators read (`RUN.dataset.bucket`) exists in the document the
first task hands them, for every profile an admin ships, and that document is the one declared
(`pcflow.pipeline.resolved.ResolvedRun`) and checked when a DAG is built (`run_fields.FIELDS`): a renamed
run-spec field fails here, or when the DAG file is parsed, not in the middle of a run after the cluster
was paid for."""

from __future__ import annotations

import ast
import itertools
import types
import uuid
from pathlib import Path

import pytest
from airflow.sdk import DAG
from pydantic import BaseModel
from taskcontext import FakeTI

import pcflow.checks
import pcflow.pipeline
from pcflow.paths import profile_names
from pcflow.pipeline import RUN, resolved, run_fields, settings, sweep_params, training_params, validation
from pcflow.pricing import price_list
from pcflow.runspec import resolve_run_spec
from pcflow.values import Returned

PIPELINE_SOURCES = sorted(Path(pcflow.pipeline.__file__).parent.glob("*.py"))


def run_path(node: ast.AST) -> str | None:
    """The dotted path of `RUN.a.b` written in the code, None for any other expression."""
    names = []
    while isinstance(node, ast.Attribute):
        names.insert(0, node.attr)
        node = node.value
    return ".".join(names) if names and isinstance(node, ast.Name) and node.id == "RUN" else None


def literal_run_paths() -> set[str]:
    """Every `RUN.<path>` written in the pipeline's code (and each of its sections), from its syntax tree."""
    paths = set()
    for source in PIPELINE_SOURCES:
        for node in ast.walk(ast.parse(source.read_text())):
            if (path := run_path(node)) is not None:
                paths.add(path)
    return paths


def declare_every_variant() -> None:
    """Every variant of the pipeline, declared (each branch's reads)."""
    for number, (run_scoped, sweep, dated) in enumerate(itertools.product((True, False), repeat=3)):
        with DAG(f"variant_{number}", schedule=None, params=training_params(extra=sweep_params() if sweep else None)):
            pcflow.pipeline.build_training_pipeline(run_scoped=run_scoped, sweep=sweep, dated_partitions=dated)


@pytest.fixture(scope="module")
def declared_paths() -> set[str]:
    """The paths recorded while every variant of the pipeline is declared (each branch's reads)."""
    settings.RUN_VALUE_PATHS.clear()
    declare_every_variant()
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


@pytest.fixture(params=profile_names())
def document(request, monkeypatch, admin_profiles) -> dict:
    """The validate task's document for each shipped profile, built offline."""
    # What only AWS can answer is asked of moto in tests/dags; here the document's shape is the point.
    for check in ("check_against_aws", "account_preflight", "check_cluster_settings"):
        monkeypatch.setattr(validation, check, lambda run: None)
    monkeypatch.setattr(price_list, "pricing_client", lambda *args, **kwargs: None)  # the table prices
    monkeypatch.setattr(pcflow.checks, "check_dataset_source", lambda run: None)  # S3, for an s3:// source
    profile = request.param
    if not resolve_run_spec(profile).network.ssh_ingress_cidrs:  # aws-gpu: the admin's to set (deploy.md)
        profile = admin_profiles.make(profile, {"network": {"ssh_ingress_cidrs": ["203.0.113.0/24"]}})
    return validated_document(profile)


def test_the_code_and_the_declared_pipeline_read_the_same_paths(declared_paths):
    assert declared_paths == literal_run_paths()
    assert {"dataset.bucket", "training.program", "cost", "run_key", "expiry.run_hours"} <= declared_paths


def test_every_path_read_exists_in_the_validated_run_document(declared_paths, document):
    missing = []
    for path in sorted(declared_paths):
        node = document
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                missing.append(path)
                break
            node = node[key]
    assert not missing, f"{document['profile']}: the pipeline reads {missing}, which the validated document lacks"


def undeclared(document: dict, model: type[BaseModel], where: str = "") -> list[str]:
    """Where `document` and `model`'s fields differ: keys the model lacks, fields the document lacks (but
    those it may: a run that is no sweep has no trials), and the same inside each sub-model."""
    fields = model.model_fields
    lines = [f"{where}{key}: returned, not declared" for key in sorted(set(document) - set(fields))]
    lines += [
        f"{where}{name}: declared, not returned"
        for name in sorted(set(fields) - set(document))
        if f"{where}{name}" not in resolved.OPTIONAL_KEYS
    ]
    for name in sorted(set(fields) & set(document)):
        sub = resolved.sub_model(fields[name].annotation)
        if sub is not None and document[name] is not None:
            assert isinstance(document[name], dict), f"{where}{name}: a {sub.__name__}, returned as {document[name]!r}"
            lines += undeclared(document[name], sub, f"{where}{name}.")
    return lines


def test_the_validated_run_document_is_the_declared_one(document):
    """Every key the first task returns is a field of ResolvedRun and the other way round: what the typed
    paths are checked against is what the stages get."""
    assert undeclared(document, resolved.ResolvedRun) == []
    without_trials = {k: v for k, v in document.items() if k != "trials"}
    assert undeclared(without_trials, resolved.ResolvedRun) == []  # a run that is no sweep


def test_the_field_tree_dag_files_check_against_is_the_declared_documents():
    """run_fields.py is written from the models (DAG files must not import them): stale, it is written again
    with the command its docstring gives."""
    assert Path(run_fields.__file__).read_text() == resolved.field_module()
    assert run_fields.FIELDS == resolved.field_tree()


def test_a_typed_path_is_the_value_the_dotted_path_was():
    assert RUN.dataset.bucket == Returned("validate", ("dataset", "bucket"))
    assert type(RUN.dataset.bucket) is Returned and type(RUN.expiry) is settings.RunSection
    assert str(RUN.objective) == str(Returned("validate", ("objective",))) == "<validate.objective as returned>"
    assert (RUN.objective.task_id, RUN.objective.path, RUN.objective.optional) == ("validate", ("objective",), False)
    assert str(RUN.expiry.kept_hours) == "<validate.expiry.kept_hours as returned>"


def test_a_misspelt_field_is_refused_when_the_dag_is_built_naming_the_fields():
    with pytest.raises(AttributeError, match=r"dataset has no field 'bukcet'; its fields: source, bucket, prefix"):
        RUN.dataset.bukcet  # noqa: B018
    with pytest.raises(AttributeError, match=r"the run document has no field 'stak'; its fields: profile, stack"):
        RUN.stak  # noqa: B018
    with pytest.raises(AttributeError, match=r"network has no field 'subnets'; its fields: vpc_cidr, public_subnet"):
        RUN.network.subnets  # noqa: B018
    with pytest.raises(AttributeError, match="'Returned' object has no attribute 'total'"):
        RUN.cluster.config.total  # noqa: B018  a dict-typed field ends the path: it is read whole
    assert not hasattr(RUN, "__deepcopy__") and not hasattr(RUN.dataset, "_fields")


def test_a_field_renamed_in_the_model_fails_the_pipeline_as_it_is_declared(monkeypatch):
    dataset = {"bucket_name" if name == "bucket" else name: sub for name, sub in run_fields.FIELDS["dataset"].items()}
    monkeypatch.setitem(run_fields.FIELDS, "dataset", dataset)
    with pytest.raises(AttributeError, match="dataset has no field 'bucket'; its fields: source, bucket_name"):
        declare_every_variant()


def field_names(tree: dict) -> set[str]:
    """The name of every field of every section of a field tree."""
    return set(tree) | {name for sub in tree.values() if sub is not None for name in field_names(sub)}


def test_no_field_hides_what_a_section_is():
    """A field named like one of a section's own attributes (`path`, `resolve`) would read as that attribute."""
    own = {name for name in dir(settings.RunSection) if not name.startswith("_")}
    assert field_names(run_fields.FIELDS) & own == set()
