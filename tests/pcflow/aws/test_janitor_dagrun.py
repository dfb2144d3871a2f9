"""The janitor and a DAG run that outlives its resources' expiry, in Airflow (its metadata database, the
Task SDK's execution API) against the moto server: while the run is running the janitor deletes
nothing of it, and reports why; once the run has finished it deletes the run's network."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import boto3
from dagrun import run_dag, tagged_resources

from pcflow.naming import run_key

DAGS = Path(__file__).parent / "janitor_dags"


def ids(found: list[str]) -> set[str]:
    """Resource ids from `tagged_resources`' ARNs and ids alike."""
    return {item.rsplit("/", 1)[-1] for item in found}


def test_the_janitor_keeps_an_expired_run_while_it_runs_and_reaps_it_once_finished(airflow, stack):
    started = dt.datetime.now(dt.UTC).replace(microsecond=0)
    run = run_dag("janitor_outlived", {"stack": stack}, run_after=started, dag_folder=DAGS)
    assert run.state == "success", run.task_states
    key = run_key("janitor_outlived", run.run_id)
    made = ids(tagged_resources("pcflow:run", key))
    assert any(i.startswith("vpc-") for i in made) and any(i.startswith("subnet-") for i in made)
    [vpc] = boto3.client("ec2").describe_vpcs(Filters=[{"Name": "tag:pcflow:run", "Values": [key]}])["Vpcs"]
    vpc_tags = {t["Key"]: t["Value"] for t in vpc["Tags"]}
    assert vpc_tags["pcflow:dag-id"] == "janitor_outlived" and vpc_tags["pcflow:run-id"] == run.run_id
    assert dt.datetime.fromisoformat(vpc_tags["pcflow:expires"]) < started  # expired when it was made
    # The janitor ran while the run was running: it deleted nothing and said why.
    while_running = run.returned["reap"]
    assert while_running["dry_run"] is False and while_running["deleted"] == []
    assert while_running["would_delete"] == [] and while_running["remaining"] == []
    kept = {line["id"]: line["why"] for line in while_running["kept"]}
    assert made <= set(kept)
    assert all(kept[i].startswith(f"kept: run active (janitor_outlived {run.run_id} is running") for i in made)
    assert ids(tagged_resources("pcflow:run", key)) == made
    # The run has finished: the next janitor (a run of the DAG with `reap` alone) deletes its network.
    later = run_dag(
        "janitor_outlived",
        {"stack": stack},
        run_after=started + dt.timedelta(minutes=1),
        only=["reap"],
        dag_folder=DAGS,
    )
    assert later.state == "success", later.task_states
    after = later.returned["reap"]
    assert {d["kind"] for d in after["deleted"]} >= {"vpc", "subnet"}
    assert after["remaining"] == [] and tagged_resources("pcflow:run", key) == []
