"""Refused before spend, end to end: `pretrain` runs (dag.test, the local stack's moto) with hostile
confs and admin settings the train or dataset stage used to refuse only after the network, image,
data and cluster existed (a hyperparameter out of the bounds the run's code declares: the job refused
it), and a run over its budget. The first task fails, no other task starts, and nothing is tagged with
the run's stack in moto (each case has its own stack, from an admin profile). Six DAG runs: about 60 s."""

from __future__ import annotations

import os
import uuid

import boto3
import pytest
from dagrun import REPO, run_dag, tagged_resources

pytestmark = pytest.mark.security

NOT_STARTED = ("upstream_failed", "None", "skipped")
#: examples/resnet as the profile's code: its hparams.schema.json allows depth 14, 26, 50, 101 or 152.
RESNET_CODE = {"payload": None, "code": {"dir": str(REPO / "examples" / "resnet")}, "program": ["train.py"]}
STACK_SSH = os.path.join(os.environ.get("PCFLOW_STACK_DIR", REPO / ".stack"), "ssh")


def no_conf(data):
    return {}


@pytest.mark.stack
@pytest.mark.usefixtures("airflow")
@pytest.mark.parametrize(
    ("settings", "conf", "complaints"),
    [
        ({"training": {"time_limit": "1:00:00\n#SBATCH --uid=0"}}, no_conf, ["training.time_limit: String should"]),
        (
            {"training": {"env": {"A;id": "1"}}},
            no_conf,
            ["training.env: Value error, environment variable name 'A;id'"],
        ),
        ({}, lambda data: {"dataset_source": str(data / "empty")}, ["dataset.source: '", "holds no files to load"]),
        (
            {"budget": {"usd": 0.5}},
            lambda data: {"instance_type": "g5.12xlarge", "nodes": 3},
            [
                "budget.usd: this run may cost up to $34.03, more than its budget of $0.50: $17.02/h",
                "prices: price-list",
            ],
        ),
        (
            {"training": RESNET_CODE},
            lambda data: {"hyperparameters": {"depth": 13}},
            ["training.hyperparameters.depth: 13 is not one of [14, 26, 50, 101, 152]; a trigger user may change"],
        ),
        (
            {},
            lambda data: {"dataset_source": STACK_SSH, "overrides": {"ami": {"bootstrap_script": "/etc/hostname"}}},
            [
                "ami.bootstrap_script: only the deployment admin may change this",
                f"dataset.source (form field 'dataset_source'): '{STACK_SSH}' is not under a dataset root",
            ],
        ),
    ],
)
def test_a_run_refused_by_the_first_task_creates_nothing(admin_profiles, settings, conf, complaints, capfd):
    stack = f"sec{uuid.uuid4().hex[:8]}"
    data = admin_profiles.directory.parent / "data"
    (data / "empty").mkdir(parents=True)
    roots = {"overridable": {"dataset.source": {"under": ["builtin:digits", str(data)]}}}
    profile = admin_profiles.make(
        "local", {**settings, "stack": stack, "dataset": {"bucket": f"pcflow-{stack}-data"}, **roots}
    )
    result = run_dag("pretrain", {"profile": profile, "partition": "sec", **conf(data)})
    log = "".join(capfd.readouterr())
    for complaint in complaints:
        assert complaint in log
    assert result.state == "failed" and result.task_states["validate"] == "failed"
    assert all(state in NOT_STARTED for task, state in result.task_states.items() if task != "validate")
    assert tagged_resources("pcflow:stack", stack) == []
    assert f"pcflow-{stack}-data" not in [b["Name"] for b in boto3.client("s3").list_buckets()["Buckets"]]
