"""One region per run: the profile's `region` (what the first task checked and priced) is where every AWS
operator of the pipeline works, whatever region the AWS connection names. The connection here says
eu-west-1, the profile us-east-1: each operator, rendered as a worker renders it, asks us-east-1, its
deferrable triggers too, and the pcluster CLI of the cluster stages is run with `--region us-east-1`,
the `Region:` of the config it is given."""

from __future__ import annotations

import json

import pytest
from airflow.sdk import DAG

from pcflow.aws.base import PcflowAwsOperator
from pcflow.pipeline import TRAINING_DAG_ARGS, build_training_pipeline, sweep_params, training_params

RUN_REGION, CONNECTION_REGION = "us-east-1", "eu-west-1"
SHAPES = {"pretrain": {}, "nightly": {"run_scoped": False}, "sweep": {"sweep": True}}
#: The pipeline's AWS operators (the @task stages make their clients from the run's region themselves).
AWS_STAGES = {"network", "dataset", "image", "validate_cluster", "cluster", "metrics"}


class OtherXCom(dict):
    """Another task's XCom: the keys asked for are None (the region is the first task's only)."""

    def __missing__(self, key):
        return None


class ReturnedValues:
    """A task instance whose `validate` returned the run and whose other upstream tasks returned nothing much."""

    _upstream_map_indexes: dict = {}  # noqa: RUF012 - read by Airflow's XComArg.resolve

    def __init__(self, run: dict):
        self.run = run

    def xcom_pull(self, task_ids: str, key: str = "return_value", **_: object):
        return self.run if task_ids == "validate" else OtherXCom()


@pytest.fixture
def connection_elsewhere(monkeypatch):
    """The AWS connection in another region than the profile's."""
    extra = {"region_name": CONNECTION_REGION}
    connection = {"conn_type": "aws", "login": "AKIDEXAMPLE", "password": "secret", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(connection))


def pipeline(**shape) -> DAG:
    extra = sweep_params() if shape.get("sweep") else None
    params = training_params(partition="default", extra=extra)
    with DAG("pretrain", schedule=None, params=params, **TRAINING_DAG_ARGS) as dag:
        build_training_pipeline(**shape)
    return dag


def rendered_aws_operators(dag: DAG, run: dict) -> dict[str, PcflowAwsOperator]:
    """The DAG's AWS operators by task id, their fields rendered as a worker renders them before `execute`."""
    import copy

    operators = {task.task_id: copy.copy(task) for task in dag.tasks if isinstance(task, PcflowAwsOperator)}
    for task in operators.values():
        task.render_template_fields({"ti": ReturnedValues(run), "params": {}})
    return operators


@pytest.fixture
def run(offline, monkeypatch):
    """The first task's document of an aws-gpu run (ParallelCluster), on demand (spot asks EC2's price history)."""
    from pcflow.pipeline import validation

    monkeypatch.setattr(validation, "check_cluster_settings", lambda run: None)  # asks EC2 (tests/dags: moto)

    def validated(*, sweep: bool) -> dict:
        conf = {"profile": "aws-gpu-rehearsal", "partition": "p1", "capacity_type": "ondemand"}
        return offline({**conf, "trials": [{"lr": 0.001}]} if sweep else conf, sweep=sweep)

    return validated


@pytest.mark.parametrize("shape", SHAPES)
def test_every_aws_operator_of_a_run_works_in_the_profiles_region(shape, run, connection_elsewhere):
    document = run(sweep=shape == "sweep")
    assert document["region"] == RUN_REGION
    operators = rendered_aws_operators(pipeline(**SHAPES[shape]), document)
    assert set(operators) == AWS_STAGES | (
        {"delete_cluster", "teardown", "release_network"} if shape != "nightly" else set()
    )
    for task_id, task in operators.items():
        assert task.region_name == RUN_REGION, task_id
        assert task.hook.region_name == RUN_REGION, task_id
        assert task.client("s3").meta.region_name == RUN_REGION, task_id
        assert task.trigger_aws_kwargs["region_name"] == RUN_REGION, task_id  # the deferred waits


def test_the_pcluster_cli_is_run_in_the_region_of_the_config_it_is_given(run, connection_elsewhere, monkeypatch):
    """`--region` and AWS_DEFAULT_REGION of every pcluster call a cluster stage makes: the `Region:` of the
    rendered config, the run's, not the connection's (pcluster would otherwise look in another region)."""
    import subprocess

    from pcflow.cluster.config import render_config
    from pcflow.pipeline.resolved import load
    from pcflow.pipeline.validation import planned_cluster

    document = run(sweep=False)
    config_region = render_config(planned_cluster(load(document))).document["Region"]
    assert config_region == RUN_REGION
    calls = []

    def pcluster(argv, *, env, **_):
        calls.append((argv, env["AWS_DEFAULT_REGION"]))
        return subprocess.CompletedProcess(argv, 0, stdout="{}", stderr="")

    monkeypatch.setenv("PCFLOW_PCLUSTER", "/bin/true")
    monkeypatch.setattr("pcflow.cluster.pcluster.subprocess.run", pcluster)
    operators = rendered_aws_operators(pipeline(), document)
    for task_id in ("validate_cluster", "cluster", "delete_cluster"):
        operators[task_id].cluster_provider.hook.describe_cluster("any")
        argv, environment_region = calls.pop()
        assert argv[argv.index("--region") + 1] == environment_region == config_region, task_id
