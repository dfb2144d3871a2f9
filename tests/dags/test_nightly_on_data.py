"""Lineage on the local stack (pcflow/lineage.py), read where the Airflow UI's Assets view reads it (the
REST API's assets and asset events): the dataset stage's event for a partition it filled with new
content, with the partition's extras; and a nightly scheduled on data (its profile's `nightly.schedule:
data`), for which the scheduler's own code makes a DagRun when that event arrives. The run trains on the
partition the event names, and its own load of it, finding the same bytes, announces nothing: no loop.
Only the data stages run (the others are marked successful), on two small files, so both runs take
seconds; the model's event, which names its partition, is checked by the end-to-end run of
tests/dags/test_dags.py."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from dagrun import delete_bucket, run_dag, run_existing_dag_run

pytestmark = pytest.mark.stack
#: The stages that load a partition (validate resolves which one); the others are marked successful.
DATA_STAGES = ("validate", "ensure_dataset_bucket", "dataset_source", "dataset")
NIGHTLY = "pretrain_nightly"
BUCKET, PREFIX = "pcflow-local-datasets", "datasets/lineage"


def test_new_data_announces_its_partition_and_starts_the_nightly_on_it(airflow, admin_profiles, monkeypatch, tmp_path):
    for name in ("a.txt", "b.txt"):  # a few bytes of data: what is tested is the events, not the load
        (tmp_path / "data" / "class0").mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / "class0" / name).write_text(name)
    settings = {"nightly": {"schedule": "data"}, "dataset": {"source": str(tmp_path / "data"), "prefix": PREFIX}}
    monkeypatch.setenv("PCFLOW_DEFAULT_PROFILE", admin_profiles.make("local", settings))  # read at parse time
    partition = f"lineage-{uuid.uuid4().hex[:12]}"  # new to the stack: its load is new content
    with nightly_unpaused(), api_client() as client:
        loaded = run_dag("pretrain", {"partition": partition}, only=DATA_STAGES)
        assert loaded.state == "success", loaded.task_states
        load = loaded.returned["dataset"]
        (event,) = api_dataset_events("local", loaded.run_id, client)
        assert event["extra"] == {
            "partition": partition,
            "uri": f"s3://{BUCKET}/{PREFIX}/{partition}/",
            "manifest_uri": f"s3://{BUCKET}/{PREFIX}/{partition}/manifest.json",
            "content_hash": load["content_hash"],
            "mode": "sync",
            "object_count": load["object_count"],
            "bytes": load["bytes"],
            "samples": load["samples"],
        }
        assert event["source_task_id"] == "dataset" and load["manifest_written"]

        (created,) = create_dag_runs_as_the_scheduler()
        assert created["dag_id"] == NIGHTLY and created["run_type"] == "asset_triggered"
        assert max(created["consumed_events"]) == event["id"]  # the newest it consumed (all of them, in CI)
        nightly = run_existing_dag_run(NIGHTLY, created["run_id"], only=DATA_STAGES)
        assert nightly.state == "success", nightly.task_states
        assert nightly.returned["dataset"]["partition"] == partition  # the partition the event named
        assert nightly.returned["dataset"]["content_hash"] == load["content_hash"]
        assert not nightly.returned["dataset"]["manifest_written"]
        assert api_dataset_events("local", nightly.run_id, client) == []  # the same bytes: nothing announced
        assert create_dag_runs_as_the_scheduler() == []  # so the nightly does not start itself again
    delete_bucket(boto3.client("s3"), BUCKET)  # the one thing these runs made (the module checks it)


@contextlib.contextmanager
def nightly_unpaused() -> Iterator[None]:
    """The DAG files parsed and written to the metadata database as the DAG processor does (the nightly
    scheduled as the default profile says), the nightly unpaused with nothing queued; paused again
    afterwards, nothing queued."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    manager = DagBundlesManager()
    manager.sync_bundles_to_db()
    for bundle in manager.get_all_dag_bundles():
        bundle.initialize()
        bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
        sync_bag_to_db(bag, bundle.name, bundle.version)
    reset_the_nightly(paused=False)
    try:
        yield
    finally:
        reset_the_nightly(paused=True)


def reset_the_nightly(*, paused: bool) -> None:
    """Pause or unpause the nightly and drop what is queued for it: its asset events, and a run an earlier
    failed attempt left queued (it would hold the nightly's one slot, `max_active_runs=1`)."""
    from airflow.models.asset import AssetDagRunQueue
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(DagModel).filter(DagModel.dag_id == NIGHTLY).update({DagModel.is_paused: paused})
        session.query(AssetDagRunQueue).filter(AssetDagRunQueue.target_dag_id == NIGHTLY).delete()
        unfinished = DagRun.state.in_(("queued", "running"))
        session.query(DagRun).filter(DagRun.dag_id == NIGHTLY, unfinished).delete(synchronize_session=False)


def create_dag_runs_as_the_scheduler() -> list[dict[str, Any]]:
    """One pass of the scheduler loop's DagRun creation (`SchedulerJobRunner._create_dagruns_for_dags`):
    the runs it made, with the ids of the asset events each consumed."""
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.sqlalchemy import prohibit_commit

    runner = SchedulerJobRunner(job=Job())
    with create_session() as session:
        before = {run.id for run in session.query(DagRun.id)}
        with prohibit_commit(session) as guard:
            runner._create_dagruns_for_dags(guard, session)
        made = session.query(DagRun).filter(DagRun.id.notin_(before)).all()
        return [
            {
                "dag_id": run.dag_id,
                "run_id": run.run_id,
                "run_type": str(run.run_type),
                "consumed_events": [e.id for e in run.consumed_asset_events],
            }
            for run in made
        ]


def api_dataset_events(stack: str, run_id: str, client: Any) -> list[dict[str, Any]]:
    """The events of the stack's dataset Asset from one run, through the REST API the UI's Assets view
    calls (`/api/v2/assets`, `/api/v2/assets/events`)."""
    assets = client.get("/api/v2/assets", params={"name_pattern": f"pcflow-dataset-{stack}"}).json()["assets"]
    (asset,) = [a for a in assets if a["name"] == f"pcflow-dataset-{stack}"]
    assert [alias["name"] for alias in asset["aliases"]] == ["pcflow-dataset"]
    query = {"asset_id": asset["id"], "source_run_id": run_id}
    return client.get("/api/v2/assets/events", params=query).json()["asset_events"]


@contextlib.contextmanager
def api_client() -> Iterator[Any]:
    """Airflow's api-server app, served in this process, its simple auth manager letting everyone in as admin."""
    from secrets import token_hex
    from unittest import mock

    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    # The in-process app needs a JWT secret, as every api-server does; a fresh AIRFLOW_HOME has none yet.
    app_env = {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True", "AIRFLOW__API_AUTH__JWT_SECRET": token_hex(32)}
    with mock.patch.dict("os.environ", app_env):
        with TestClient(create_app()) as client:
            yield client
