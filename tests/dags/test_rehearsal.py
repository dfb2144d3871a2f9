"""The production profile, rehearsed: `pretrain` with `aws-gpu-rehearsal` (aws-gpu.yaml plus only what the
emulator needs) end to end on the local stack. The real pcluster dry run, the pcluster stand-in's cluster
(the local Slurm: head node 127.0.0.1, its host key read from the head node's console output), the FSx
stand-in's /fsx filled from the dataset's S3 partition, torchrun, the export before delete, teardown.

One run serves the module (CI time): it is killed twice on the way, as workers die, while the cluster
is being created and while FSx exports, and carried on each time; the resources are counted by tag in
moto just before the cluster is deleted. About 5 minutes on the 2-core machine."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from dagprocess import kill_when, manual_run, slurm, spawn
from dagrun import (
    DagRunResult,
    remove_stack,
    resume_dag_run,
    run_dag,
    tagged_resources,
    unfinished_tasks,
    write_profile,
)
from many_runs import runs_for, stack_network_left, start, summary
from rehearsal import PROFILE, iam_check, own_stack, rehearsal_facts
from stacktools import tell_standin

from pcflow.aws.calllog import paused, recording
from pcflow.aws.storage import TASK_KEY_TAG
from pcflow.cluster.operators import DeleteClusterOperator
from pcflow.dataset.manifest import read_manifest
from pcflow.naming import run_key
from pcflow.pipeline.settings import cluster_name

pytestmark = [pytest.mark.stack, pytest.mark.slow, pytest.mark.timeout(1500)]
PARTITION = "e2e"


@dataclass
class Rehearsed:
    result: DagRunResult
    facts: dict[str, Any]
    in_flight_at_kills: list[list[str]]
    before_delete: dict[str, Any]  # moto's resources by kind and the FSx mount, as the cluster was deleted
    stack: str
    iam: dict[str, Any]  # every AWS call of the runs, pcluster's included, judged against the shipped policies
    concurrent: dict[str, Any]  # the killed run and the two that ran beside it (many_runs.summary)
    network_left: list[str]  # the stack's network once all three gave it back


@paused()
def cluster_stack_exists(name: str) -> bool:
    stacks = boto3.client("cloudformation").list_stacks()["StackSummaries"]
    return any(s["StackName"] == name and s["StackStatus"] != "DELETE_COMPLETE" for s in stacks)


@paused()
def export_started(key: str) -> bool:
    tasks = boto3.client("fsx").describe_data_repository_tasks()["DataRepositoryTasks"]
    wanted = f"{key}/export-before-delete"
    return any({t["Key"]: t["Value"] for t in task.get("Tags", [])}.get(TASK_KEY_TAG) == wanted for task in tasks)


@paused()  # the test's lookups, not the run's calls
def census(key: str, stack: str, job_name: str) -> dict[str, int]:
    """What exists, by kind, counted by pcflow's tags (the run's, or the stack's for what it keeps and shares:
    image, network)."""
    ec2, fsx = boto3.client("ec2"), boto3.client("fsx")
    by_run = [{"Name": "tag:pcflow:run", "Values": [key]}]
    network = [{"Name": "tag:pcflow:stack", "Values": [stack]}, {"Name": "tag:pcflow:component", "Values": ["network"]}]
    builders = [{"Name": "tag:pcflow:stack", "Values": [stack]}, {"Name": "tag:pcflow:component", "Values": ["ami"]}]

    def instances(filters: list[dict]) -> list[dict]:
        return [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]

    def node_type(instance: dict) -> str:
        return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}.get("parallelcluster:node-type", "other")

    live = Counter(node_type(i) for i in instances(by_run) if i["State"]["Name"] != "terminated")
    file_systems = [
        fs for fs in fsx.describe_file_systems()["FileSystems"] if {"Key": "pcflow:run", "Value": key} in fs["Tags"]
    ]
    gateways = ec2.describe_nat_gateways(Filter=network)["NatGateways"]
    stacks = boto3.client("cloudformation").describe_stacks()["Stacks"]
    return {
        "vpc": len(ec2.describe_vpcs(Filters=network)["Vpcs"]),
        "nat-gateway": sum(g["State"] not in ("deleted", "deleting") for g in gateways),
        "image": len(ec2.describe_images(Owners=["self"], Filters=builders[:1])["Images"]),
        "image-builder": len(instances(builders)),  # terminated ones included: ever launched
        "cluster-stack": sum({"Key": "pcflow:run", "Value": key} in s["Tags"] for s in stacks),
        "head-node": live["HeadNode"],
        "compute-node": live["Compute"],
        "file-system": len(file_systems),
        "slurm-job": len(slurm("sacct", "-n", "-X", "-S", "now-1hours", "--name", job_name, "-o", "JobID")),
    }


def mount_contents(fsx_dir: Path, partition: str) -> dict[str, str]:
    """sha256 of each file under the partition in the FSx stand-in's directory (the nodes' /fsx)."""
    root = fsx_dir / partition
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


@pytest.fixture(scope="module")
def profiles(airflow, tmp_path_factory) -> Path:
    """The admin's profiles directory: each run of the module in a stack of its own."""
    directory = tmp_path_factory.mktemp("profiles")
    os.environ["PCFLOW_PROFILES_DIR"] = str(directory)  # the module's Airflow is its own (restored after)
    return directory


def rehearse(local_stack, stack: str, *, conf: dict, run_id: str, when: dt.datetime, log: Path):
    """The run, killed twice and resumed; the test's own lookups beside it are not recorded."""
    key = run_key("pretrain", run_id)
    kills = []
    started = spawn("start", "pretrain", run_id, when, log=log, conf=conf)
    kill_when(started, lambda: cluster_stack_exists(cluster_name(stack, key)), log, "the cluster's creation")
    kills.append(unfinished_tasks("pretrain", run_id))
    # Beside it from here on (its image exists): a second `pretrain` run and a 4-trial sweep on the same stack.
    others = start_others(conf, log.parent)
    # The run's next FSx task, the export before delete, runs for 5 s: the kill lands while it does.
    tell_standin(local_stack, "fsx/task-outcomes", {"results": [{"Lifecycle": "SUCCEEDED", "Seconds": 5}]})
    resumed = spawn("resume", "pretrain", run_id, when, log=log)
    kill_when(resumed, lambda: export_started(key), log, "the FSx export before delete")
    kills.append(unfinished_tasks("pretrain", run_id))
    seen: dict[str, Any] = {}
    execute = DeleteClusterOperator.execute

    def look_then_delete(self, context):
        if not seen:
            seen["census"] = census(key, stack, f"{key}.train")
            seen["mount"] = mount_contents(local_stack.state_dir / "fsx", PARTITION)
        return execute(self, context)

    DeleteClusterOperator.execute = look_then_delete
    try:
        result = resume_dag_run("pretrain", run_id, retry=unfinished_tasks("pretrain", run_id))
    finally:
        DeleteClusterOperator.execute = execute
    return result, kills, seen, {"pretrain-1": result, **finish(others)}


def start_others(conf: dict, logs: Path) -> dict[str, tuple[Any, Path]]:
    """The other runs of `make rehearsal` (many_runs.RUNS), each in a process of its own, on the test's stack."""
    when = dt.datetime.now(dt.UTC).replace(microsecond=0)
    return {
        name: start(name, dag_id, {**run_conf, **conf}, when + dt.timedelta(seconds=i), logs)
        for i, (name, dag_id, run_conf) in enumerate(runs_for(conf["profile"])[1:])
    }


def finish(started: dict[str, tuple[Any, Path]]) -> dict[str, DagRunResult]:
    """Their results once their processes have ended (a process that left none: its log's tail fails the test)."""
    results = {}
    for name, (process, out) in started.items():
        process.wait(timeout=1200)
        if not out.exists():
            pytest.fail(f"{name} left no result:\n{out.with_suffix('.log').read_text(errors='replace')[-3000:]}")
        results[name] = DagRunResult(**json.loads(out.read_text()))
    return results


@pytest.fixture(scope="module")
def rehearsed(profiles, local_stack, pcluster_cli, tmp_path_factory) -> Rehearsed:
    stack = f"r{uuid.uuid4().hex[:8]}"
    conf = {"profile": write_profile(profiles, f"rehearsal-{stack}", PROFILE, own_stack(stack)), "partition": PARTITION}
    run_id, when = manual_run("pretrain")
    log = tmp_path_factory.mktemp("rehearsal") / "killed-runs.log"
    with recording(log.with_name("aws-calls.jsonl")) as calls:
        result, kills, seen, runs = rehearse(local_stack, stack, conf=conf, run_id=run_id, when=when, log=log)
    with paused():
        concurrent, network_left = summary(runs), stack_network_left(stack)
    yield Rehearsed(result, rehearsal_facts(result), kills, seen, stack, iam_check(calls), concurrent, network_left)
    assert remove_stack(stack) == []  # what the stack keeps on purpose: its image and data bucket


def test_aws_gpu_runs_end_to_end_on_the_rehearsal(rehearsed, local_stack):
    result, facts, out = rehearsed.result, rehearsed.facts, rehearsed.result.returned
    assert result.state == "success", result.task_states
    run = out["validate"]
    assert run["cluster"]["provider"] == "parallelcluster" and facts["launcher"] == "torchrun"
    assert len(facts["nodes"]) == len(set(facts["nodes"])) == run["training"]["nodes"]
    # The real dry run judged the config (the stand-in hands dry runs to the real CLI).
    assert "CustomAmiTagValidator" in {m["type"] for m in out["validate_cluster"]["validation_messages"]}
    # SSH to the head node: from the profile's CIDR (ParallelCluster's group) and the network's head group.
    head = yaml.safe_load(out["validate_cluster"]["config"])["HeadNode"]
    assert head["Ssh"]["AllowedIps"] == run["network"]["ssh_ingress_cidrs"][0] == "127.0.0.1/32"
    assert head["Networking"]["AdditionalSecurityGroups"] == [out["network"]["head_security_group_id"]]
    check_node_setup(out, run)
    # The cluster's head node is the local one, its host key read from its console output and pinned.
    host_key = " ".join(local_stack.slurm_connection["extra"]["host_key"].split()[:2])
    assert out["cluster"]["head_node"] == {"address": "127.0.0.1", "host_key": host_key}
    # Shards, and the FSx mount held exactly what the manifest lists.
    dataset = out["dataset"]
    manifest = read_manifest(boto3.client("s3"), dataset["bucket"], dataset["root"])
    assert facts["dataset_mode"] == "shard" and facts["shard_count"] == manifest["object_count"] > 0
    listed = {o["key"]: o["sha256"] for o in manifest["objects"]}
    mounted = rehearsed.before_delete["mount"]
    assert {k: mounted.get(k) for k in listed} == listed
    # The export before delete ran and wrote the run's files (its log among them) to the bucket.
    assert [e["lifecycle"] for e in facts["fsx_exports"]] == ["SUCCEEDED"]
    prefix = f"{run['dataset']['prefix']}/pcflow/runs/{result.run_key}/train/"
    exported = boto3.client("s3").list_objects_v2(Bucket=dataset["bucket"], Prefix=prefix).get("Contents", [])
    assert {f"{prefix}job.log", f"{prefix}metrics.jsonl"} <= {o["Key"] for o in exported}
    assert tagged_resources("pcflow:run", result.run_key) == []
    # The job ran in an environment verified against the record its build wrote (`make payload-env` here,
    # the bake on aws-gpu), and the model it left is recorded with its sha256.
    assert out["check_environment"]["dir"].endswith("/.venv-payload") and len(out["check_environment"]["record"]) == 64
    assert len(out["metrics"]["model"]["model_sha256"]) == 64


def test_two_pretrain_runs_and_a_sweep_at_once_share_one_network(rehearsed):
    """Issue 27's must-show, on the rehearsal's stack: the killed run, a second `pretrain` run and a 4-trial sweep
    ran at once; one network (made by the first, referenced by all three, deleted by the last to leave), a
    ParallelCluster cluster of each run's own, the image reused, nothing of theirs left."""
    counts, runs = rehearsed.concurrent["concurrent"], rehearsed.concurrent["runs"]
    assert {k: counts[k] for k in ("runs", "succeeded", "networks_created")} == {
        "runs": 3,
        "succeeded": 3,
        "networks_created": 1,
    }
    assert len({run["network"]["vpc_id"] for run in runs.values()}) == 1
    assert len({run["cluster"]["name"] for run in runs.values()}) == 3  # and the resumed run adopted its own
    assert counts["clusters_created"] >= 2 and {run["cluster"]["provider"] for run in runs.values()} == {
        "parallelcluster"
    }
    assert runs["pretrain-2"]["image"]["reused"] and runs["sweep"]["image"]["reused"]
    assert [run["released_network"]["network_deleted"] for run in runs.values()].count(True) == 1  # the last user
    assert all(run["time_to_first_job_s"] for run in runs.values())
    assert [run["left_tagged_with_run_key"] for run in runs.values()] == [[], [], []]
    assert rehearsed.network_left == []


def check_node_setup(out: dict, run: dict) -> None:
    """The jobs' account on every node (issue 24): the config the real dry run judged and the one the
    cluster was made with both run the same node setup script on the head node and on each queue, and
    that object is in the stack's bucket with the sha256 its key names. The real dry run looked it up
    (UrlValidator's HeadObject: nothing said about it); the stand-in's nodes downloaded it with their
    S3Access (the cluster became ready). Not run here: tests/pcflow/cluster/test_node_setup_script.py."""
    config = yaml.safe_load(out["validate_cluster"]["config"])
    made = yaml.safe_load(boto3.client("s3").get_object(**s3_location(out["cluster"]["config_s3_uri"]))["Body"].read())
    actions = [n["CustomActions"]["OnNodeConfigured"] for c in (config, made) for n in node_groups(c)]
    groups = len(node_groups(config))  # the head node and each queue (a capacity fallback's too)
    assert groups >= 2 and len(actions) == 2 * groups and all(action == actions[0] for action in actions), actions
    job = run["cluster"]
    pool = [str(job["job_accounts"])] if job["job_accounts"] > 1 else []
    assert actions[0]["Args"] == [job["job_user"], str(job["config"]["job_uid"]), "ec2-user", *pool]
    script = boto3.client("s3").get_object(**s3_location(actions[0]["Script"]))["Body"].read()
    assert s3_location(actions[0]["Script"])["Key"] == f"pcflow/node-setup/{hashlib.sha256(script).hexdigest()}.sh"
    assert script.startswith(b"#!/bin/sh\n# pcflow's node setup")
    assert not [m for m in out["validate_cluster"]["validation_messages"] if "node-setup" in m["message"]]


def node_groups(config: dict) -> list[dict]:
    return [config["HeadNode"], *config["Scheduling"]["SlurmQueues"]]


def s3_location(uri: str) -> dict[str, str]:
    bucket, key = uri.removeprefix("s3://").split("/", 1)
    return {"Bucket": bucket, "Key": key}


def test_every_aws_call_of_the_rehearsal_is_allowed_by_the_shipped_policies(rehearsed):
    """Each call the runs made (the killed ones', the pcluster CLI's, the stand-in's for the cluster) was
    recorded and judged against the IAM policy of whoever makes it on AWS: none was denied."""
    iam = rehearsed.iam
    assert iam["calls"] > 0 and iam["denied"] == 0, iam.get("denials")


def test_killed_twice_and_resumed_creates_nothing_twice(rehearsed):
    """Killed while the cluster was being created, then while FSx exported: each resumed run adopted
    what the dead one made. Counted by tag in moto just before the cluster's deletion."""
    first, second = rehearsed.in_flight_at_kills
    assert first and "delete_cluster" in second, rehearsed.in_flight_at_kills
    nodes = rehearsed.result.returned["validate"]["training"]["nodes"]
    expected = {"vpc": 1, "nat-gateway": 1, "image": 1, "image-builder": 1, "cluster-stack": 1, "head-node": 1}
    expected |= {"compute-node": nodes, "file-system": 1, "slurm-job": 1}
    assert rehearsed.before_delete["census"] == expected
    assert rehearsed.result.state == "success"
    assert tagged_resources("pcflow:run", rehearsed.result.run_key) == []


@dataclass
class Nights:
    runs: list[DagRunResult]
    cluster_after_night_2: bool
    stack: str


@pytest.fixture(scope="module")
def two_nights(profiles, local_stack, pcluster_cli) -> Nights:
    """`pretrain_nightly` on the rehearsal of aws-gpu for two nights, in a stack of its own (one epoch a
    night: what is kept matters here, not the model)."""
    stack = f"n{uuid.uuid4().hex[:8]}"
    changes = {**own_stack(stack), "training": {"hyperparameters": {"epochs": 1}}}
    profile = write_profile(profiles, f"nightly-{stack}", PROFILE, changes)
    nights = [dt.datetime(2026, 11, 20, 2, tzinfo=dt.UTC), dt.datetime(2026, 11, 21, 2, tzinfo=dt.UTC)]
    runs = [run_dag("pretrain_nightly", {"profile": profile}, logical_date=night) for night in nights]
    nights_result = Nights(runs, cluster_stack_exists(f"pcflow-{stack}-cluster"), stack)
    yield nights_result
    remove_stack(stack)  # the test removes it and checks; this is for a test that failed before


def test_nightly_keeps_its_cluster_and_night_2_adopts_it(two_nights):
    """aws-gpu's nightly keeps network, image and ParallelCluster cluster between nights: night 2 adopts
    the cluster without creating one, each night's model is in S3, night 2 starts from night 1's (the
    profile's nightly.warm_start), and the cluster is still there after night 2 until the stack is torn down."""
    first, second = two_nights.runs
    assert [first.state, second.state] == ["success", "success"], [first.task_states, second.task_states]
    assert "delete_cluster" not in first.task_states and "delete_cluster" not in second.task_states
    assert not first.returned["cluster"].get("adopted") and second.returned["cluster"]["adopted"]
    assert first.returned["cluster"]["name"] == second.returned["cluster"]["name"]
    assert second.returned["image"]["reused"]
    assert first.returned["network"]["vpc_id"] == second.returned["network"]["vpc_id"]
    s3 = boto3.client("s3")
    models = [run.returned["metrics"]["model"]["model"] for run in two_nights.runs]
    assert len(set(models)) == 2
    for run, model in zip(two_nights.runs, models, strict=True):
        bucket, key = model.removeprefix("s3://").split("/", 1)
        assert key.startswith(f"runs/{run.run_key}/model/") and s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
    # aws-gpu's nightly.warm_start: latest: night 1 (a new stack) from scratch, night 2 from night 1's model,
    # verified against the sha256 night 1 recorded; its job loaded the weights from the FSx stand-in.
    assert first.returned["metrics"]["warm_start"] == {"source": "latest", "uri": None, "sha256": None, "run": None}
    assert second.returned["metrics"]["warm_start"] == {
        **{"source": "latest", "uri": models[0], "run": first.run_key},
        "sha256": first.returned["metrics"]["model"]["model_sha256"],
    }
    assert second.returned["metrics"]["metrics"]["warm_start_tensors"]["final"] > 0
    assert two_nights.cluster_after_night_2
    assert remove_stack(two_nights.stack) == []
    assert not cluster_stack_exists(f"pcflow-{two_nights.stack}-cluster")
