"""Ensure / adopt / refuse / fail / update / delete of the ParallelCluster provider with the local stack's
STAND-IN pcluster CLI (include/local/pcluster_standin.py: pcluster's documented JSON; the stack, its head
node and FSx file system are real moto resources, the FSx data repository tasks moto_standins.py's, and
the cluster is the local Slurm). Emulated because a real create-cluster cannot finish on moto (its CDK
template is refused by moto's CloudFormation). The deferrable waits run the real triggers' waiters
against moto's CloudFormation and FSx."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from stacktools import tell_standin
from taskcontext import make_context

from pcflow.aws.clients import aws_client as clients
from pcflow.aws.storage import TASK_KEY_TAG, DataRepositoryTaskFailed
from pcflow.aws.teardown import Selector, teardown
from pcflow.aws.waits import FsxHook
from pcflow.cluster import teardown as cluster_teardown
from pcflow.cluster.operators import DeleteClusterOperator, EnsureClusterOperator
from pcflow.cluster.parallelcluster import ClusterCreateFailed, ClusterMismatch, HostKeyUnavailable
from pcflow.cluster.providers import delete_cluster, ensure_cluster, make_provider, validate_cluster
from pcflow.cluster.triggers import ClusterStackTrigger

pytestmark = pytest.mark.stack


def stacks_named(name: str) -> list[dict]:
    cfn = clients("cloudformation")
    return [s for s in cfn.describe_stacks()["Stacks"] if s["StackName"] == name]


def wait_like_trigger(trigger) -> dict:
    """The trigger's own botocore waiter (CloudFormation's, or pcflow's FSx one), run synchronously."""
    if trigger.waiter_name == "DataRepositoryTaskComplete":
        waiter = FsxHook().get_waiter(trigger.waiter_name, client=clients("fsx"))
    else:
        waiter = clients("cloudformation").get_waiter(trigger.waiter_name)
    waiter.wait(**trigger.waiter_args, WaiterConfig={"Delay": 1, "MaxAttempts": 10})
    return {"status": "success", trigger.return_key: trigger.return_value}


def local_host_key(local_stack) -> str:
    """The local head node's (sshd's) key: the stand-in's head node prints it on its console."""
    return " ".join(local_stack.slurm_connection["extra"]["host_key"].split()[:2])


def export_tasks(fs_id: str) -> list[dict]:
    filters = [{"Name": "file-system-id", "Values": [fs_id]}]
    tasks = clients("fsx").describe_data_repository_tasks(Filters=filters)["DataRepositoryTasks"]
    return [t for t in tasks if t["Type"] == "EXPORT_TO_REPOSITORY"]


def ensure_op(cli, site, spec, **kw):
    return EnsureClusterOperator(
        task_id="ensure_cluster",
        provider="parallelcluster",
        cluster=spec,
        stack=site.stack,
        pcluster_path=str(cli),
        waiter_delay=1,
        waiter_max_attempts=10,
        **kw,
    )


def test_standin_create_defers_on_the_stack_then_returns_cluster_info(standin_cli, site, local_stack):
    spec = site.spec(fsx={"deployment_type": "SCRATCH_2"})
    op = ensure_op(standin_cli, site, spec)
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context("ensure_cluster"))
    trigger = deferred.value.trigger
    assert isinstance(trigger, ClusterStackTrigger)
    assert trigger.serialize()[1]["waiter_name"] == "stack_create_complete"
    event = wait_like_trigger(trigger)
    assert event["status"] == "success" and event["stack_name"] == spec["name"]
    info = op.execute_complete(make_context("ensure_cluster"), event, **deferred.value.kwargs)
    assert info["provider"] == "parallelcluster" and info["name"] == spec["name"] and info["scheduler"] == "slurm"
    # The local head node, its key read from the head node's console output (as on AWS), pinned.
    assert info["head_node"] == {"address": "127.0.0.1", "host_key": local_host_key(local_stack)}
    assert info["shared_root"] == "/fsx" and info["mounts"] == ["/fsx"]
    assert info["partitions"][0]["name"] == "gpu" and info["config_hash"] and not info["adopted"]
    tags = {t["Key"]: t["Value"] for t in stacks_named(spec["name"])[0]["Tags"]}
    assert tags["pcflow:stack"] == site.stack and tags["pcflow:config-hash"] == info["config_hash"]

    # Second ensure with the same spec: adopted, no second stack, no defer.
    again = ensure_op(standin_cli, site, spec)
    assert again.execute(make_context("ensure_cluster"))["adopted"] is True
    assert len(stacks_named(spec["name"])) == 1

    # Same name, other config: refused with a clear message, nothing changed.
    with pytest.raises(ClusterMismatch, match="exists with another configuration"):
        ensure_op(standin_cli, site, {**spec, "max_count": 7}).execute(make_context("ensure_cluster"))

    # Teardown policy `never`: the delete task keeps the cluster and says so.
    kept = DeleteClusterOperator(
        task_id="delete_cluster",
        provider="parallelcluster",
        cluster_name=spec["name"],
        keep=True,
        stack=site.stack,
        pcluster_path=str(standin_cli),
    ).execute(make_context("delete_cluster"))
    assert kept == {"cluster_name": spec["name"], "deleted": False, "kept": True}
    assert len(stacks_named(spec["name"])) == 1

    # Delete: deferrable until the stack is gone, then idempotent.
    delete = DeleteClusterOperator(
        task_id="delete_cluster",
        provider="parallelcluster",
        cluster_name=spec["name"],
        stack=site.stack,
        pcluster_path=str(standin_cli),
        waiter_delay=1,
        waiter_max_attempts=10,
    )
    with pytest.raises(TaskDeferred) as deferred:
        delete.execute(make_context("delete_cluster"))
    event = wait_like_trigger(deferred.value.trigger)
    assert event["status"] == "success"
    assert delete.execute_complete(make_context("delete_cluster"), event, **deferred.value.kwargs)["deleted"]
    assert stacks_named(spec["name"]) == []
    assert delete.execute(make_context("delete_cluster"))["deleted"] is False


def test_head_node_without_host_keys_on_its_console_is_never_trusted(standin_cli, site):
    """A head node whose console shows no keys yet (moto's sample boot text): pcflow waits, never TOFU."""
    ec2 = clients("ec2")
    instance = ec2.run_instances(ImageId=site.ami_id, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    try:
        with pytest.raises(HostKeyUnavailable, match="never trusts a host key on first use"):
            make_provider("parallelcluster", pcluster_path=str(standin_cli)).head_node_host_key(instance)
    finally:
        ec2.terminate_instances(InstanceIds=[instance])


def test_standin_create_failed_is_diagnosed(standin_cli, site, monkeypatch):
    monkeypatch.setenv("PCFLOW_STANDIN_FAIL", "HeadNodeBootstrapFailure")
    provider = make_provider("parallelcluster", pcluster_path=str(standin_cli))
    spec = site.spec()
    try:
        with pytest.raises(ClusterCreateFailed) as info:
            ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)
        message = str(info.value)
        assert "CREATE_FAILED" in message and "failure HeadNodeBootstrapFailure" in message
        assert "rollback disabled" in message
        # A retry does not create again: the failed cluster is diagnosed from describe-cluster.
        with pytest.raises(ClusterCreateFailed, match="HeadNodeBootstrapFailure"):
            ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)
        assert len(stacks_named(spec["name"])) == 1
    finally:
        monkeypatch.delenv("PCFLOW_STANDIN_FAIL")
        delete_cluster(provider, spec["name"], waiter_delay=1, waiter_max_attempts=10)


def test_standin_teardown_loop_deletes_tagged_cluster_stacks(standin_cli, site):
    provider = make_provider("parallelcluster", pcluster_path=str(standin_cli))
    spec = site.spec()
    ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)
    selector = Selector(stack=site.stack)
    report = teardown(clients, selector, handler_sets=[cluster_teardown.HANDLER_SET], pass_delay=0)
    assert [r.id for r in report.deleted] == [spec["name"]]
    assert stacks_named(spec["name"]) == []
    head = clients("ec2").describe_instances(
        Filters=[
            {"Name": "tag:parallelcluster:cluster-name", "Values": [spec["name"]]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )["Reservations"]
    assert head == []


def test_standin_updatable_change_is_applied_in_place_and_others_refused(standin_cli, site):
    """allow_updates: a larger queue updates the cluster in place (pcluster's dry run first, then the
    update, then the stack's update wait); a new head node type is refused, the cluster untouched."""
    provider = make_provider("parallelcluster", pcluster_path=str(standin_cli))
    spec = site.spec(allow_updates=True)
    try:
        first = ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)
        grown = ensure_cluster(
            provider, {**spec, "max_count": 4}, stack=site.stack, waiter_delay=1, waiter_max_attempts=10
        )
        assert grown["status"] == "UPDATE_COMPLETE" and grown["config_hash"] != first["config_hash"]
        assert len(stacks_named(spec["name"])) == 1
        with pytest.raises(ClusterMismatch, match=r"(?s)in place.*HeadNode\.InstanceType: c5\.xlarge -> c5\.4xlarge"):
            ensure_cluster(
                provider,
                {**spec, "max_count": 4, "head_node_instance_type": "c5.4xlarge"},
                stack=site.stack,
                waiter_delay=1,
                waiter_max_attempts=10,
            )
        tags = {t["Key"]: t["Value"] for t in stacks_named(spec["name"])[0]["Tags"]}
        assert tags["pcflow:config-hash"] == grown["config_hash"]
    finally:
        delete_cluster(provider, spec["name"], waiter_delay=1, waiter_max_attempts=10)


def test_standin_fsx_links_at_creation_exports_before_delete_and_a_failed_export_keeps_the_cluster(
    standin_cli, site, local_stack
):
    """teardown.export_fsx: the file system (in the cluster's stack, linked to the dataset prefix at
    creation) is exported to S3 before delete-cluster; a failed export keeps the cluster. The FSx
    stand-in's directory is what the nodes see at /fsx."""
    provider = make_provider("parallelcluster", pcluster_path=str(standin_cli))
    spec = site.spec(fsx={"deployment_type": "SCRATCH_2"})
    s3, mount = clients("s3"), local_stack.state_dir / "fsx"
    s3.put_object(Bucket=site.bucket, Key="datasets/digits/day1/0.png", Body=b"digit")
    ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)
    [fs_id] = provider.file_system_ids(spec["name"])  # the stack holds its file system
    try:
        assert (mount / "day1" / "0.png").read_bytes() == b"digit"  # linked: the prefix is listed at creation
        (mount / "checkpoints").mkdir()
        (mount / "checkpoints" / "last.pt").write_bytes(b"weights")  # what a job wrote to /fsx
        failed = {"Lifecycle": "FAILED", "Message": "S3 access denied"}
        tell_standin(local_stack, "fsx/task-outcomes", {"results": [failed]})  # how the next export ends
        with pytest.raises(DataRepositoryTaskFailed, match="ended FAILED: S3 access denied"):
            delete_cluster(provider, spec["name"], export_fsx=True, waiter_delay=1, waiter_max_attempts=10)
        assert len(stacks_named(spec["name"])) == 1  # the data only the file system holds is not lost
        result = delete_cluster(provider, spec["name"], export_fsx=True, waiter_delay=1, waiter_max_attempts=10)
        assert result["deleted"] and stacks_named(spec["name"]) == []
        assert [t["Lifecycle"] for t in export_tasks(fs_id)] == ["FAILED", "SUCCEEDED"]
        assert [e["task_id"] for e in result["exports"]] == [export_tasks(fs_id)[1]["TaskId"]]
        exported = s3.get_object(Bucket=site.bucket, Key="datasets/digits/checkpoints/last.pt")["Body"].read()
        assert exported == b"weights" and not any(mount.iterdir())  # the file system and its files are gone
    finally:
        delete_cluster(provider, spec["name"], waiter_delay=1, waiter_max_attempts=10)


def test_standin_delete_operator_defers_on_the_fsx_export_then_on_the_stack(standin_cli, site, local_stack):
    """The delete task holds no worker while FSx exports: it defers on the export task, then on the
    stack. Re-entered after each wait, it finds the export again by its key: nothing runs twice."""
    from airflow.sdk.exceptions import TaskDeferred

    from pcflow.aws.waits import FsxDataRepositoryTaskTrigger

    spec = site.spec(fsx={"deployment_type": "SCRATCH_2"})
    delete = DeleteClusterOperator(
        task_id="delete_cluster",
        provider="parallelcluster",
        cluster_name=spec["name"],
        export_fsx=True,
        stack=site.stack,
        pcluster_path=str(standin_cli),
        waiter_delay=1,
        waiter_max_attempts=10,
    )
    provider = delete.cluster_provider
    ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)
    [fs_id] = provider.file_system_ids(spec["name"])
    context = make_context("delete_cluster")
    tell_standin(local_stack, "fsx/task-outcomes", {"results": [{"Lifecycle": "SUCCEEDED", "Seconds": 3}]})
    try:
        with pytest.raises(TaskDeferred) as deferred:
            delete.execute(context)  # the export is still running when the task looks
        trigger = deferred.value.trigger
        assert isinstance(trigger, FsxDataRepositoryTaskTrigger) and len(stacks_named(spec["name"])) == 1
        event = wait_like_trigger(trigger)  # FSx's task: PENDING, EXECUTING, SUCCEEDED
        with pytest.raises(TaskDeferred) as deferred:
            delete.export_complete(context, event)
        assert isinstance(deferred.value.trigger, ClusterStackTrigger)
        [task] = export_tasks(fs_id)  # re-entered, the export was adopted, not started again
        assert {t["Key"]: t["Value"] for t in task["Tags"]}[TASK_KEY_TAG].endswith("/export-before-delete")
        event = wait_like_trigger(deferred.value.trigger)
        assert delete.execute_complete(context, event, **deferred.value.kwargs)["deleted"]
        assert stacks_named(spec["name"]) == []
    finally:
        delete_cluster(provider, spec["name"], waiter_delay=1, waiter_max_attempts=10)


def test_standin_answers_as_the_real_cli_does(standin_cli, pcluster_cli, site):
    """The real pcluster CLI reads the stand-in's cluster from moto (stack, tags, head node): the two
    answer describe-cluster and describe-cluster-instances alike. Where they differ, the stand-in says
    what the local stack supplies (the head node's address). The compute fleet's status is read by both
    from the cluster's DynamoDB table, where the stand-in keeps it as pcluster does."""
    provider = make_provider("parallelcluster", pcluster_path=str(standin_cli))
    spec = site.spec()
    ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)

    def both(*argv: str) -> tuple[dict, dict]:
        answers = [
            subprocess.run([str(cli), *argv], capture_output=True, text=True, check=True).stdout
            for cli in (standin_cli, pcluster_cli)
        ]
        return json.loads(answers[0]), json.loads(answers[1])

    try:
        ours, real = both("describe-cluster", "--cluster-name", spec["name"])
        assert set(real) - {"scheduler"} <= set(ours)
        same = (
            "clusterName",
            "clusterStatus",
            "cloudFormationStackStatus",
            "version",
            "cloudformationStackArn",
            "computeFleetStatus",
        )
        assert {k: ours[k] for k in same} == {k: real[k] for k in same}
        assert sorted(map(str, ours["tags"])) == sorted(map(str, real["tags"]))
        assert {k: v for k, v in ours["headNode"].items() if k != "publicIpAddress"} == real["headNode"]
        assert ours["headNode"]["publicIpAddress"] == "127.0.0.1" and real["computeFleetStatus"] == "RUNNING"
        ours, real = both("describe-compute-fleet", "--cluster-name", spec["name"])
        assert ours == real and real["status"] == "RUNNING"
        ours, real = both("describe-cluster-instances", "--cluster-name", spec["name"])
        pairs = zip(ours["instances"], real["instances"], strict=True)
        assert all(o["instanceId"] == r["instanceId"] and o["nodeType"] == r["nodeType"] for o, r in pairs)
        assert [i["nodeType"] for i in real["instances"]] == ["HeadNode", "ComputeNode"]
    finally:
        delete_cluster(provider, spec["name"], waiter_delay=1, waiter_max_attempts=10)


def test_standin_dry_run_of_an_existing_cluster_adopts_checks_the_update_or_refuses(standin_cli, site):
    """A nightly's cluster outlives its run: `create-cluster --dryrun` would answer "already exists", so
    the dry run decides what ensure will do (the real CLI's dry run is not asked: none is made here)."""
    provider = make_provider("parallelcluster", pcluster_path=str(standin_cli))
    spec = site.spec()
    try:
        ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)
        same = validate_cluster(provider, spec, stack=site.stack)["existing"]
        assert same == {"status": "CREATE_COMPLETE", "config_hash": same["config_hash"], "file_system_ids": []}
        with pytest.raises(ClusterMismatch, match="exists with another configuration"):
            validate_cluster(provider, {**spec, "max_count": 4}, stack=site.stack)
        grown = validate_cluster(provider, {**spec, "max_count": 4, "allow_updates": True}, stack=site.stack)
        assert grown["existing"]["update"] is True and grown["config_hash"] != same["config_hash"]
        # Before the bake, the dry run renders the image the bake starts from: a cluster that differs only
        # by its image passes, and ensure compares the image once baked.
        unbaked = validate_cluster(provider, {**spec, "custom_ami": "ami-0123456789abcdef0"}, stack=site.stack)
        assert unbaked["existing"]["image_checked_after_bake"] is True and "update" not in unbaked["existing"]
    finally:
        delete_cluster(provider, spec["name"], waiter_delay=1, waiter_max_attempts=10)


def test_standin_kept_cluster_is_adopted_and_its_expiry_moved_on_once_per_run(standin_cli, site, monkeypatch):
    """A nightly's cluster: night 2 adopts it (no second stack, no create) and postpones its expiry with
    a tags-only update-cluster; a retry within the hour adopts it as it is. Once the nights stop, the
    janitor's rule selects it when the expiry passes, and not before."""
    import datetime as dt

    from pcflow.aws.janitor import run_janitor
    from pcflow.naming import parse_expires

    provider = make_provider("parallelcluster", pcluster_path=str(standin_cli))
    provider.require_host_key = False
    spec = site.spec()
    updates = []
    real_update = provider.hook.update_cluster
    monkeypatch.setattr(provider.hook, "update_cluster", lambda *a, **k: updates.append(a) or real_update(*a, **k))

    def expires() -> dt.datetime:
        return parse_expires({t["Key"]: t["Value"] for t in stacks_named(spec["name"])[0]["Tags"]}["pcflow:expires"])

    def night(hours: float) -> dict:
        ttl = dt.timedelta(hours=hours)
        return ensure_cluster(provider, spec, stack=site.stack, ttl=ttl, waiter_delay=1, waiter_max_attempts=10)

    try:
        first = night(1)
        assert not first["adopted"] and updates == []
        before = expires()
        second = night(48)
        assert second["adopted"] and second["status"] == "UPDATE_COMPLETE" and len(updates) == 1
        assert second["config_hash"] == first["config_hash"] and expires() - before > dt.timedelta(hours=46)
        assert len(stacks_named(spec["name"])) == 1
        retry = night(48)
        assert retry["adopted"] and len(updates) == 1  # moved on less than the margin: left as it is

        def reaped(now: dt.datetime) -> list[str]:
            report = run_janitor(clients, now=now, stack=site.stack, handler_sets=["pcluster"], dry_run=True)
            return [r.id for r in report.would_delete]

        assert reaped(expires() - dt.timedelta(minutes=1)) == []
        assert reaped(expires() + dt.timedelta(seconds=1)) == [spec["name"]]
    finally:
        delete_cluster(provider, spec["name"], waiter_delay=1, waiter_max_attempts=10)


def test_nodes_download_their_setup_script_with_their_own_s3_access(standin_cli, site):
    """A job account: the cluster stage keeps the node setup script in the bucket, and the stand-in's nodes
    (as ParallelCluster's do) download it with the rights their config gives them, the cluster's call.
    A config whose head node may not read it (an admin's extra_config replacing its S3Access) fails as
    ParallelCluster reports it, and is diagnosed."""
    provider = make_provider("parallelcluster", pcluster_path=str(standin_cli))
    accounts = {"job_user": "pcflow-job", "node_policy": "arn:aws:iam::123456789012:policy/pcflow-cluster-node"}
    spec = site.spec(**accounts)
    try:
        info = ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)
        assert info["status"] == "CREATE_COMPLETE"
        keys = clients("s3").list_objects_v2(Bucket=site.bucket, Prefix="pcflow/node-setup/").get("Contents", [])
        assert len(keys) == 1
        delete_cluster(provider, spec["name"], waiter_delay=1, waiter_max_attempts=10)
        dataset_only = [{"BucketName": site.bucket, "KeyName": "datasets/digits/*", "EnableWriteAccess": False}]
        narrowed = site.spec(**accounts, extra_config={"HeadNode": {"Iam": {"S3Access": dataset_only}}})
        with pytest.raises(ClusterCreateFailed) as failed:
            ensure_cluster(provider, narrowed, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)
        assert "failure OnNodeConfiguredDownloadFailure: Failed to download OnNodeConfigured script." in str(
            failed.value
        )
    finally:
        delete_cluster(provider, spec["name"], waiter_delay=1, waiter_max_attempts=10)


def test_standin_ice_knob_leaves_a_queues_nodes_down_as_parallelcluster_does_until_delete(
    standin_cli, site, local_stack, monkeypatch
):
    """`PCFLOW_STANDIN_ICE=gpu` (a stand-in knob): the cluster's queues become partitions of the local Slurm,
    the first the default, and `gpu`'s node is DOWN with slurm_resume's reason; delete-cluster undoes it."""
    monkeypatch.setenv("PCFLOW_STANDIN_ICE", "gpu")
    provider = make_provider("parallelcluster", pcluster_path=str(standin_cli))
    spec = site.spec(fallback=[{"instance_types": ["g5.xlarge"], "capacity_type": "ondemand"}])
    slurm_env = {**os.environ, **local_stack.env}  # SLURM_CONF: the local stack's

    def sinfo() -> list[str]:
        argv = ["sinfo", "-h", "-N", "-o", "%N|%P|%T|%E"]
        return subprocess.run(argv, capture_output=True, text=True, env=slurm_env, check=True).stdout.splitlines()

    try:
        ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)
        lines = sinfo()
        assert any("|gpu*|down|(Code:InsufficientInstanceCapacity)Failure when resuming nodes" in s for s in lines)
        assert any("|gpu-2|idle|" in line for line in lines)
    finally:
        monkeypatch.delenv("PCFLOW_STANDIN_ICE")
        delete_cluster(provider, spec["name"], waiter_delay=1, waiter_max_attempts=10)
    assert {line.split("|")[1] for line in sinfo()} == {"compute*"}
    assert not [line for line in sinfo() if "|down" in line]
