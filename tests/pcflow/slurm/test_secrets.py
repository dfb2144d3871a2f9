"""training.env values are secrets: never in XCom, task logs, Airflow's rendered fields or any file on the
cluster (they reach the job through sbatch's environment, through sudo to the job account, whose
environment filter would drop PYTHONPATH and the like); the job's inputs are the SSH user's, readable by
the job account's group only (0640 in a 3770 job directory of a 2750 run directory)."""

from __future__ import annotations

import copy
import importlib
import json
import stat
import uuid
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from airflow.sdk.execution_time.task_runner import _serialize_rendered_fields
from stacktools import REPO, LocalStack
from taskcontext import first_event, make_context

from pcflow import runspec
from pcflow.patterns import DEFAULT_JOB_USER
from pcflow.pipeline import resolve_for_run, run_env
from pcflow.pipeline.resolved import dump
from pcflow.slurm.head_node import HeadNode
from pcflow.slurm.operators import SlurmJobOperator

pytestmark = pytest.mark.security

SECRET = f"tok-{uuid.uuid4().hex}"
FAST = {"poll_interval": 0.2, "confirm_interval": 2.0}


def modes(root: Path) -> dict[str, int]:
    """Permission bits of the directory and everything under it, by relative path."""
    return {str(p.relative_to(root.parent)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


@pytest.mark.stack
def test_env_values_stay_out_of_xcom_logs_and_readable_files(local_stack: LocalStack, capsys):
    """About 5 s: one Slurm job that checks its token arrived, without printing it."""
    # (Not ${#VAR}: `{#` opens a Jinja comment, and program is a template field.)
    tricky = "`id`; rm -rf /\n$(x) 'q' \\ \"=\""  # reaches the job exactly: no shell reads it on the way
    same = f"import os, sys; sys.exit(os.environ['TRICKY'] != {tricky!r})"
    program = [
        "bash",
        "-c",
        f'[ "$(printf %s "$API_TOKEN" | wc -c)" = {len(SECRET)} ] && [ "$PYTHONPATH" = /opt/pcflow-test ] && '
        'python3 -c "$0" && echo token arrived',
        same,
    ]
    env = {"API_TOKEN": SECRET, "TRICKY": tricky, "PYTHONPATH": "/opt/pcflow-test"}
    head_node = HeadNode(job_user=DEFAULT_JOB_USER)
    op = SlurmJobOperator(task_id="secret-env", program=program, env=env, head_node=head_node, **FAST)
    context = make_context("secret-env")
    op.render_template_fields(context)
    assert SECRET not in json.dumps(_serialize_rendered_fields(op))  # what Airflow stores and shows

    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    classpath, kwargs = deferred.value.trigger.serialize()
    assert SECRET not in json.dumps(kwargs)  # what the triggerer is handed (stored in the database)
    module, _, name = classpath.rpartition(".")
    event = first_event(getattr(importlib.import_module(module), name)(**kwargs))
    result = op.execute_complete(context, event)

    assert "token arrived" in event["log_tail"]
    assert SECRET not in json.dumps(result) + json.dumps(event)  # the XCom, the trigger's event
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err

    run_dir = Path(result["run_dir"])
    written = modes(run_dir.parent)
    assert written[run_dir.parent.name] == 0o2750 and written[f"{run_dir.parent.name}/secret-env"] == 0o3770
    inputs = ("hparams.json", "spec.json", "sampler.py", "job.sbatch")
    assert {f: written[f"{run_dir.parent.name}/secret-env/{f}"] for f in inputs} == dict.fromkeys(inputs, 0o640)
    # No file holds it: the batch script went to the shared file system, which FSx exports to S3 (issue 24).
    holders = [p.name for p in run_dir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert holders == []  # spec.json lists the names only; the value came with sbatch's environment
    assert json.loads((run_dir / "spec.json").read_text())["env"] == ["API_TOKEN", "PYTHONPATH", "TRICKY"]


def test_invalid_env_is_refused_without_printing_values():
    op = SlurmJobOperator(task_id="bad-env", program=["true"], env={"BAD NAME": SECRET, "GOOD": SECRET})
    with pytest.raises(AirflowFailException, match="not a valid shell identifier") as refused:
        op.job_spec()
    assert SECRET not in str(refused.value)


@pytest.fixture
def profile_with_env(monkeypatch) -> None:
    """The local profile as an admin would give it a token for the job."""
    load = runspec.load_profile

    def with_env(name: str) -> dict:
        profile = copy.deepcopy(load(name))
        profile.setdefault("training", {})["env"] = {"API_TOKEN": SECRET}
        return profile

    monkeypatch.setattr(runspec, "load_profile", with_env)


def test_validated_document_holds_env_names_and_the_train_task_resolves_values(profile_with_env):
    """About 5 s (parses the DAG files)."""
    from airflow.dag_processing.dagbag import DagBag

    params = {"profile": "local", "partition": "default", "overrides": {}}
    run = resolve_for_run(params, make_context("validate"))
    assert run.training.env == ["API_TOKEN"]
    assert SECRET not in json.dumps(dump(run))  # the validate task's XCom
    assert run_env(params) == {"API_TOKEN": SECRET}

    bag = DagBag(dag_folder=str(REPO / "dags"))
    for dag_id in ("pretrain", "pretrain_sweep", "pretrain_nightly"):
        dag = bag.dags[dag_id]
        train = dag.get_task("train")
        rendered = train.render_template(train.env, {"params": params})
        assert rendered == {"API_TOKEN": SECRET}, dag_id


@pytest.fixture
def profile_with_references(monkeypatch) -> dict:
    """The local profile as an admin gives it secrets by reference: an Airflow Variable and a Connection's
    password (here from the environment, the first secrets backend; Secrets Manager works the same)."""
    load = runspec.load_profile
    env = {"API_TOKEN": {"variable": "pcflow_api_token"}, "DB_PASSWORD": {"connection": "pcflow_db"}, "MODE": "x"}

    def with_env(name: str) -> dict:
        profile = copy.deepcopy(load(name))
        profile.setdefault("training", {})["env"] = env
        return profile

    monkeypatch.setattr(runspec, "load_profile", with_env)
    monkeypatch.setenv("AIRFLOW_VAR_PCFLOW_API_TOKEN", SECRET)
    monkeypatch.setenv("AIRFLOW_CONN_PCFLOW_DB", json.dumps({"conn_type": "generic", "password": SECRET + "-db"}))
    return env


def test_secrets_by_reference_are_read_by_the_tasks_never_stored(profile_with_references, offline, monkeypatch):
    params = {"profile": "local", "partition": "default", "overrides": {}}
    run = resolve_for_run(params, make_context("validate"))
    assert run.training.env == ["API_TOKEN", "DB_PASSWORD", "MODE"]
    assert SECRET not in json.dumps(dump(run))  # the references are, for the trigger to hide the values
    assert run.training.secrets == {
        "API_TOKEN": {"variable": "pcflow_api_token"},
        "DB_PASSWORD": {"connection": "pcflow_db"},
    }
    assert run_env(params) == {"API_TOKEN": SECRET, "DB_PASSWORD": SECRET + "-db", "MODE": "x"}
    # A missing one refuses the run in the first task, before anything is created.
    monkeypatch.delenv("AIRFLOW_VAR_PCFLOW_API_TOKEN")
    with pytest.raises(AirflowFailException, match=r"training\.env\.API_TOKEN: Airflow variable 'pcflow_api_token' is"):
        offline(params)


def test_a_conf_cannot_name_a_secret(offline, admin_profiles):
    """Even where the admin lets a conf set the job's environment, a reference would read any of the
    deployment's Variables into the job: refused."""
    profile = admin_profiles.make("local", {"overridable": {"training.env": {}}})
    conf = {"profile": profile, "partition": "p1", "overrides": {"training": {"env": {"T": {"variable": "aws_key"}}}}}
    with pytest.raises(AirflowFailException, match=r"training\.env\.T: a secret reference comes from the profile only"):
        offline(conf)
    assert offline({**conf, "overrides": {"training": {"env": {"T": "plain"}}}})["training"]["env"] == ["T"]


@pytest.mark.parametrize(
    "reference", [{}, {"variable": "a", "connection": "b"}, {"variable": "a", "field": "login"}, {"variable": "a b"}]
)
def test_a_malformed_reference_is_the_admins_mistake_named(reference):
    with pytest.raises(ValueError, match="env"):
        runspec.TrainingSettings(program=["train.py"], env={"T": reference})


@pytest.mark.stack
def test_a_job_printing_its_secret_shows_stars_in_the_streamed_log(local_stack: LocalStack, monkeypatch, capsys):
    """The triggerer reads the secret's reference again (never its value: the trigger's kwargs are stored
    and shown) and hides it in every log line it streams and in the event's tail (one cursor makes both)."""
    monkeypatch.setenv("AIRFLOW_VAR_PCFLOW_JOB_TOKEN", SECRET)
    program = ["bash", "-c", 'echo "token is $API_TOKEN, twice: $API_TOKEN"']
    references = {"API_TOKEN": {"variable": "pcflow_job_token"}}
    op = SlurmJobOperator(
        task_id="secret-print", program=program, env={"API_TOKEN": SECRET}, secret_env=references, **FAST
    )
    context = make_context("secret-print")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    classpath, kwargs = deferred.value.trigger.serialize()
    assert SECRET not in json.dumps(kwargs) and kwargs["secret_env"] == references
    module, _, name = classpath.rpartition(".")
    event = first_event(getattr(importlib.import_module(module), name)(**kwargs))
    assert "token is ***, twice: ***" in event["log_tail"] and SECRET not in json.dumps(event)
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
