"""End to end on the local stack: a real Slurm job writes metrics (and the sampler utilisation), the
harvest publishes to the moto server's S3 and CloudWatch, and the report renders in headless Chromium."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
import types
import uuid
from pathlib import Path

import pytest
from airflow.sdk import AssetAlias
from airflow.sdk.execution_time.context import OutletEventAccessors
from deploy.browser import Chromium
from PIL import Image
from taskcontext import make_context

from pcflow import prices
from pcflow.aws.clients import aws_client
from pcflow.metric_definitions import parse_definitions
from pcflow.metrics.harvest import JobRef, RequiredMetricMissing, harvest_job
from pcflow.metrics.links import MetricsDashboardLink, MetricsReportLink
from pcflow.metrics.operators import HarvestMetricsOperator
from pcflow.metrics.publish import NAMESPACE, dashboard_name
from pcflow.pricing import cost
from pcflow.readings.series import Objective
from pcflow.slurm.operators import SlurmJobOperator
from pcflow.urls import report_path

pytestmark = pytest.mark.stack

# A "training" that only a shell is needed for: 6 epochs of loss/accuracy lines, a print-only metric
# for the regex definitions, a NaN, and a last line cut in half as a job killed mid-write leaves it.
TRAIN = r"""
for e in 0 1 2 3 4 5; do
  now=$(date +%s.%N)
  loss=$(awk -v e=$e 'BEGIN{print 2.0/(1+e)}'); acc=$(awk -v e=$e 'BEGIN{print 0.3+0.07*e}')
  line='{"time": %s, "epoch": %d, "step": %d, "name": "%s", "value": %s, "split": "%s"}\n'
  printf "$line" "$now" "$e" $((e*10)) loss "$loss" train >> "$PCFLOW_METRICS_FILE"
  printf "$line" "$now" "$e" $((e*10)) probe_accuracy "$acc" eval >> "$PCFLOW_METRICS_FILE"
  echo "epoch $e done: top1=$acc"
  sleep 0.4
done
echo '{"time": 1, "epoch": 6, "step": 60, "name": "lr", "value": NaN, "split": "train"}' >> "$PCFLOW_METRICS_FILE"
printf '{"time": 1, "epoch": 6, "step": 60, "name": "lo' >> "$PCFLOW_METRICS_FILE"
for e in 5 6; do echo "checkpoint $e" > "$PCFLOW_CHECKPOINT_DIR/epoch-000$e.pt"; sleep 0.1; done
echo "the model" > "$PCFLOW_RUN_DIR/model.pt"
"""

# What each chart of a page looks like once Chromium has laid it out: its size, and per line drawn,
# how many points it has and its bounding box (a chart that draws nothing has no `.series`).
CHARTS_JS = """[...document.querySelectorAll('svg.chart')].map(svg => {
  const box = svg.getBoundingClientRect();
  return {section: svg.parentElement.id, title: svg.getAttribute('aria-label'), width: box.width,
    height: box.height, no_data: [...svg.querySelectorAll('text')].some(t => t.textContent === 'no data'),
    series: [...svg.querySelectorAll('.series')].map(el => { const b = el.getBBox();
      return {name: el.dataset.name || null, points: el.points ? el.points.numberOfItems : 1,
              width: b.width, height: b.height}; })};
})"""


def render(html: str, artifacts_dir: Path, name: str, *queries: str) -> tuple[dict[str, dict], list]:
    """The page opened in headless Chromium (screenshot kept in the artifacts): its charts by title and
    the values of further JavaScript `queries`."""
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("chromium is not installed: run include/local/install-system-packages.sh (as root)")
    page = artifacts_dir / f"{name}.html"
    page.write_text(html)
    png = artifacts_dir / f"{name}.png"
    with Chromium(executable) as browser:
        browser.navigate(page.as_uri())
        browser.wait_for(f"document.readyState === 'complete' && location.href === {json.dumps(page.as_uri())}")
        charts = browser.evaluate(CHARTS_JS)
        answers = [browser.evaluate(q) for q in queries]
        browser.screenshot(png)
    # Painted, not only laid out: the coloured chart lines are in the screenshot's pixels.
    saturation = Image.open(png).convert("HSV").getchannel("S").histogram()
    assert sum(saturation[80:]) > 1500, "the screenshot shows (almost) no coloured lines"
    return {c["title"]: c for c in charts}, answers


def drawn(chart: dict, name: str | None = None) -> dict:
    """The line `name` (the only line when None) of a rendered chart; it must have a visible extent."""
    assert chart["width"] > 300 and chart["height"] > 200 and not chart["no_data"], chart
    lines = [s for s in chart["series"] if name is None or s["name"] == name]
    assert len(lines) == 1, (name, chart)
    assert lines[0]["width"] > 100, lines[0]
    return lines[0]


def dashboards_of(cloudwatch, stack: str) -> list[str]:
    return [
        d["DashboardName"]
        for d in cloudwatch.list_dashboards(DashboardNamePrefix=f"pcflow-{stack}")["DashboardEntries"]
    ]


def statistic(cloudwatch, name: str, dims: list[dict], stat: str = "Maximum") -> list[float]:
    now = dt.datetime.now(dt.UTC)
    data = cloudwatch.get_metric_statistics(
        Namespace=NAMESPACE,
        MetricName=name,
        Dimensions=dims,
        StartTime=now - dt.timedelta(hours=1),
        EndTime=now + dt.timedelta(minutes=5),
        Period=60,
        Statistics=[stat],
    )["Datapoints"]
    return [d[stat] for d in data]


#: What the first task said of this run (pcflow.budget's `cost` section), as the harvest receives it.
COST_BEFORE = {
    "summary": "Cost of this run: up to $100.00 (budget $200.00): ...",
    "maximum_usd": 100.0,
    "budget_usd": 200.0,
    "per_hour": 32.7726 + 0.17 + 1200 * 0.14 / 730,
    "compute_per_node_hour": 32.7726,
    "infrastructure_per_hour": 0.17 + 1200 * 0.14 / 730,
    "nodes": 1,
    "if_maximum_exceeds": "refuse",
}


def run_cost_points(cloudwatch, stack: str) -> list[tuple[float, float]]:
    """(SampleCount, Sum) of the stack's RunCostUSD over the last three hours."""
    now = dt.datetime.now(dt.UTC)
    data = cloudwatch.get_metric_statistics(
        Namespace=NAMESPACE,
        MetricName="RunCostUSD",
        Dimensions=[{"Name": "stack", "Value": stack}],
        StartTime=now - dt.timedelta(hours=3),
        EndTime=now,
        Period=3 * 3600,
        Statistics=["SampleCount", "Sum"],
    )["Datapoints"]
    return [(d["SampleCount"], d["Sum"]) for d in data]


def test_real_job_harvested_published_and_rendered(slurm, s3, cloudwatch, bucket, stack_name, artifacts_dir):  # noqa: PLR0917 - fixtures
    context = make_context("train")
    train = SlurmJobOperator(
        task_id="train",
        program=["bash", "-c", TRAIN],
        env={"UTILISATION_INTERVAL_S": "0.5"},
        deferrable=False,
        poll_interval=0.2,
        confirm_interval=2.0,
    )
    job = train.execute(context)
    assert job["state"] == "COMPLETED"

    model = AssetAlias(name="pcflow-test-model")
    harvest = HarvestMetricsOperator(
        task_id="metrics",
        job=json.dumps(job),  # a template rendered without native objects: JSON text
        bucket=bucket,
        stack=stack_name,
        objective={"name": "probe_accuracy", "mode": "max"},
        metric_definitions=[{"Name": "top1", "Regex": r"top1=([0-9.]+)"}, {"name": "never", "regex": r"zzz=(\d+)"}],
        instance_type="p4d.24xlarge",
        capacity_type="ondemand",
        head_instance_type="c5.xlarge",
        fsx_storage_gib=1200,
        cost_before=COST_BEFORE,
        dataset={"partition": "2026-11-29", "content_hash": "c0ffee", "uploaded": 3},  # the load's XCom
        outlets=[model],
    )
    metrics_context = make_context("metrics", run_id=context["run_id"])
    # The DAG run began two hours ago: the head node and FSx are priced over that window.
    metrics_context["dag_run"] = types.SimpleNamespace(start_date=dt.datetime.now(dt.UTC) - dt.timedelta(hours=2))
    metrics_context["outlet_events"] = OutletEventAccessors()
    summary = harvest.execute(metrics_context)

    # XCom: small, with final and best of each metric, objective, cost, elapsed, what was missing.
    assert summary["outcome"] == "completed" and summary["job_id"] == job["job_id"]
    assert summary["objective"]["value"] == pytest.approx(0.65) and summary["objective"]["final"] == pytest.approx(0.65)
    assert summary["metrics"]["loss"] == {"final": pytest.approx(2 / 6), "best": pytest.approx(2 / 6)}
    assert summary["metrics"]["top1"]["final"] == pytest.approx(0.65)
    assert "metric never" in summary["missing"] and "lr" not in summary["metrics"]  # NaN only: no final
    assert summary["cost_usd_estimate"] > 0 and summary["elapsed_s"] >= 2
    assert len(json.dumps(summary)) < 4000

    # The model and the newest checkpoint are in S3; the event of this stack's own model Asset (through
    # the alias) carries their URIs, their sha256 (what a later run loads them with) and the summary.
    prefix = f"runs/{summary['run_key']}/"
    assert summary["model"] == {
        "prefix": f"s3://{bucket}/{prefix}model/",
        "model": f"s3://{bucket}/{prefix}model/model.pt",
        "model_sha256": hashlib.sha256(b"the model\n").hexdigest(),
        "checkpoint": f"s3://{bucket}/{prefix}model/checkpoints/epoch-0006.pt",
        "checkpoint_sha256": hashlib.sha256(b"checkpoint 6\n").hexdigest(),
    }
    assert s3.get_object(Bucket=bucket, Key=prefix + "model/model.pt")["Body"].read() == b"the model\n"
    (event,) = metrics_context["outlet_events"][model].asset_alias_events
    assert (event.dest_asset_key.name, event.dest_asset_key.uri) == (
        f"pcflow-test-model-{stack_name}",
        f"x-pcflow://{stack_name}/pcflow-test-model",
    )
    extra = event.extra
    assert extra["run_key"] == summary["run_key"] and extra["objective"]["value"] == pytest.approx(0.65)
    assert extra["report"] == summary["report"] and extra["model"] == summary["model"]
    assert extra["dataset"] == {"partition": "2026-11-29", "content_hash": "c0ffee"}  # what it was trained on

    # S3: metrics.json and report.html under runs/<run key>/.
    document = json.loads(s3.get_object(Bucket=bucket, Key=prefix + "metrics.json")["Body"].read())
    assert document["model"]["model_sha256"] == summary["model"]["model_sha256"]
    assert (
        document["sources"]["metrics_file"]["bad_lines"] == 1 and document["sources"]["metrics_file"]["truncated_tail"]
    )
    assert document["metrics"]["lr"]["diverged"] is True
    assert [p[3] for p in document["series"]["probe_accuracy"]] == pytest.approx([0.3 + 0.07 * e for e in range(6)])
    assert document["accounting"]["source"] == "sacct" and document["accounting"]["alloc_cpus"] >= 1
    # MaxRSS comes from jobacct_gather's polls (every 5 s here): a 3-second step may have none yet.
    assert "max_rss_bytes" in document["accounting"] and document["accounting"]["node_seconds"] >= 2
    assert document["utilisation"]["samples"] >= 2 and document["utilisation"]["cpu_percent_mean"] is not None
    assert document["utilisation"]["gpus"] == 0 and "gpu_util_percent_mean" not in document["utilisation"]
    bill = document["cost"]
    assert bill["estimate"] is True and bill["price_table_as_of"] == prices.bundled_prices()["as_of"]
    lines = {line["what"]: line for line in bill["lines"]}
    assert set(lines) == {"compute (on-demand)", "head node", "FSx for Lustre"}
    # The Price List API (the stand-in's sample) prices c5.xlarge, not p4d.24xlarge; FSx is the table's.
    assert bill["price_sources"] == ["price-list", "table"] and dt.date.fromisoformat(bill["price_list_as_of"])
    assert [lines[w]["source"] for w in ("compute (on-demand)", "head node", "FSx for Lustre")] == [
        "table",
        "price-list",
        "table",
    ]
    assert lines["head node"]["quantity"] == pytest.approx(2, abs=0.05)  # hours of the run's window
    assert lines["head node"]["usd"] == pytest.approx(2 * 0.17, abs=0.01)
    assert lines["FSx for Lustre"]["quantity"] == pytest.approx(2, abs=0.05)
    assert lines["FSx for Lustre"]["price_per_hour"] == pytest.approx(1200 * 0.14 / 730, rel=1e-3)
    # Before the run, and so far at each evaluation: the head node and FSx since the run began (2 h ago),
    # the node since the job started, at the prices the first task checked.
    assert document["cost_before"]["maximum_usd"] == 100.0 and document["cost_before"]["budget_usd"] == 200.0
    checkpoints = [c["usd"] for c in document["cost_checkpoints"]]
    assert len(checkpoints) == 6 and checkpoints == sorted(checkpoints)
    assert checkpoints[0] == pytest.approx(2 * COST_BEFORE["infrastructure_per_hour"], abs=0.02)
    times = [point[2] for point in document["series"]["probe_accuracy"]]
    per_second = COST_BEFORE["per_hour"] / 3600  # within a second: sacct's job start has whole seconds
    assert checkpoints[-1] - checkpoints[0] == pytest.approx(per_second * (times[-1] - times[0]), abs=per_second)

    # The report, as Chromium lays it out: every curve drawn with all its points, utilisation too.
    html = s3.get_object(Bucket=bucket, Key=prefix + "report.html")["Body"].read().decode()
    charts, (estimate_label, model_link, before, rows) = render(
        html,
        artifacts_dir,
        "report",
        "document.querySelector('.estimate').textContent",
        "document.querySelector('#model a').textContent",
        "document.querySelector('#cost-before').textContent",
        "document.querySelectorAll('#cost-checkpoints tr').length",
    )
    assert estimate_label == "estimate" and model_link == summary["model"]["model"] and rows == 1 + 6
    assert f'<span class="sha256" id="model-sha256">sha256 {summary["model"]["model_sha256"]}</span>' in html
    assert f"(prices: price-list {bill['price_list_as_of']}, table as of {bill['price_table_as_of']})" in html
    assert before.startswith("Before the run: Cost of this run: up to $100.00 (budget $200.00)")
    for name in ("loss", "probe_accuracy", "top1"):
        line = drawn(charts[name])
        assert charts[name]["section"] == "metric-charts" and line["points"] == 6 and line["height"] > 10
    cpu = charts["CPU use per node (%)"]
    assert cpu["section"] == "utilisation-charts" and drawn(cpu)["points"] >= 2
    assert not any(title.startswith("GPU") for title in charts)  # no GPU here, and no empty GPU chart

    # CloudWatch: the metric data, with the stack/dag/run/trial dimensions, and the stack's one dashboard.
    listed = cloudwatch.list_metrics(Namespace=NAMESPACE, Dimensions=[{"Name": "stack", "Value": stack_name}])
    names = {m["MetricName"] for m in listed["Metrics"]}
    assert {"loss", "probe_accuracy", "probe_accuracy_best", "cost_usd_estimate", "cpu_percent"} <= names
    full_dims = next(m["Dimensions"] for m in listed["Metrics"] if m["MetricName"] == "probe_accuracy")
    assert {d["Name"]: d["Value"] for d in full_dims} == {
        "stack": stack_name,
        "dag": "slurm_tests",
        "run": summary["run_key"],
        "trial": "none",
    }
    assert max(statistic(cloudwatch, "probe_accuracy", full_dims)) == pytest.approx(0.65)
    count = sum(statistic(cloudwatch, "probe_accuracy", full_dims, "SampleCount"))
    assert count == 6
    assert dashboards_of(cloudwatch, stack_name) == [dashboard_name(stack_name)]
    body = json.loads(cloudwatch.get_dashboard(DashboardName=dashboard_name(stack_name))["DashboardBody"])
    titles = [w["properties"]["title"] for w in body["widgets"]]
    assert "pcflow probe_accuracy_best" in titles and "pcflow RunCostUSD per day" in titles
    # The run's cost for the stack's spend: dimension stack only, stamped with the run's start.
    spend = run_cost_points(cloudwatch, stack_name)
    assert spend == [(1, pytest.approx(bill["total_usd"], rel=1e-3))]

    # Links, pushed for the UI.
    xcoms = metrics_context["ti"].xcoms
    assert xcoms[MetricsReportLink().xcom_key] == report_path("slurm_tests", context["run_id"])  # inside Airflow
    assert dashboard_name(stack_name) in xcoms[MetricsDashboardLink().xcom_key]

    # Re-harvest: same keys overwritten, no datapoint sent twice, no widget or dashboard duplicated.
    again = harvest.execute(make_context("metrics", run_id=context["run_id"]))
    assert again["run_key"] == summary["run_key"]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    outputs = ("model/model.pt", "model/checkpoints/epoch-0006.pt", "cloudwatch-run-cost.json")
    assert sorted(keys) == sorted(prefix + k for k in ("metrics.json", "report.html", "cloudwatch.json", *outputs))
    assert sum(statistic(cloudwatch, "probe_accuracy", full_dims, "SampleCount")) == count
    assert run_cost_points(cloudwatch, stack_name) == spend  # once per run
    body2 = json.loads(cloudwatch.get_dashboard(DashboardName=dashboard_name(stack_name))["DashboardBody"])
    assert [w["properties"]["title"] for w in body2["widgets"]] == titles
    assert dashboards_of(cloudwatch, stack_name) == [dashboard_name(stack_name)]


# A short job whose node has a GPU board: the stand-in nvidia-smi below, first on the job's PATH.
GPU_TRAIN = r"""
for e in 0 1 2; do
  printf '{"time": %s, "epoch": %d, "name": "loss", "value": %s}\n' "$(date +%s.%N)" $e "1.$((9 - 3 * e))" \
    >> "$PCFLOW_METRICS_FILE"
  sleep 0.8
done
"""
STANDIN = Path(__file__).with_name("nvidia_smi_standin.py")


def test_gpu_use_reaches_harvest_report_and_cloudwatch_standin_nvidia_smi(  # noqa: PLR0917 - fixtures
    slurm, s3, cloudwatch, bucket, stack_name, artifacts_dir
):
    """GPU sampling with a stand-in `nvidia-smi` (no GPU here) that prints what NVIDIA documents for
    `--query-gpu=... --format=csv,noheader,nounits`: four GPUs at 85/80/75/90 % and fixed memory.
    The node is priced as spot (moto's EC2 spot price history), its cluster as ParallelCluster settings."""
    bin_dir = f"{slurm.shared_root}/standin-{uuid.uuid4().hex[:8]}/bin"
    slurm.makedirs(bin_dir)
    try:
        slurm.write_file(f"{bin_dir}/nvidia-smi", STANDIN.read_bytes(), mode=0o755)
        path = slurm.run(["printenv", "PATH"]).stdout.strip()
        context = make_context("train")
        train = SlurmJobOperator(
            task_id="train",
            program=["bash", "-c", GPU_TRAIN],
            env={"UTILISATION_INTERVAL_S": "0.5", "PATH": f"{bin_dir}:{path}"},
            deferrable=False,
            poll_interval=0.2,
            confirm_interval=2.0,
        )
        job = train.execute(context)
    finally:
        slurm.run(["rm", "-rf", bin_dir.removesuffix("/bin")], check=False)
    cluster = {
        "name": "pcflow-t",
        "region": "us-east-1",
        "key_name": "k",
        "head_subnet_id": "subnet-0123abcd",
        "ssh_allowed_ips": "203.0.113.0/24",
        "head_node_instance_type": "c5.2xlarge",
        "s3_bucket": bucket,
        "fsx": {"deployment_type": "PERSISTENT_2", "storage_capacity_gib": 2400, "per_unit_storage_throughput": 250},
    }
    harvest = HarvestMetricsOperator(
        task_id="metrics",
        job=job,
        bucket=bucket,
        stack=stack_name,
        objective="loss:min",
        instance_type="g5.12xlarge",
        capacity_type="spot",
        cluster_provider="parallelcluster",
        cluster=cluster,
    )
    summary = harvest.execute(make_context("metrics", run_id=context["run_id"]))
    assert summary["outcome"] == "completed" and summary["gpu_util_percent_mean"] == 330.0

    # The harvest: the job's GPU use summed as the seeds count it (330% of 400%), memory, and per GPU.
    document = json.loads(s3.get_object(Bucket=bucket, Key=f"runs/{summary['run_key']}/metrics.json")["Body"].read())
    util = document["utilisation"]
    memory = [(20480, 85), (18432, 80), (16384, 75), (22528, 90)]  # (MiB used of 23028, % busy) per GPU
    assert util["samples"] >= 2 and util["gpus"] == 4 and util["gpu_util_capacity_percent"] == 400
    assert util["gpu_util_percent_mean"] == 330.0 and util["gpu_util_percent_per_gpu_mean"] == 82.5
    assert util["gpu_memory_percent_mean"] == pytest.approx(100 * sum(m for m, _ in memory) / (4 * 23028), abs=0.05)
    assert [(g["index"], g["util_percent_mean"], g["memory_used_mb_max"]) for g in util["per_gpu"]] == [
        (i, busy, used) for i, (used, busy) in enumerate(memory)
    ]
    assert util["per_gpu"][3]["memory_percent_mean"] == pytest.approx(100 * 22528 / 23028, abs=0.05)

    # The cost: spot from EC2's price history (moto answers every type with a canned 0.00001 $/h), the
    # head node and PERSISTENT_2 FSx from the cluster settings, all an estimate.
    lines = {line["what"]: line for line in document["cost"]["lines"]}
    assert document["cost"]["estimate"] is True and document["cost"]["capacity_type"] == "spot"
    assert lines["compute (spot)"]["source"] == "spot-history"
    assert lines["compute (spot)"]["basis"] == "EC2 spot price history"
    assert lines["compute (spot)"]["price_per_hour"] == pytest.approx(0.00001)
    assert lines["head node"]["item"] == "c5.2xlarge" and lines["FSx for Lustre"]["item"] == "2400 GiB PERSISTENT_2_250"
    assert document["cost"]["spot_savings"]["percent"] > 99

    # The report, in Chromium: the GPU chart draws both lines, the per-GPU table has the four GPUs.
    html = s3.get_object(Bucket=bucket, Key=f"runs/{summary['run_key']}/report.html")["Body"].read().decode()
    rows_js = "[...document.querySelectorAll('#gpu-table tr')].slice(1).map(r => r.innerText.split('\\t'))"
    charts, (rows,) = render(html, artifacts_dir, "report-gpu", rows_js)
    assert drawn(charts["GPU use (% of one GPU, summed)"], "gpu util % (sum)")["points"] >= 2
    assert drawn(charts["GPU memory used (%)"], "gpu memory %")["points"] >= 2
    assert [row[1] for row in rows] == ["85", "80", "75", "90"] and len(rows) == 4
    assert "330% of 400% (4 GPUs)" in html

    # CloudWatch: GPU use (summed, and per GPU) and GPU memory, under the run's dimensions.
    dims = [
        {"Name": "stack", "Value": stack_name},
        {"Name": "dag", "Value": "slurm_tests"},
        {"Name": "run", "Value": summary["run_key"]},
        {"Name": "trial", "Value": "none"},
    ]
    assert statistic(cloudwatch, "gpu_util_percent", dims) == [330.0]
    assert statistic(cloudwatch, "gpu_util_percent_per_gpu", dims) == [82.5]
    assert statistic(cloudwatch, "gpu_memory_percent", dims) == [pytest.approx(util["gpu_memory_percent_mean"])]
    widgets = json.loads(cloudwatch.get_dashboard(DashboardName=dashboard_name(stack_name))["DashboardBody"])
    assert {"pcflow gpu_util_percent", "pcflow gpu_memory_percent"} <= {
        w["properties"]["title"] for w in widgets["widgets"]
    }


def test_spot_price_history_on_the_emulator_and_the_table_as_fallback(local_stack):
    """The spot price comes from EC2's history where it has one (moto: a canned price per offered type);
    a type without history falls back to the dated table's on-demand price less the typical discount,
    and a price the table lacks can be supplied per run."""
    ec2 = aws_client("ec2", aws_conn_id="aws_default")
    end = dt.datetime.now(dt.UTC)
    start = end - dt.timedelta(hours=3)
    assert cost.spot_price(ec2, "p4d.24xlarge", start, end) == pytest.approx(0.00001)
    assert cost.spot_price(ec2, "x9.huge", start, end) is None  # no history for an unknown type
    table = prices.price_table({"on_demand_per_hour": {"x9.huge": 10.0}})
    bill = cost.estimate(cost.CostInputs("x9.huge", "spot", node_seconds=7200, start=start, end=end), table, ec2=ec2)
    (line,) = bill["lines"]
    assert bill["estimate"] is True and bill["price_table_as_of"] == table["as_of"]
    assert line["source"] == "table" and bill["price_sources"] == ["table"]
    assert line["basis"] == f"us-east-1 price table as of {table['as_of']}, less the typical spot discount"
    assert line["usd"] == pytest.approx(2 * 10.0 * (1 - table["spot_discount_when_unknown"]))
    assert bill["spot_savings"] == {"usd": pytest.approx(14.0), "percent": 70.0}


def test_nothing_to_read_is_reported_not_raised(slurm):
    """A job that left nothing (no run directory, no log, unknown to Slurm): the harvest lists what is
    missing and why; only a metric declared required fails it."""
    run_dir = f"{slurm.shared_root}/never-ran-{uuid.uuid4().hex[:8]}"
    ref = JobRef(job_id="99999999", run_dir=run_dir, log=f"{run_dir}/job.log", metrics_file=f"{run_dir}/metrics.jsonl")
    definitions = parse_definitions([{"name": "acc", "regex": r"acc=(\S+)"}])
    document = harvest_job(slurm, ref, definitions=definitions, objective=Objective("acc", "max"))
    assert [m["what"] for m in document["missing"]] == [
        "metrics file",
        "job log",
        "objective acc",
        "accounting",
        "utilisation samples",
    ]
    assert document["outcome"] == "unknown" and document["metrics"] == {} and document["objective"]["value"] is None
    with pytest.raises(RequiredMetricMissing, match="required metric 'acc' has no finite value"):
        harvest_job(slurm, ref, definitions=definitions, required=["acc"])
