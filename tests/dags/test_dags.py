"""The DAGs as users meet them: they import cleanly, their forms validate, and they run end to end on
the embedded default (moto server + local Slurm through sshd) with nothing left behind."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from dagrun import REPO, remove_stack, run_dag, tagged_resources

DAG_IDS = {"pretrain", "pretrain_nightly", "pretrain_sweep", "janitor"}
FAST = {"hyperparameters": {"epochs": 1}}
#: Digits only, valid per the form: it reaches the dataset stage as this string (no native re-typing).
PARTITION = "20261129"


def test_dag_files_import_without_errors_or_io():
    """Each DAG file on its own, in a fresh interpreter with no AWS endpoint and no stack: parsing must
    not need either (no I/O at import)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AIRFLOW_CONN_"))}
    code = (
        "import sys; sys.path.insert(0, 'plugins');"
        "from airflow.dag_processing.dagbag import DagBag;"
        "bag = DagBag(dag_folder='dags');"
        "assert not bag.import_errors, bag.import_errors;"
        "print(sorted(bag.dag_ids))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert eval(out.stdout.strip().splitlines()[-1]) == sorted(DAG_IDS)


def test_params_defaults_are_valid_and_bad_values_refused():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    for dag_id in DAG_IDS:
        bag.dags[dag_id].params.validate()
    params = bag.dags["pretrain"].params
    for name, bad in [("nodes", -1), ("capacity_type", "cheap"), ("instance_type", "$(id)"), ("profile", "A;B")]:
        good = params[name]
        with pytest.raises(Exception, match=name):
            params[name] = bad
            params.validate()
        params[name] = good


def test_pretrain_end_to_end_trains_and_leaves_nothing(airflow):
    result = run_dag("pretrain", {"partition": PARTITION, **FAST})
    assert result.state == "success", result.task_states
    out = result.returned
    assert out["train"]["state"] == "COMPLETED"
    objective, finals = out["metrics"]["objective"], out["metrics"]["metrics"]
    assert objective["name"] == "fewshot_accuracy" and objective["value"] > 0.3  # 10 classes: chance is 0.1
    assert finals["probe_accuracy"]["final"] > 0.5
    both = {"probe_accuracy_untrained", "fewshot_accuracy_untrained"}  # the margin: tests/payloads
    assert both < set(finals), "the untrained encoder is evaluated beside the trained one"
    assert out["metrics"]["report"].endswith("/report.html")
    assert out["teardown"]["deleted"] and not out["teardown"]["remaining"]
    assert tagged_resources("pcflow:run", result.run_key) == []
    report = out["metrics"]["report"].removeprefix("s3://").split("/", 1)
    assert boto3.client("s3").head_object(Bucket=report[0], Key=report[1])["ContentLength"] > 0


def test_training_failure_still_tears_down_and_fails_the_run(airflow):
    conf = {"partition": PARTITION, "hyperparameters": {"epochs": 1, "fail_at_epoch": 0, "fail_once": False}}
    result = run_dag("pretrain", conf)
    assert result.state == "failed"
    assert result.task_states["train"] == "failed"
    assert result.task_states["teardown"] == "success" and result.task_states["delete_cluster"] == "success"
    assert tagged_resources("pcflow:run", result.run_key) == []


@pytest.mark.parametrize(
    ("admin", "conf", "complaint"),
    [
        ({"instance_type": "zz9.galactic"}, {}, "instance_type: zz9.galactic is not offered"),
        ({}, {"overrides": {"training": {"nodes": -1}}}, "training.nodes (form field 'nodes'): -1 is outside"),
        ({}, {"overrides": {"stack": "$(touch /tmp/pwned)"}}, "stack: only the deployment admin may change this"),
        ({"training": {"partition": "gpu; rm -rf /"}}, {}, "training.partition: String should match"),
    ],
)
@pytest.mark.usefixtures("airflow")
def test_invalid_conf_is_refused_before_anything_is_created(admin_profiles, admin, conf, complaint, capfd):
    profile = admin_profiles.make("local", admin)
    result = run_dag("pretrain", {"profile": profile, "partition": PARTITION, **conf})
    assert complaint in "".join(capfd.readouterr())  # the validate task's log names the field
    assert result.state == "failed"
    assert result.task_states["validate"] == "failed"
    assert all(state in ("upstream_failed", "skipped", "failed", "None") for state in result.task_states.values())
    assert "network" not in result.returned and "dataset" not in result.returned
    assert not Path("/tmp/pwned").exists()


def test_nightly_backfill_of_two_days_shares_infrastructure_and_keeps_outputs_apart(airflow):
    nights = [dt.datetime(2026, 11, 20, 2, tzinfo=dt.UTC), dt.datetime(2026, 11, 21, 2, tzinfo=dt.UTC)]
    runs = [
        run_dag("pretrain_nightly", {"hyperparameters": {"epochs": 1, "lr": lr}}, logical_date=night)
        for night, lr in zip(nights, (0.002, 0.004), strict=True)
    ]
    assert [r.state for r in runs] == ["success", "success"]
    assert [r.returned["dataset"]["partition"] for r in runs] == ["2026-11-20", "2026-11-21"]
    assert runs[0].returned["network"]["vpc_id"] == runs[1].returned["network"]["vpc_id"]
    assert runs[0].returned["image"]["image_id"] == runs[1].returned["image"]["image_id"]
    reports = {r.returned["metrics"]["report"] for r in runs}
    assert len(reports) == 2
    vpcs = boto3.client("ec2").describe_vpcs(Filters=[{"Name": "tag:pcflow:stack", "Values": ["local"]}])["Vpcs"]
    shared = [v for v in vpcs if not any(t["Key"] == "pcflow:run" for t in v.get("Tags", []))]
    assert len(shared) == 1


def test_sweep_ranks_trials_and_picks_the_best(airflow):
    grid = {"lr": [0.002, 0.004, 0.0005]}  # crossed with the one trial: three trials
    conf = {"partition": PARTITION, "trials": [{"seed": 0}], "grid": grid, "tasks_per_node": 1, **FAST}
    result = run_dag("pretrain_sweep", conf)
    assert result.state == "success", result.task_states
    board = result.returned["metrics"]
    assert board["objective"] == {"name": "fewshot_accuracy", "mode": "max"}
    assert len(board["leaderboard"]) == 3
    values = [row["value"] for row in board["leaderboard"]]
    assert None not in values and values == sorted(values, reverse=True)
    best = board["best"]
    assert best["value"] == max(values) and best["trial"] == board["leaderboard"][0]["trial"]
    assert best["hyperparameters"]["lr"] in grid["lr"] and best["hyperparameters"]["seed"] == 0
    assert sorted(row["hyperparameters"]["lr"] for row in board["leaderboard"]) == sorted(grid["lr"])
    assert tagged_resources("pcflow:run", result.run_key) == []


def test_tearing_down_the_whole_stack_leaves_nothing(airflow):
    """What the runs above kept on purpose (the nightly's shared network, the baked image, the data
    bucket) goes with a teardown of the whole stack, images included; the bucket by the data policy."""
    assert remove_stack("local") == []
