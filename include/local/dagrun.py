"""Run one of pcflow's DAGs to completion in this process (`dag.test`), as `make demo` and the
end-to-end tests do, and read back what each task returned and what is left tagged in AWS."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: The pools pcflow's DAGs put their cluster and train tasks in (`airflow pools import` format).
POOLS_FILE = REPO / "include" / "pools.json"
#: pcflow's DAG files: Airflow's DAGs folder here (its `dags-folder` bundle).
DAGS_FOLDER = REPO / "dags"
LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"


def airflow_environment(airflow_home: Path) -> dict[str, str]:
    """Settings for an Airflow home dedicated to pcflow's local runs (SQLite metadata, no examples)."""
    return {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO"),
        # pcflow's operators wait in the triggerer when Airflow's default says so, as the providers' do:
        # every pcflow deployment sets it (docker-compose.yaml too).
        "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
        # Every local run parses the DAG files again, and a run may follow another on a changed profile
        # within seconds (the nightly's schedule, for one). By default a serialized DAG younger than 30 s
        # is not rewritten while its DagModel is: the scheduler then read a cron timetable for a DAG the
        # DagModel had scheduled on an asset, and made no run for the asset's event.
        "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "0",
        # The deployment's default profile (the trigger form's, and every scheduled run's): the emulator.
        "PCFLOW_DEFAULT_PROFILE": "local",
    }


def write_profile(directory: Path, name: str, base: str, changes: dict[str, Any]) -> str:
    """Write an admin profile `name` into `directory` (a PCFLOW_PROFILES_DIR): the shipped profile
    `base` with `changes` laid over it (its `overridable` section included). Returns `name`."""
    import yaml

    from pcflow.merge import deep_merge

    document = yaml.safe_load((REPO / "include" / "profiles" / f"{base}.yaml").read_text())
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(deep_merge(document, changes), sort_keys=False))
    return name


def prepare_airflow(airflow_home: Path) -> None:
    """Create (or upgrade) the metadata database and pcflow's pools once; later calls return at once."""
    airflow_home.mkdir(parents=True, exist_ok=True)
    stamp = airflow_home / ".pcflow-db-migrated"
    version = subprocess.run(
        [sys.executable, "-c", "import airflow; print(airflow.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    prepared = f"{version} pools:{hashlib.sha256(POOLS_FILE.read_bytes()).hexdigest()[:12]}"
    if stamp.exists() and stamp.read_text() == prepared:
        return
    env = {**os.environ, **airflow_environment(airflow_home)}
    airflow = str(Path(sys.executable).with_name("airflow"))
    for argv in ([airflow, "db", "migrate"], [airflow, "pools", "import", str(POOLS_FILE)]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)  # said only on failure
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[1:3])} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    stamp.write_text(prepared)


@contextlib.contextmanager
def resume_as_the_triggerer() -> Iterator[None]:
    """`dag.test` resumes a deferred task with the trigger's event alone, dropping the kwargs it deferred
    with (`self.defer(kwargs=...)`); Airflow's triggerer adds the event to them instead
    (`airflow.models.trigger.handle_event_submit`). Within this, runs here resume as in a deployment."""
    from unittest import mock

    from airflow.sdk.definitions import dag as dag_module
    from airflow.sdk.execution_time import supervisor
    from airflow.sdk.serde import serialize

    run_task, run_trigger = supervisor.run_task_in_process, dag_module._run_inline_trigger
    deferred: dict[str, Any] = {}

    def run_task_in_process(*, ti: Any, task: Any) -> Any:
        result = run_task(ti=ti, task=task)
        deferred["msg"] = getattr(result, "msg", None)
        return result

    def run_inline_trigger(trigger: Any, task_sdk_ti: Any) -> Any:
        event, msg = run_trigger(trigger, task_sdk_ti), deferred.get("msg")
        if event is None or msg is None:
            return event
        msg.next_kwargs = {**(msg.next_kwargs or {}), "event": serialize(event.payload)}
        return None  # dag.test then resumes with the deferral's kwargs, now holding the event too

    with (
        mock.patch.object(supervisor, "run_task_in_process", run_task_in_process),
        mock.patch.object(dag_module, "_run_inline_trigger", run_inline_trigger),
    ):
        yield


@contextlib.contextmanager
def dag_bundle(folder: Path) -> Iterator[None]:
    """`dag.test` runs only a DAG of one of Airflow's configured DAG bundles: it writes their DAGs to the
    metadata database first, and refuses to create a run of a DAG not serialized there ("the dag is not
    serialized"). Within this, a folder other than the DAGs folder is one bundle more."""
    from unittest import mock

    from airflow.configuration import conf

    if folder.resolve() == DAGS_FOLDER.resolve():
        yield
        return
    bundles = conf.getjson("dag_processor", "dag_bundle_config_list")
    name = f"{folder.name}-{hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:8]}"
    own = {"name": name, "classpath": LOCAL_BUNDLE, "kwargs": {"path": str(folder)}}
    with mock.patch.dict(os.environ, {"AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([*bundles, own])}):
        yield


@dataclass
class DagRunResult:
    dag_id: str
    run_id: str
    state: str
    task_states: dict[str, str]
    returned: dict[str, Any]
    seconds: float

    @property
    def run_key(self) -> str | None:
        return (self.returned.get("validate") or {}).get("run_key")


def run_dag(
    dag_id: str,
    conf: dict[str, Any] | None = None,
    logical_date: dt.datetime | None = None,
    run_after: dt.datetime | None = None,
    only: Sequence[str] | None = None,
    *,
    dag_folder: Path = DAGS_FOLDER,
) -> DagRunResult:
    """Run the DAG to the end in this process (tasks, deferrals and teardowns included).

    The run id is `manual__<run_after>` (now, unless given): give it to know the run's key beforehand.
    `only`: run these tasks and mark the others successful without running them (`mark_success_pattern`).
    `dag_folder`: where the DAG's file is (a test's own DAG, kept out of the users' `dags/`)."""
    import time

    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(dag_folder)).dags[dag_id]
    started = time.monotonic()
    with resume_as_the_triggerer(), dag_bundle(dag_folder):
        dag_run = dag.test(
            run_conf=conf or {}, logical_date=logical_date, run_after=run_after, mark_success_pattern=_others(only)
        )
    return _result(dag_id, dag_run, time.monotonic() - started)


def _others(only: Sequence[str] | None) -> str | None:
    """A `mark_success_pattern` matching every task id but those in `only` (None: run every task)."""
    import re

    return None if only is None else rf"(?!(?:{'|'.join(re.escape(task) for task in only)})$).*"


def unfinished_tasks(dag_id: str, run_id: str) -> list[str]:
    """The run's tasks a dead worker left in flight (running, deferred, queued, waiting for a retry)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    in_flight = {
        TaskInstanceState.RUNNING,
        TaskInstanceState.DEFERRED,
        TaskInstanceState.QUEUED,
        TaskInstanceState.SCHEDULED,
        TaskInstanceState.UP_FOR_RETRY,
        TaskInstanceState.RESTARTING,
    }
    with create_session() as session:
        dag_run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        if dag_run is None:
            raise ValueError(f"no run {run_id!r} of DAG {dag_id!r}")
        return sorted(ti.task_id for ti in dag_run.get_task_instances(session=session) if ti.state in in_flight)


def resume_dag_run(dag_id: str, run_id: str, *, retry: Sequence[str]) -> DagRunResult:
    """Carry on, in this process, a run whose process died (a worker crash): the tasks in `retry` are
    failed, as the scheduler does with a dead worker's task, and cleared for another try, as a retry or
    a user's "Clear" does; then the run goes on to its end. It keeps its run id (so its run key), its
    finished tasks and what they returned, and its tasks' state stores."""
    from airflow.models.taskinstance import clear_task_instances
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState

    with create_session() as session:
        dag_run = _find_run(session, dag_id, run_id)
        tis = [ti for ti in dag_run.get_task_instances(session=session) if ti.task_id in retry]
        for ti in tis:
            ti.state = TaskInstanceState.FAILED
        clear_task_instances(tis, session, dag_run_state=False)
    return run_existing_dag_run(dag_id, run_id)


def run_existing_dag_run(dag_id: str, run_id: str, only: Sequence[str] | None = None) -> DagRunResult:
    """Run, in this process, a run that exists already (one the scheduler created, one being resumed) to
    its end, as it is: its run id, type, conf and the asset events it consumed. `only`: as for run_dag."""
    import time
    from unittest import mock

    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.definitions.dag import SerializedDAG
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState

    def existing(*, dag: Any, session: Any, **_: Any) -> Any:
        dag_run = _find_run(session, dag_id, run_id)
        dag_run.dag = dag
        return dag_run

    with create_session() as session:
        dag_run = _find_run(session, dag_id, run_id)
        dag_run.state = DagRunState.RUNNING
        logical_date, run_after = dag_run.logical_date, dag_run.run_after
    dag = DagBag(dag_folder=str(DAGS_FOLDER)).dags[dag_id]
    started = time.monotonic()
    # `dag.test` is the loop that runs a DAG run to its end; here it takes the existing run rather than
    # replacing it with a new one (and clearing it).
    with (
        mock.patch("airflow.models.dagrun.get_or_create_dagrun", side_effect=existing),
        mock.patch.object(SerializedDAG, "clear_dags"),
        resume_as_the_triggerer(),
    ):
        dag_run = dag.test(logical_date=logical_date, run_after=run_after, mark_success_pattern=_others(only))
    return _result(dag_id, dag_run, time.monotonic() - started)


def _find_run(session: Any, dag_id: str, run_id: str) -> Any:
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    dag_run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if dag_run is None:
        raise ValueError(f"no run {run_id!r} of DAG {dag_id!r}")
    return dag_run


def _result(dag_id: str, dag_run: Any, seconds: float) -> DagRunResult:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(XComModel)
            .filter(XComModel.dag_id == dag_id, XComModel.run_id == dag_run.run_id, XComModel.key == "return_value")
            .all()
        )
        returned = {row.task_id: row.value for row in rows}
        states = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances(session=session)}
    return DagRunResult(dag_id, dag_run.run_id, str(dag_run.state), states, returned, seconds)


def tagged_resources(tag_key: str, tag_value: str) -> list[str]:
    """ARNs/ids still carrying the tag, from the tagging API and from direct EC2 describe calls."""
    import boto3

    found = set()
    tagging = boto3.client("resourcegroupstaggingapi")
    for page in tagging.get_paginator("get_resources").paginate(TagFilters=[{"Key": tag_key, "Values": [tag_value]}]):
        # Terminated instances and deleted NAT gateways keep their tags for a while: judged by their
        # state below instead.
        arns = (item["ResourceARN"] for item in page["ResourceTagMappingList"])
        found.update(arn for arn in arns if ":instance/" not in arn and ":natgateway/" not in arn)
    ec2 = boto3.client("ec2")
    tag_filter = [{"Name": f"tag:{tag_key}", "Values": [tag_value]}]
    for call, key, ident in (
        (ec2.describe_vpcs, "Vpcs", "VpcId"),
        (ec2.describe_subnets, "Subnets", "SubnetId"),
        (ec2.describe_security_groups, "SecurityGroups", "GroupId"),
        (ec2.describe_internet_gateways, "InternetGateways", "InternetGatewayId"),
        (ec2.describe_route_tables, "RouteTables", "RouteTableId"),
        (ec2.describe_vpc_endpoints, "VpcEndpoints", "VpcEndpointId"),
    ):
        # Deleted endpoints (and other resources AWS shows for a while after deletion) do not count.
        found.update(
            item[ident] for item in call(Filters=tag_filter)[key] if item.get("State") not in ("deleted", "Deleted")
        )
    gateways = ec2.describe_nat_gateways(Filter=tag_filter)["NatGateways"]
    found.update(g["NatGatewayId"] for g in gateways if g["State"] not in ("deleted", "deleting"))
    for reservation in ec2.describe_instances(Filters=tag_filter)["Reservations"]:
        found.update(i["InstanceId"] for i in reservation["Instances"] if i["State"]["Name"] != "terminated")
    return sorted(found)


def remove_stack(stack: str) -> list[str]:
    """Delete everything of a stack, kept-on-purpose parts included (shared network, images and their
    snapshots); the stack leaves the data buckets it uses, and a bucket pcflow created goes with its
    last user (another stack's bucket stays). Returns what is still tagged with the stack."""
    import pcflow.cluster.teardown  # noqa: F401 - registers the "pcluster" handlers
    from pcflow.aws.buckets import bucket_users, release_bucket
    from pcflow.aws.clients import DEFAULT_AWS_CONN_ID, aws_client
    from pcflow.aws.network_users import drop_reference, references
    from pcflow.aws.teardown import Selector, teardown

    def clients(service: str) -> Any:
        return aws_client(service, aws_conn_id=DEFAULT_AWS_CONN_ID)

    teardown(clients, Selector(stack=stack), handler_sets=("pcluster", "ec2", "fsx", "images"), pass_delay=0)
    s3 = clients("s3")
    for bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        try:
            for ref in references(s3, bucket, stack):  # its network is gone: so are the runs' references to it
                drop_reference(s3, bucket, stack, ref.run)
            if stack in bucket_users(s3, bucket) and release_bucket(s3, bucket, stack):
                delete_bucket(s3, bucket)
        except s3.exceptions.NoSuchBucket:  # deleted meanwhile
            continue
    return tagged_resources("pcflow:stack", stack)


def delete_bucket(s3: Any, bucket: str) -> None:
    """Delete a bucket with everything in it, every version and delete marker included (the dataset
    bucket is versioned). Local tooling only: pcflow itself never deletes a data bucket."""
    versions = [
        {"Key": v["Key"], "VersionId": v["VersionId"]}
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket)
        for v in page.get("Versions", []) + page.get("DeleteMarkers", [])
    ]
    for start in range(0, len(versions), 1000):  # DeleteObjects takes at most 1,000 keys
        failed = s3.delete_objects(Bucket=bucket, Delete={"Objects": versions[start : start + 1000], "Quiet": True})
        if failed.get("Errors"):
            raise RuntimeError(f"could not empty bucket {bucket}: {failed['Errors'][:3]}")
    s3.delete_bucket(Bucket=bucket)
