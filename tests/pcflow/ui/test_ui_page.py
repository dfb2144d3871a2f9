"""The pcflow page's parts: the resource overview against the moto server (a stack shaped as the aws-gpu
rehearsal leaves one: ParallelCluster stack, head and compute instances, FSx for Lustre, image, network,
bucket), the runs as the metrics task's XCom describes them, the report's bounds and the app's refusal of
an unauthenticated request. The page itself, in the real api-server, is tested in
tests/deploy/test_celery_deployment.py."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter

import pytest

from pcflow.aws.clients import aws_client
from pcflow.aws.network import ensure_network
from pcflow.aws.network_spec import NetworkSpec
from pcflow.aws.tags import tag_specifications
from pcflow.aws.teardown import Selector, teardown
from pcflow.naming import run_key, standard_tags
from pcflow.prices import price_table
from pcflow.ui import reports
from pcflow.ui.resources import overview
from pcflow.ui.runs import RunRow, leaderboards, report_location, trend
from pcflow.urls import report_path

NOW = dt.datetime.now(dt.UTC)
PCLUSTER_TEMPLATE = json.dumps({"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}}})


@pytest.fixture
def clients(local_stack):
    made: dict = {}

    def source(service: str):
        if service not in made:
            made[service] = aws_client(service, aws_conn_id="aws_default")
        return made[service]

    return source


def aws_tags(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


@pytest.fixture
def rehearsal_stack(clients):
    """What the aws-gpu rehearsal keeps between nights (network, image, cluster, FSx, bucket), and one
    instance of a run killed an hour ago (expired: the janitor's)."""
    ec2, stack = clients("ec2"), f"u{uuid.uuid4().hex[:10]}"
    kept = standard_tags(stack=stack, component="cluster", ttl=dt.timedelta(days=2))
    ids = ensure_network(
        ec2, NetworkSpec(stack=stack, region="us-east-1"), run=None, ttl=dt.timedelta(days=2), waiter_delay=0
    )
    base = ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]

    def instance(kind: str, tags: dict[str, str]) -> str:
        return ec2.run_instances(
            ImageId=base,
            MinCount=1,
            MaxCount=1,
            InstanceType=kind,
            SubnetId=ids.head_subnet_id,
            TagSpecifications=tag_specifications("instance", tags),
        )["Instances"][0]["InstanceId"]

    head = instance("c5.2xlarge", kept)
    instance("g5.12xlarge", kept)
    instance("g5.12xlarge", standard_tags(stack=stack, component="cluster", run="killed", ttl=dt.timedelta(hours=-1)))
    image_tags = standard_tags(stack=stack, component="ami", ttl=dt.timedelta(days=2))
    image = ec2.create_image(
        InstanceId=head, Name=f"pcflow-{stack}", TagSpecifications=tag_specifications("image", image_tags)
    )["ImageId"]
    fs_id = clients("fsx").create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=1200,
        SubnetIds=[ids.head_subnet_id],
        LustreConfiguration={"DeploymentType": "SCRATCH_2"},
        Tags=aws_tags(kept),
    )["FileSystem"]["FileSystemId"]
    cfn_tags = {**kept, "parallelcluster:version": "3.14.0"}
    clients("cloudformation").create_stack(
        StackName=f"{stack}-cluster", TemplateBody=PCLUSTER_TEMPLATE, Tags=aws_tags(cfn_tags)
    )
    bucket = f"{stack}-reports"
    clients("s3").create_bucket(Bucket=bucket)
    clients("s3").put_bucket_tagging(
        Bucket=bucket, Tagging={"TagSet": aws_tags(standard_tags(stack=stack, component="metrics"))}
    )
    clients("s3").put_object(Bucket=bucket, Key="runs/k/report.html", Body=b"x" * 2048)
    yield {"stack": stack, "image": image, "fsx": fs_id, "bucket": bucket, "vpc": ids.vpc_id}
    clients("fsx").delete_file_system(FileSystemId=fs_id)
    clients("cloudformation").delete_stack(StackName=f"{stack}-cluster")
    clients("s3").delete_object(Bucket=bucket, Key="runs/k/report.html")
    clients("s3").delete_bucket(Bucket=bucket)
    teardown(clients, Selector(stack=stack), handler_sets=("ec2", "images"), pass_delay=0, raise_on_leftovers=False)


def test_overview_lists_a_rehearsal_stack_by_tag_with_its_cost_and_the_janitors_dry_run(clients, rehearsal_stack):
    stack = rehearsal_stack["stack"]
    calls = Counter()
    for service in ("ec2", "fsx", "cloudformation", "s3", "cloudwatch"):
        clients(service).meta.events.register("before-call", lambda model, **_: calls.update([model.name]))
    found = overview(clients, "us-east-1", NOW)
    # One listing serves the janitor's dry run and what it keeps (main's page listed everything twice).
    listings = ("DescribeInstances", "DescribeFileSystems", "DescribeImages", "DescribeSnapshots", "DescribeStacks")
    assert {name: calls[name] for name in listings} == dict.fromkeys(listings, 1), calls
    lines = found.stacks[stack]
    kinds = {line["kind"] for line in lines}
    assert {"vpc", "subnet", "instance", "image", "fsx-file-system", "pcluster-cluster", "bucket"} <= kinds, kinds
    assert all(line["stack"] == stack for line in lines)  # no other stack's resource under this one
    prices = price_table(region="us-east-1")["on_demand_per_hour"]
    running = sorted(line["usd_per_day"] for line in lines if line["kind"] == "instance")
    expected = sorted(24 * prices[k] for k in ("c5.2xlarge", "g5.12xlarge", "g5.12xlarge"))
    assert running == pytest.approx(expected)
    assert found.usd_per_day[stack] == pytest.approx(sum(line["usd_per_day"] or 0 for line in lines), abs=0.01)
    # The janitor's dry run: the killed run's instance only; the kept stack stays.
    doomed = [line for line in found.would_delete if line["stack"] == stack]
    assert [line["kind"] for line in doomed] == ["instance"]
    [bucket] = [line for line in lines if line["kind"] == "bucket"]
    assert bucket["id"] == rehearsal_stack["bucket"] and not bucket["reaped"]
    assert bucket["basis"].startswith("2,048 bytes in S3 Standard at $0.023/GiB-month (1 object(s) listed")
    assert bucket["usd_per_day"] == pytest.approx(2048 / 2**30 * 0.023 / 730 * 24, abs=1e-4)  # priced, if tiny


def summary_of_a_run(dag_id: str, run_id: str, **fields) -> dict:
    return {
        "run_key": run_key(dag_id, run_id),
        "outcome": "completed",
        "elapsed_s": 30.0,
        "objective": {"name": "probe_accuracy", "mode": "max", "value": 0.8},
        "cost_usd_estimate": 0.12,
        "report": f"s3://reports/runs/{run_key(dag_id, run_id)}/report.html",
        **fields,
    }


def test_runs_read_outcome_objective_cost_and_report_from_the_metrics_xcom():
    start = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    done = RunRow(
        "pretrain_nightly",
        "r1",
        "success",
        start,
        start + dt.timedelta(seconds=90),
        summary_of_a_run("pretrain_nightly", "r1"),
    )
    capped = RunRow(
        "pretrain_nightly",
        "r2",
        "success",
        start,
        None,
        summary_of_a_run("pretrain_nightly", "r2", outcome="budget_exhausted"),
    )
    failed = RunRow("pretrain_nightly", "r3", "failed", start, start, None)
    assert (done.outcome, done.objective, done.cost_usd, done.duration_s) == (
        "completed",
        ("probe_accuracy", 0.8),
        0.12,
        90,
    )
    assert capped.outcome == "budget_exhausted" and failed.outcome == "failed" and not failed.has_report
    assert report_location("pretrain_nightly", "r1", done.summary) == (
        "reports",
        f"runs/{run_key('pretrain_nightly', 'r1')}/report.html",
    )
    # A location outside the run's own prefix (another run's report) is refused.
    assert report_location("pretrain_nightly", "r2", done.summary) is None
    assert trend([failed, capped, done]) == {"objective": [(1, 0.8), (2, 0.8)], "cost": [(1, 0.12), (2, 0.12)]}


def test_a_sweep_shows_its_leaderboard_best_value_and_trial_reports():
    key = run_key("pretrain_sweep", "s1")
    rows = [
        {
            "rank": 1,
            "trial": 2,
            "outcome": "completed",
            "value": 0.9,
            "cost_usd_estimate": 0.05,
            "hyperparameters": {"lr": 0.004},
        },
        {
            "rank": 2,
            "trial": 0,
            "outcome": "stopped_early",
            "value": 0.7,
            "cost_usd_estimate": 0.02,
            "hyperparameters": {"lr": 0.001},
        },
    ]
    summary = {
        "run_key": key,
        "objective": {"name": "probe_accuracy", "mode": "max"},
        "leaderboard": rows,
        "best": {"trial": 2, "value": 0.9},
        "cost_usd_estimate": 0.06,
        "leaderboard_html": f"s3://reports/runs/{key}/leaderboard.html",
    }
    sweep = RunRow("pretrain_sweep", "s1", "success", None, None, summary)
    assert sweep.outcome == "1 completed, 1 stopped_early"
    assert sweep.objective == ("probe_accuracy", 0.9) and sweep.cost_usd == 0.06
    assert [board["rows"] for board in leaderboards([sweep])] == [rows]
    assert report_location("pretrain_sweep", "s1", summary) == ("reports", f"runs/{key}/leaderboard.html")
    assert report_location("pretrain_sweep", "s1", summary, trial=2) == ("reports", f"runs/{key}/trials/2/report.html")


def test_the_extra_links_path_follows_the_base_url():
    assert report_path("pretrain", "manual__2026-11-30T00:00:00+00:00", "http://host:8080") == (
        "/pcflow/runs/pretrain/manual__2026-11-30T00%3A00%3A00%2B00%3A00/report"
    )
    assert report_path("pretrain", "r", "https://host/airflow/").startswith("/airflow/pcflow/runs/")


def test_a_report_is_read_whole_up_to_its_bound_and_refused_beyond(clients, monkeypatch):
    s3, bucket = clients("s3"), f"u{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    try:
        s3.put_object(Bucket=bucket, Key="runs/k/report.html", Body=b"<p>ok</p>" * 10)
        monkeypatch.setattr(reports, "MAX_REPORT_BYTES", 90)
        assert reports.read_report(bucket, "runs/k/report.html", s3) == "<p>ok</p>" * 10
        s3.put_object(Bucket=bucket, Key="runs/k/report.html", Body=b"x" * 91)
        with pytest.raises(reports.ReportUnavailable) as too_big:
            reports.read_report(bucket, "runs/k/report.html", s3)
        assert too_big.value.status == 413
        with pytest.raises(reports.ReportUnavailable) as missing:
            reports.read_report(bucket, "runs/other/report.html", s3)
        assert missing.value.status == 404
    finally:
        for item in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=item["Key"])
        s3.delete_bucket(Bucket=bucket)


def test_the_app_refuses_a_request_without_airflows_token():
    from fastapi.testclient import TestClient

    from pcflow.ui.app import app

    client = TestClient(app)
    for path in ("/", "/runs/pretrain/r1/report"):
        response = client.get(path)
        assert response.status_code == 401, (path, response.text)


def test_the_page_renders_stacks_runs_trends_and_leaderboards_as_escaped_html_without_scripts():
    from pcflow.ui.app import render_page
    from pcflow.ui.resources import Overview

    hostile = "<script>alert(1)</script>"
    line = {"kind": "instance", "id": "i-1", "stack": "night", "usd_per_day": 4.08, "basis": hostile, "reaped": True}
    ov = Overview({"night": [line]}, {"night": 4.08}, [line], "prices: us-east-1")
    start = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    rows = [
        RunRow("pretrain_nightly", f"r{i}", "success", start, start, summary_of_a_run("pretrain_nightly", f"r{i}"))
        for i in range(3)
    ]
    warm = {"source": "latest", "uri": "s3://b/runs/k/model/model.pt", "sha256": "a" * 64, "run": "night-1"}
    rows[2].summary["warm_start"] = warm  # the nightly's third night started from another night's model
    assert rows[2].provenance["warm_start"]["run"] == "night-1" and "warm_start" not in rows[1].provenance
    page = render_page({"pretrain_nightly": rows}, {"overview": ov, "error": None})
    assert page.count('<tr data-section="warm_start">') == 1 and "run <code>night-1</code>" in page
    assert "<script" not in page and "&lt;script&gt;" in page
    assert 'data-stack="night"' in page and "$4.08 per day" in page and 'id="would-delete"' in page
    assert page.count('<tr data-run="') == 3 and page.count('class="chart"') == 2
    assert 'href="runs/pretrain_nightly/r0/report"' in page and 'href="../dags/pretrain_nightly/runs/r0"' in page
    hidden = render_page({}, None)
    assert "needs read access to the <code>janitor</code> DAG" in hidden


def test_each_run_shows_its_code_environment_image_and_warm_start_escaped():
    """A run's provenance as its summary records it: code (source, URL, commit, dirty, bundle id, bytes),
    environment (id, built), image (reference, digest) and, where the summary has one, a warm start, shown
    whatever its shape; every value escaped (a URL or an image reference is the user's text)."""
    from pcflow.ui.app import render_page

    commit, digest, image = "08d57f2f" * 5, "sha256-" + "ab" * 32, "sha256:" + "cd" * 32
    hostile = "https://example.com/<script>alert(1)</script>.git"
    code = {"source": "git", "name": "resnet", "url": hostile, "commit": commit, "dirty": False}
    code |= {"digest": digest, "bytes": 30720, "files": 12, "uploaded_bytes": 0, "reused": True}
    summary = summary_of_a_run(
        "pretrain",
        "own",
        code=code,
        environment={"id": "env-1234abcd", "built": True, "build_s": 14.2, "python": "/e/bin/python"},
        container={"reference": "oci:/images:debian", "digest": image, "imported": False, "runtime": "oci"},
        warm_start={"run_key": "pretrain-20261101-abc", "model": "s3://models/<b>/model.pt", "sha256": "ef" * 32},
    )
    start = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    rows = [
        RunRow("pretrain", "own", "success", start, start, summary),
        RunRow("pretrain", "payload", "success", start, start, summary_of_a_run("pretrain", "payload")),
    ]
    assert rows[0].provenance_line == "git resnet 08d57f2f08d5" and rows[1].provenance == {}
    assert rows[0].provenance["warm_start"]["run_key"] == "pretrain-20261101-abc"
    page = render_page({"pretrain": rows}, None)
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;.git" in page
    assert "&lt;b&gt;" in page and "<b>" not in page
    for shown in (
        "<summary>git resnet 08d57f2f08d5</summary>",
        f"commit <code>{commit}</code>",
        "dirty <code>False</code>",
        f"digest <code>{digest}</code>",
        "bytes <code>30720</code>",
        "id <code>env-1234abcd</code>; built <code>True</code>",
        f"reference <code>oci:/images:debian</code>; digest <code>{image}</code>",
        '<tr data-section="warm_start"><th>warm start</th>',
        "run_key <code>pretrain-20261101-abc</code>",
    ):
        assert shown in page, shown
    assert "uploaded_bytes" not in page, "what this run moved is the example's summary, not provenance"
    assert page.count("<details>") == 1, "a run that recorded no provenance shows none"
    trials = summary_of_a_run("pretrain_sweep", "s", trials=[{"code": code, "environment": None}])
    assert RunRow("pretrain_sweep", "s", "success", None, None, trials).provenance["code"]["commit"] == commit


@pytest.mark.security
def test_run_summaries_only_for_who_may_read_the_dags_xcoms(monkeypatch):
    """A user who may read a DAG but not its XComs sees its runs' states, not their objective, cost or
    report (the summary is the metrics task's XCom)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

    from pcflow.ui import app

    asked = []
    monkeypatch.setattr(app.runs, "training_dag_ids", lambda session, permitted: sorted(permitted))
    monkeypatch.setattr(
        app.runs, "recent_runs", lambda session, dag_id, with_summaries: asked.append((dag_id, with_summaries)) or []
    )

    class Manager:  # the deployment's auth manager, as the page asks it
        def get_authorized_dag_ids(self, *, user, method, session):
            return {"pretrain", "pretrain_sweep"}

        def is_authorized_dag(self, *, method, details, user, access_entity=None):
            return access_entity != DagAccessEntity.XCOM or details.id == "pretrain"

    assert set(app.visible_runs(Manager(), user=object(), session=None)) == {"pretrain", "pretrain_sweep"}
    assert asked == [("pretrain", True), ("pretrain_sweep", False)]
