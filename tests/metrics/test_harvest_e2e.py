"""End to end on the local stack: a real Slurm job writes metrics (and the sampler utilisation), the
harvest publishes to the moto server's S3 and CloudWatch, and the report renders in headless Chromium."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image
from taskcontext import make_context

from pcflow.metrics.links import MetricsDashboardLink, MetricsReportLink
from pcflow.metrics.operators import HarvestMetricsOperator
from pcflow.metrics.publish import NAMESPACE, dashboard_name
from pcflow.slurm.operators import SlurmJobOperator

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
"""

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def screenshot(html: Path, png: Path, profile: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed: run include/local/install-system-packages.sh (as root)")
    subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            "--window-size=1200,1600",
            html.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def coloured_pixels(png: Path) -> int:
    """Pixels that are neither white-ish nor grey: the coloured chart lines."""
    image = Image.open(png).convert("RGB")
    return sum(1 for r, g, b in image.getdata() if max(r, g, b) - min(r, g, b) > 60)


def test_real_job_harvested_published_and_rendered(  # noqa: PLR0917 - fixtures
    slurm, s3, cloudwatch, bucket, stack_name, artifacts_dir, tmp_path
):
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
    )
    metrics_context = make_context("metrics", run_id=context["run_id"])
    summary = harvest.execute(metrics_context)

    # XCom: small, with final and best of each metric, objective, cost, elapsed, what was missing.
    assert summary["outcome"] == "completed" and summary["job_id"] == job["job_id"]
    assert summary["objective"]["value"] == pytest.approx(0.65) and summary["objective"]["final"] == pytest.approx(0.65)
    assert summary["metrics"]["loss"] == {"final": pytest.approx(2 / 6), "best": pytest.approx(2 / 6)}
    assert summary["metrics"]["top1"]["final"] == pytest.approx(0.65)
    assert "metric never" in summary["missing"] and "lr" not in summary["metrics"]  # NaN only: no final
    assert summary["cost_usd_estimate"] > 0 and summary["elapsed_s"] >= 2
    assert len(json.dumps(summary)) < 4000

    # S3: metrics.json and report.html under runs/<run key>/.
    prefix = f"runs/{summary['run_key']}/"
    document = json.loads(s3.get_object(Bucket=bucket, Key=prefix + "metrics.json")["Body"].read())
    assert (
        document["sources"]["metrics_file"]["bad_lines"] == 1 and document["sources"]["metrics_file"]["truncated_tail"]
    )
    assert document["metrics"]["lr"]["diverged"] is True
    assert [p[3] for p in document["series"]["probe_accuracy"]] == pytest.approx([0.3 + 0.07 * e for e in range(6)])
    assert document["accounting"]["source"] == "sacct" and document["accounting"]["alloc_cpus"] >= 1
    # MaxRSS comes from jobacct_gather's polls (every 5 s here): a 3-second step may have none yet.
    assert "max_rss_bytes" in document["accounting"] and document["accounting"]["node_seconds"] >= 2
    assert document["utilisation"]["samples"] >= 2 and document["utilisation"]["cpu_percent_mean"] is not None
    assert document["cost"]["estimate"] is True and {line["what"] for line in document["cost"]["lines"]} == {
        "compute (on-demand)",
        "head node",
        "FSx for Lustre",
    }
    html = s3.get_object(Bucket=bucket, Key=prefix + "report.html")["Body"].read().decode()
    assert html.count("<polyline") >= 4 and "no data" not in html.split('id="utilisation-charts"')[1].split("</div>")[0]

    # CloudWatch: the metric data and the stack's dashboard exist.
    dims = [{"Name": "stack", "Value": stack_name}]
    listed = cloudwatch.list_metrics(Namespace=NAMESPACE, Dimensions=dims)["Metrics"]
    names = {m["MetricName"] for m in listed}
    assert {"loss", "probe_accuracy", "probe_accuracy_best", "cost_usd_estimate", "cpu_percent"} <= names
    full_dims = next(m["Dimensions"] for m in listed if m["MetricName"] == "probe_accuracy")
    now = dt.datetime.now(dt.UTC)
    data = cloudwatch.get_metric_statistics(
        Namespace=NAMESPACE,
        MetricName="probe_accuracy",
        Dimensions=full_dims,
        StartTime=now - dt.timedelta(hours=1),
        EndTime=now + dt.timedelta(minutes=5),
        Period=60,
        Statistics=["Maximum", "SampleCount"],
    )["Datapoints"]
    assert max(d["Maximum"] for d in data) == pytest.approx(0.65)
    count = sum(d["SampleCount"] for d in data)
    assert count == 6
    body = json.loads(cloudwatch.get_dashboard(DashboardName=dashboard_name(stack_name))["DashboardBody"])
    titles = [w["properties"]["title"] for w in body["widgets"]]
    assert "pcflow probe_accuracy_best" in titles

    # Links, pushed for the UI.
    xcoms = metrics_context["ti"].xcoms
    assert xcoms[MetricsReportLink().xcom_key].endswith(prefix + "report.html")
    assert dashboard_name(stack_name) in xcoms[MetricsDashboardLink().xcom_key]

    # Re-harvest: same keys overwritten, no datapoint sent twice, no widget duplicated.
    again = harvest.execute(make_context("metrics", run_id=context["run_id"]))
    assert again["run_key"] == summary["run_key"]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(keys) == sorted(prefix + k for k in ("metrics.json", "report.html", "cloudwatch.json"))
    data = cloudwatch.get_metric_statistics(
        Namespace=NAMESPACE,
        MetricName="probe_accuracy",
        Dimensions=full_dims,
        StartTime=now - dt.timedelta(hours=1),
        EndTime=now + dt.timedelta(minutes=5),
        Period=60,
        Statistics=["SampleCount"],
    )["Datapoints"]
    assert sum(d["SampleCount"] for d in data) == count
    body2 = json.loads(cloudwatch.get_dashboard(DashboardName=dashboard_name(stack_name))["DashboardBody"])
    assert [w["properties"]["title"] for w in body2["widgets"]] == titles

    # The page renders in a real browser: a screenshot in the artifacts, with the charts drawn.
    page = artifacts_dir / "report.html"
    page.write_text(html)
    png = artifacts_dir / "report.png"
    screenshot(page, png, tmp_path / "chromium-profile")
    assert png.stat().st_size > 10_000
    assert coloured_pixels(png) > 2000
