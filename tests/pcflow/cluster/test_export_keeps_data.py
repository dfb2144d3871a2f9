"""Keep data on a failed export: when the FSx export before delete fails, the cluster's delete task
fails with FSx's reason and the run's teardown deletes nothing the cluster needs (cluster stack, file
system, network), counted by the run's tag; after the cause is fixed, the same two tasks run again and
leave nothing. The run's network is pcflow's, the cluster (with its Lustre file system) comes from the
local stack's ParallelCluster STAND-IN CLI, the export tasks from moto's FSx STAND-IN, told how the
first export ends (moto lacks data repository tasks)."""

from __future__ import annotations

import pytest
from dagrun import tagged_resources
from stacktools import tell_standin
from taskcontext import make_context

from pcflow.aws.clients import aws_client
from pcflow.aws.network import ensure_network
from pcflow.aws.network_spec import NetworkSpec
from pcflow.aws.storage import DataRepositoryTaskFailed
from pcflow.aws.teardown import Selector, TeardownIncomplete, TeardownOperator, teardown
from pcflow.cluster.operators import DeleteClusterOperator
from pcflow.cluster.providers import ensure_cluster
from pcflow.cluster.teardown import HANDLER_SET as PCLUSTER_HANDLERS
from pcflow.naming import run_key

pytestmark = [pytest.mark.security, pytest.mark.stack]
WAIT = {"waiter_delay": 1, "waiter_max_attempts": 10}
HANDLERS = (PCLUSTER_HANDLERS, "ec2", "fsx")  # what the pipeline's run-scoped teardown task runs


def live_file_systems(fsx, run: str) -> list[str]:
    return [
        fs["FileSystemId"]
        for fs in fsx.describe_file_systems()["FileSystems"]
        if {"Key": "pcflow:run", "Value": run} in fs.get("Tags", []) and fs.get("Lifecycle") != "DELETED"
    ]


def test_failed_export_keeps_cluster_file_system_and_network(standin_cli, site, local_stack):
    context = make_context("delete_cluster")
    run = run_key(context["ti"].dag_id, context["run_id"])
    ec2 = aws_client("ec2")
    network = ensure_network(ec2, NetworkSpec(stack=site.stack, region="us-east-1"), run=run, waiter_delay=0)
    delete = DeleteClusterOperator(
        task_id="delete_cluster",
        provider="parallelcluster",
        cluster_name=site.spec()["name"],
        stack=site.stack,
        run_scoped=True,
        export_fsx=True,
        pcluster_path=str(standin_cli),
        deferrable=False,
        **WAIT,
    )
    provider = delete.cluster_provider
    spec = site.spec(head_subnet_id=network.head_subnet_id, fsx={"deployment_type": "SCRATCH_2"})
    ensure_cluster(provider, spec, stack=site.stack, run=run, **WAIT)
    fsx = provider.clients("fsx")
    [fs_id] = provider.file_system_ids(spec["name"])  # in the cluster's stack, tagged with its run
    tell_standin(
        local_stack, "fsx/task-outcomes", {"results": [{"Lifecycle": "FAILED", "Message": "S3 access denied"}]}
    )
    cleanup = TeardownOperator(task_id="teardown", stack=site.stack, run=run, handler_sets=HANDLERS, pass_delay=0)
    before = tagged_resources("pcflow:run", run)
    try:
        assert any(spec["name"] in arn for arn in before) and network.vpc_id in before
        with pytest.raises(DataRepositoryTaskFailed, match="ended FAILED: S3 access denied"):
            delete.execute(context)
        with pytest.raises(TeardownIncomplete, match="S3 access denied") as held:
            cleanup.execute(make_context("teardown"))
        assert held.value.report.deleted == [] and len(held.value.report.held) >= 8
        assert tagged_resources("pcflow:run", run) == before
        assert live_file_systems(fsx, run) == [fs_id]

        # The retry the README describes: the cause fixed, the delete task, then the teardown, again.
        assert delete.execute(context)["deleted"] is True
        report = cleanup.execute(make_context("teardown"))
        assert report["held"] == [] and report["remaining"] == []
        assert tagged_resources("pcflow:run", run) == [] and live_file_systems(fsx, run) == []
        tasks = fsx.describe_data_repository_tasks(Filters=[{"Name": "file-system-id", "Values": [fs_id]}])
        assert [(t["Type"], t["Lifecycle"]) for t in tasks["DataRepositoryTasks"]] == [
            ("EXPORT_TO_REPOSITORY", "FAILED"),
            ("EXPORT_TO_REPOSITORY", "SUCCEEDED"),
        ]
    finally:
        if live_file_systems(fsx, run):
            fsx.delete_file_system(FileSystemId=fs_id)
        teardown(aws_client, Selector(stack=site.stack, run=run), handler_sets=HANDLERS[:2], pass_delay=0)
