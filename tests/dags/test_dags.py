"""The DAGs as users meet them: they import cleanly, their forms validate, and they run end to end on
the embedded default (moto server + local Slurm through sshd) with nothing left behind."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from dagrun import REPO, remove_stack, run_dag, tagged_resources

from pcflow.lineage import dataset_extra, is_new_content

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
    # The payload's requirements as the run's own: an environment layered on .venv-payload, which holds them
    # all (nothing is downloaded), verified with its base, and the job runs its python.
    overrides = {"training": {"requirements": "requirements.txt"}}
    result = run_dag("pretrain", {"partition": PARTITION, **FAST, "overrides": overrides})
    assert result.state == "success", result.task_states
    out = result.returned
    prepared = out["prepare_environment"]
    assert prepared["dir"].endswith(f"/pcflow/envs/{prepared['id']}")
    assert out["check_environment"]["dir"] == prepared["dir"]
    assert out["metrics"]["environment"] == {key: prepared[key] for key in ("id", "built", "build_s", "python")}
    assert out["metrics"]["container"] is None, "no training.container: it ran on the nodes themselves"
    assert out["train"]["state"] == "COMPLETED"
    objective, finals = out["metrics"]["objective"], out["metrics"]["metrics"]
    assert objective["name"] == "fewshot_accuracy" and objective["value"] > 0.3  # 10 classes: chance is 0.1
    assert finals["probe_accuracy"]["final"] > 0.5
    both = {"probe_accuracy_untrained", "fewshot_accuracy_untrained"}  # the margin: tests/payloads
    assert both < set(finals), "the untrained encoder is evaluated beside the trained one"
    assert out["metrics"]["report"].endswith("/report.html")
    assert not out["teardown"]["remaining"]  # the run's own resources; then the stack's network, its last user gone:
    assert out["release_network"]["network_deleted"] and out["release_network"]["deleted"]
    assert tagged_resources("pcflow:run", result.run_key) == []
    report = out["metrics"]["report"].removeprefix("s3://").split("/", 1)
    assert boto3.client("s3").head_object(Bucket=report[0], Key=report[1])["ContentLength"] > 0
    # The code ran from the payload this run shipped; the model outlived the run's teardown, in S3.
    assert out["ship_payload"]["dir"].endswith(f"/pcflow/payloads/{out['ship_payload']['digest']}")
    code = out["metrics"]["code"]  # the run summary says which code it trained (pcflow.lineage.code_extra)
    assert (code["source"], code["digest"], code["files"]) == ("payload", out["ship_payload"]["digest"], 16)
    model = out["metrics"]["model"]["model"]
    assert model == f"s3://{report[0]}/runs/{result.run_key}/model/model.pt"
    assert boto3.client("s3").head_object(Bucket=report[0], Key=model.split("/", 3)[3])["ContentLength"] > 0
    assert out["metrics"]["model"]["checkpoint"].startswith(
        f"s3://{report[0]}/runs/{result.run_key}/model/checkpoints/"
    )
    assert model_events("pcflow-pretrained-encoder-local", result.run_id) == [model]  # the stack's own asset
    # Lineage: the model's event names the partition it was trained on; the partition's own event is this
    # run's when its load committed the content (a stack reused from an earlier session already holds it).
    (trained_on,) = asset_events("pcflow-pretrained-encoder-local", result.run_id)
    assert trained_on["dataset"] == dataset_extra(out["dataset"]) and trained_on["dataset"]["partition"] == PARTITION
    announced = [dataset_extra(out["dataset"])] if is_new_content(out["dataset"], result.run_key) else []
    assert asset_events("pcflow-dataset-local", result.run_id) == announced


def model_events(asset_name: str, run_id: str) -> list[str]:
    """The model URIs of the events a DAG run emitted for an asset."""
    return [extra["model"]["model"] for extra in asset_events(asset_name, run_id)]


def asset_events(asset_name: str, run_id: str) -> list[dict]:
    """The extras of the events a DAG run emitted for an asset."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        events = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.name == asset_name, AssetEvent.source_run_id == run_id)
            .all()
        )
        return [event.extra for event in events]


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


@pytest.mark.usefixtures("airflow")
def test_a_profile_the_admin_does_not_offer_is_refused_before_anything_is_created(monkeypatch, capfd):
    """The DAG parsed while every profile was offered (Airflow checks a new run's conf against that form);
    the workers offer `local` alone: the first task refuses the rehearsal profile, naming the setting."""
    from pcflow.paths import profile_names
    from pcflow.pipeline import form

    monkeypatch.setattr(form, "offered_profiles", profile_names)  # the form, as parsed before the change
    monkeypatch.setenv("PCFLOW_OFFERED_PROFILES", "local")
    result = run_dag("pretrain", {"profile": "aws-gpu-rehearsal", "partition": PARTITION})
    assert "profile: 'aws-gpu-rehearsal' is not offered on this deployment" in "".join(capfd.readouterr())
    assert result.state == "failed" and result.task_states["validate"] == "failed"
    assert all(state in ("upstream_failed", "skipped", "failed", "None") for state in result.task_states.values())
    assert result.returned == {}
    assert tagged_resources("pcflow:stack", "research") == []  # the rehearsal's stack, as aws-gpu's


def test_nightly_backfill_of_two_days_shares_infrastructure_and_keeps_outputs_apart(airflow):
    """Night 2 adopts what night 1 made and stamps its expiry again; each night's model is in S3, and night 2
    starts from night 1's (the profile's nightly.warm_start); once the nights stop, the janitor's rule selects
    the kept network and image when their expiry passes."""
    from pcflow.aws.clients import aws_client
    from pcflow.aws.janitor import run_janitor

    nights = [dt.datetime(2026, 11, 20, 2, tzinfo=dt.UTC), dt.datetime(2026, 11, 21, 2, tzinfo=dt.UTC)]
    expiries = []
    runs = []
    for night, lr in zip(nights, (0.002, 0.004), strict=True):
        runs.append(run_dag("pretrain_nightly", {"hyperparameters": {"epochs": 1, "lr": lr}}, logical_date=night))
        expiries.append(kept_expiries("local"))
    assert [r.state for r in runs] == ["success", "success"]
    assert "delete_cluster" not in runs[0].task_states and "teardown" not in runs[0].task_states
    assert [r.returned["dataset"]["partition"] for r in runs] == ["2026-11-20", "2026-11-21"]
    assert runs[0].returned["network"]["vpc_id"] == runs[1].returned["network"]["vpc_id"]
    assert runs[0].returned["image"]["image_id"] == runs[1].returned["image"]["image_id"]
    assert runs[1].returned["image"]["reused"] and runs[1].returned["cluster"]["adopted"]
    reports = {r.returned["metrics"]["report"] for r in runs}
    assert len(reports) == 2
    s3 = boto3.client("s3")
    for run in runs:
        model = run.returned["metrics"]["model"]["model"]
        assert model == f"s3://pcflow-local-datasets/runs/{run.run_key}/model/model.pt"
        assert s3.head_object(Bucket="pcflow-local-datasets", Key=model.split("/", 3)[3])["ContentLength"] > 0
    # Night 2 continued from night 1 (local.yaml's nightly.warm_start: latest): the model night 1 recorded,
    # with its sha256, put read-only into night 2's run directory; night 2's job loaded its weights and says so.
    first = runs[0].returned["metrics"]["model"]
    warm = {"source": "latest", "uri": first["model"], "sha256": first["model_sha256"], "run": runs[0].run_key}
    assert runs[1].returned["metrics"]["warm_start"] == warm
    assert runs[1].returned["warm_start"]["path"].endswith(f"/pcflow/runs/{runs[1].run_key}/warm_start/model.pt")
    assert runs[1].returned["metrics"]["metrics"]["warm_start_tensors"]["final"] > 0
    (announced,) = asset_events("pcflow-pretrained-encoder-local", runs[1].run_id)
    assert announced["warm_start"] == warm
    bucket, key = runs[1].returned["metrics"]["report"].removeprefix("s3://").split("/", 1)
    assert first["model"] in s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    # Every kept resource's expiry was stamped again by night 2.
    assert set(expiries[0]) == set(expiries[1])
    assert all(expiries[1][r] > expiries[0][r] for r in expiries[0])
    kinds = {kind for kind, _ in expiries[1]}
    assert {"vpc", "subnet", "security-group", "image"} <= kinds
    last = max(expiries[1].values())

    def reaped(now: dt.datetime) -> set[tuple[str, str]]:
        # The janitor asks Airflow whether the run that used them last is over (here: the metadata
        # database, as the page does; the janitor's task asks the execution API).
        from airflow.utils.session import create_session

        from pcflow.ui.runs import dag_run_state

        with create_session() as session:
            report = run_janitor(
                aws_client,
                now=now,
                run_state=dag_run_state(session),
                stack="local",
                dry_run=True,
                handler_sets=("ec2", "images"),
            )
        return {(r.kind, r.id) for r in report.would_delete}

    assert reaped(last - dt.timedelta(minutes=1)) == set()
    assert reaped(last + dt.timedelta(seconds=1)) >= set(expiries[1])


def kept_expiries(stack: str) -> dict[tuple[str, str], dt.datetime]:
    """`pcflow:expires` of every resource the stack keeps between runs (no run tag), by (kind, id)."""
    from pcflow.aws.clients import aws_client
    from pcflow.aws.teardown import Selector, build_handlers
    from pcflow.naming import TAG_EXPIRES, TAG_RUN, parse_expires

    selector = Selector(stack=stack, predicate=lambda tags: TAG_RUN not in tags)
    listed = [r for handler in build_handlers(aws_client, ["ec2", "images"]) for r in handler.list(selector)]
    return {(r.kind, r.id): parse_expires(r.tags[TAG_EXPIRES]) for r in listed if r.tags.get(TAG_EXPIRES)}


def test_sweep_ranks_trials_and_picks_the_best(airflow):
    """Three 1-node trials side by side on the three local nodes (the profile's sweep.max_parallel), each on
    a node of its own; the leaderboard ranks them all."""
    grid = {"lr": [0.002, 0.004, 0.0005]}  # crossed with the one trial: three trials
    conf = {"partition": PARTITION, "trials": [{"seed": 0}], "grid": grid, "tasks_per_node": 1, "nodes": 1, **FAST}
    result = run_dag("pretrain_sweep", conf)
    assert result.state == "success", result.task_states
    assert result.returned["validate"]["sweep"]["parallel"] == 3
    markers = [json.loads((Path(t["run_dir"]) / "exit.json").read_text()) for t in result.returned["train"]["trials"]]
    assert len({m["nodes"] for m in markers}) == 3, markers  # --exclusive: a node of its own each
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
