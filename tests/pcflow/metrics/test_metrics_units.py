"""Parsing and decision units of the metrics stage: no stack needed."""

from __future__ import annotations

import datetime as dt
import io
import json
import math

import boto3
import pytest
from botocore.stub import Stubber

from pcflow.budget import checkpoint_costs
from pcflow.jobstates import JobState, parse_sacct_usage, parse_scontrol_usage, parse_size
from pcflow.metric_definitions import MetricDefinition, parse_definitions
from pcflow.metrics.definitions import scan_log
from pcflow.metrics.leaderboard import leaderboard_csv, rank_trials
from pcflow.metrics.publish import dashboard_body, run_cost, run_cost_datum
from pcflow.metrics.report import fmt, render_report
from pcflow.prices import NoPrices, price_table
from pcflow.pricing.cost import CostInputs, estimate
from pcflow.readings.jsonlines import read_metric_lines
from pcflow.readings.series import Objective, group
from pcflow.readings.stopping import decide
from pcflow.readings.utilisation import read_samples
from pcflow.runspec import RunSpecError, resolve_run_spec


def line(name, value, step, epoch=0, split="train"):
    return json.dumps({"time": 1.0 + step, "epoch": epoch, "step": step, "name": name, "value": value, "split": split})


def test_pcflow_lines_bad_lines_nan_and_truncated_tail():
    text = "\n".join(
        [line("loss", 2.0, 0), "garbage", line("loss", 1.0, 1), '{"name": "loss"}', line("loss", math.nan, 2)]
    )
    text += '\n{"time": 3, "name": "lo'
    read = read_metric_lines(text)
    assert read.lines == 6 and read.bad_lines == 3 and read.truncated_tail
    summary = group(read.points)["loss"].summary()
    assert summary["final"] == 1.0 and summary["best"] == 1.0 and summary["diverged"] and summary["non_finite"] == 1


def test_requeued_step_keeps_the_later_point_and_splits_stay_apart():
    points = read_metric_lines(
        "\n".join([line("loss", 5.0, 1), line("loss", 4.0, 1), line("acc", 0.5, 1, split="eval")])
    )
    series = group(points.points)
    assert [p.value for p in series["loss"].points] == [4.0] and series["acc"].split == "eval"


def test_vissl_metrics_json():
    record = {
        "iteration": 500,
        "phase_idx": 1,
        "train_phase_idx": 0,
        "test_accuracy_list_meter": {"top_1": {"res5": 41.2}, "top_5": {"res5": 70.3}},
    }
    read = read_metric_lines(json.dumps(record) + "\n")
    by_name = {p.name: p for p in read.points}
    point = by_name["test_accuracy_list_meter/top_1/res5"]
    assert (point.value, point.step, point.epoch, point.split) == (41.2, 500, 0, "eval")


def test_regex_definitions_validated_and_scanned():
    with pytest.raises(ValueError, match="invalid regex"):
        MetricDefinition("acc", "acc=([0-9")
    with pytest.raises(ValueError, match="exactly one capturing group"):
        MetricDefinition("acc", r"(acc)=(\d+)")
    with pytest.raises(ValueError, match="unique"):
        parse_definitions([{"Name": "a", "Regex": r"a=(\d)"}, {"name": "a", "regex": r"b=(\d)"}])
    # In a run's settings, refused by the first task, before anything is created or trained.
    with pytest.raises(RunSpecError, match=r"metrics.metric_definitions: .*invalid regex"):
        resolve_run_spec("local", {"metrics": {"metric_definitions": [{"name": "acc", "regex": "acc=([0-9"}]}})
    spec = resolve_run_spec("local", {"metrics": {"metric_definitions": [{"Name": "acc", "Regex": r"acc=(\S+)"}]}})
    assert spec.metrics.metric_definitions == [{"name": "acc", "regex": r"acc=(\S+)"}]
    defs = parse_definitions([{"Name": "acc", "Regex": r"acc=([0-9.eE+-]+|nan)"}, {"name": "none", "regex": r"x=(\d)"}])
    points, unmatched = scan_log("epoch 1 acc=0.5\nepoch 2 acc=0.6\nacc=nan\n", defs)
    assert [p.value for p in points][:2] == [0.5, 0.6] and math.isnan(points[2].value) and unmatched == ["none"]


SACCT = """\
77|NODE_FAIL|0:0|100|2|gpu-[1-2]|16|billing=16,cpu=16,gres/gpu=16,node=2||2026-01-01T00:00:00|2026-01-01T00:01:40
77|COMPLETED|0:0|3600|2|gpu-[1-2]|16|billing=16,cpu=16,gres/gpu=16,node=2||2026-01-01T00:02:00|2026-01-01T01:02:00
77.batch|COMPLETED|0:0|3600|1|gpu-1|8|cpu=8,mem=0,node=1|11952K|2026-01-01T00:02:00|2026-01-01T01:02:00
77.0|COMPLETED|0:0|3600|2|gpu-[1-2]|16|cpu=16,node=2|1.5G|2026-01-01T00:02:00|2026-01-01T01:02:00
"""


def test_sacct_usage_sums_attempts_and_takes_step_rss():
    usage = parse_sacct_usage(SACCT, "77")
    assert usage.state is JobState.COMPLETED and usage.attempts == 2 and usage.node_seconds == 2 * 100 + 2 * 3600
    assert usage.alloc_gpus == 16 and usage.alloc_cpus == 16 and usage.max_rss_bytes == parse_size("1.5G")
    assert [(a["attempt"], a["state"], a["node_list"], a["elapsed_s"]) for a in usage.history] == [
        (1, "NODE_FAIL", "gpu-[1-2]", 100),
        (2, "COMPLETED", "gpu-[1-2]", 3600),
    ]
    assert usage.history[0]["start"] == "2026-01-01T00:00:00" and usage.history[1]["end"] == "2026-01-01T01:02:00"
    assert parse_sacct_usage(SACCT, "78") is None


def test_scontrol_usage():
    out = (
        "JobId=9 JobName=t JobState=COMPLETED Reason=None ExitCode=0:0 RunTime=00:10:00 Restarts=0 "
        "StartTime=2026-01-01T00:00:00 EndTime=2026-01-01T00:10:00 NodeList=gpu-1 NumNodes=1 NumCPUs=8 "
        "AllocTRES=cpu=8,mem=10G,node=1,billing=8,gres/gpu:a100=4"
    )
    usage = parse_scontrol_usage(out)
    assert usage.node_seconds == 600 and usage.alloc_gpus == 4 and usage.max_rss_bytes is None


def test_utilisation_gpu_sum_as_the_seeds_count_it():
    lines = [
        json.dumps(
            {
                "time": t + (2.4 if h == "b" else 0),  # nodes sample on their own clocks
                "host": h,
                "cpu_percent": 50,
                "mem_used_mb": 1,
                "mem_total_mb": 2,
                "gpus": [{"index": i, "util": 70 + 5 * i, "mem_used_mb": 30, "mem_total_mb": 40} for i in range(4)],
            }
        )
        for t in (0, 5, 10)
        for h in ("a", "b")
    ]
    summary = read_samples("\n".join([*lines, "{torn"])).summary()
    assert (
        summary["gpus"] == 8 and summary["gpu_util_percent_mean"] == 620 and summary["gpu_util_capacity_percent"] == 800
    )
    assert summary["gpu_util_percent_per_gpu_mean"] == 77.5
    assert summary["gpu_memory_percent_mean"] == 75 and summary["bad_lines"] == 1
    per_gpu = {(g["host"], g["index"]): g["util_percent_mean"] for g in summary["per_gpu"]}
    assert per_gpu == {(h, i): 70 + 5 * i for h in "ab" for i in range(4)}


def test_cost_spot_falls_back_to_discount_and_reports_savings():
    bill = estimate(CostInputs("p4d.24xlarge", "spot", node_seconds=2 * 3600), price_table())
    assert bill["estimate"] and bill["spot_savings"]["percent"] == 70.0
    unknown = estimate(CostInputs("x9.huge", node_seconds=3600), price_table())
    assert unknown["total_usd"] is None and "not in the price table" in unknown["unknown"][0]
    custom = estimate(CostInputs("x9.huge", node_seconds=3600), price_table({"on_demand_per_hour": {"x9.huge": 2.0}}))
    assert custom["total_usd"] == 2.0


def test_spot_price_history_refused_falls_back_to_the_table_standin_ec2():
    """A role without ec2:DescribeSpotPriceHistory (botocore's Stubber stands in for EC2's refusal)."""
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    end = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    with Stubber(ec2) as stub:
        stub.add_client_error("describe_spot_price_history", "UnauthorizedOperation", http_status_code=403)
        inputs = CostInputs("g5.12xlarge", "spot", node_seconds=3600, start=end - dt.timedelta(hours=1), end=end)
        bill = estimate(inputs, price_table(), ec2=ec2)
        stub.assert_no_pending_responses()
    assert bill["lines"][0]["source"] == "table" and bill["price_sources"] == ["table"]
    assert bill["lines"][0]["basis"] == "us-east-1 price table as of 2026-11-01, less the typical spot discount"
    assert bill["lines"][0]["price_per_hour"] == pytest.approx(5.672 * 0.3)


def test_spot_after_a_move_to_another_zone_is_priced_at_that_zones_history_standin_ec2():
    """A capacity fallback in us-east-1b ran the nodes there: that zone's spot prices, not the region's mean
    (botocore's Stubber stands in for EC2's answer, which also lists another zone: the filter is kept here too)."""
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    end = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    history = [
        {"AvailabilityZone": "us-east-1a", "SpotPrice": "4.0", "InstanceType": "g5.12xlarge"},
        {"AvailabilityZone": "us-east-1b", "SpotPrice": "2.0", "InstanceType": "g5.12xlarge"},
        {"AvailabilityZone": "us-east-1b", "SpotPrice": "3.0", "InstanceType": "g5.12xlarge"},
    ]
    with Stubber(ec2) as stub:
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": history})
        start = end - dt.timedelta(hours=1)
        inputs = CostInputs(
            "g5.12xlarge", "spot", node_seconds=3600, start=start, end=end, availability_zone="us-east-1b"
        )
        bill = estimate(inputs, price_table(), ec2=ec2)
    assert bill["lines"][0]["price_per_hour"] == pytest.approx(2.5)
    assert bill["lines"][0]["basis"] == "EC2 spot price history in us-east-1b"


def test_report_numbers_read_as_numbers():
    assert [fmt(0.65), fmt(2 / 3), fmt(330.0), fmt(20480.0), fmt(None), fmt(7)] == [
        "0.65",
        "0.6667",
        "330",
        "20480",
        "—",
        "7",
    ]


def test_report_shows_trained_and_untrained_side_by_side():
    metrics = {"fewshot_accuracy": {"final": 0.62}, "fewshot_accuracy_untrained": {"final": 0.47}, "loss": {"final": 5}}
    html = render_report({"run_key": "r", "metrics": metrics, "cost": {}, "utilisation": {}})
    assert "<th>fewshot_accuracy</th><td>trained 0.62 · untrained 0.47 (" in html
    assert html.count('class="versus"') == 1


def test_report_names_the_environment_and_image_the_run_trained_in():
    environment = {"id": "e" * 20, "built": True, "build_s": 12.5, "python": "/shared/pcflow/envs/e/bin/python"}
    image = {"reference": "oci:/i:<b>", "digest": "sha256:" + "ab" * 32, "imported": False, "runtime": "oci"}
    doc = {"run_key": "r", "metrics": {}, "cost": {}, "utilisation": {}, "environment": environment, "container": image}
    html = render_report(doc)
    assert f'<td id="environment">{"e" * 20} (built by this run in 12.5 s), /shared/pcflow/envs/e/bin/python' in html
    assert "oci:/i:&lt;b&gt; at" in html and "ab" * 32 in html and "(imported before, oci)" in html
    plain = render_report({**doc, "environment": {**environment, "id": None, "built": False}, "container": None})
    assert '<td id="environment">the profile\'s, ' in plain and 'id="container"' not in plain


def test_objective_and_leaderboard():
    assert Objective.parse("loss:min") == Objective("loss", "min")
    with pytest.raises(ValueError):
        Objective.parse({"name": "acc", "mode": "up"})
    docs = [
        {
            "job": {"trial": i, "hyperparameters": {"lr": lr}},
            "outcome": "completed",
            "objective": {"value": v, "final": v},
        }
        for i, (lr, v) in enumerate([(0.1, 0.5), (0.2, None), (0.3, 0.7)])
    ]
    rows = rank_trials(docs, Objective("acc", "max"))
    assert [r["trial"] for r in rows] == [2, 0, 1] and rows[2]["rank"] is None
    assert leaderboard_csv(rows).splitlines()[1].startswith("1,2,completed,0.7")


def test_early_stop_decision():
    obj = Objective("acc", "max")
    assert not decide([0.1, 0.2, 0.3], obj, patience=2).stop
    assert decide([0.1, 0.5, 0.4, 0.45], obj, patience=2).reason == "no_improvement"
    assert decide([0.1, math.nan], obj, patience=5).reason == "diverged"
    assert not decide([1.0, 0.9, 0.95], Objective("loss", "min"), patience=2).stop


def test_prices_are_per_region_and_a_region_the_table_lacks_is_unpriced():
    assert price_table(region="us-east-1")["on_demand_per_hour"]["g5.12xlarge"] == 5.672
    with pytest.raises(NoPrices, match=r"has no prices for region eu-west-1 \(it has us-east-1\)"):
        price_table(region="eu-west-1")
    assert price_table({"on_demand_per_hour": {"c5.xlarge": 0.2}}, region="eu-west-1")["region"] == "eu-west-1"


def test_cost_so_far_at_each_evaluation_from_the_prices_checked_before_the_run():
    before = {"compute_per_node_hour": 3.6, "infrastructure_per_hour": 0.36, "nodes": 2}
    start = dt.datetime(2026, 11, 1, 10, 0, tzinfo=dt.UTC)
    points = [[10, 0, (start + dt.timedelta(minutes=30)).timestamp(), 0.5], [20, 1, None, 0.6]]
    (row,) = checkpoint_costs(before, points, job_start=start + dt.timedelta(minutes=10), run_start=start)
    # nodes: 2 x 20 min at $3.60/h = $2.40; head node and FSx: 30 min at $0.36/h = $0.18
    assert row == {"step": 10, "epoch": 0, "time": points[0][2], "value": 0.5, "usd": pytest.approx(2.58)}
    assert checkpoint_costs(before, points, job_start=None, run_start=start) == []


def test_a_runs_cost_counts_every_trials_nodes_and_the_cluster_once():
    def trial(compute: float) -> dict:
        lines = [
            {"what": "compute (spot)", "usd": compute},
            {"what": "head node", "usd": 1.0},
            {"what": "FSx for Lustre", "usd": 0.5},
        ]
        return {"cost": {"lines": lines}}

    assert run_cost([trial(2.0), trial(3.0), trial(4.0)]) == 10.5
    assert run_cost([{"cost": {"lines": []}}]) is None
    datum = run_cost_datum(
        "research", 10.5, dt.datetime(2026, 11, 1, tzinfo=dt.UTC), dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
    )
    assert datum["MetricName"] == "RunCostUSD" and datum["Dimensions"] == [{"Name": "stack", "Value": "research"}]
    body = dashboard_body("research", "us-east-1", ["loss"], None)
    spend = body["widgets"][-1]["properties"]
    assert spend["title"] == "pcflow RunCostUSD per day" and spend["stat"] == "Sum" and spend["period"] == 86400
    assert dashboard_body("research", "us-east-1", ["loss"], body) == body  # merged, never duplicated


def test_the_summary_names_the_image_the_train_task_ran_in():
    """The train task's `container` (reference, digest, whether imported, runtime) reaches metrics.json and
    the run summary (the UI page shows it), from the XCom as a dict or its JSON; none without an image."""
    from pcflow.metrics.operators import container_provenance

    image = {"reference": "oci:/images:debian", "digest": "sha256:" + "ab" * 32, "imported": True, "runtime": "oci"}
    job = {"job_id": "7", "run_dir": "/shared/pcflow/runs/r", "container": image}
    assert container_provenance(job) == image and container_provenance(json.dumps(job)) == image
    assert container_provenance({**job, "container": None}) is None
    assert container_provenance({"job_id": "7", "run_dir": "/r"}) is None


def test_the_work_a_requeue_lost_is_the_step_reached_minus_the_step_resumed_from():
    from pcflow.metrics.resume import resume_record
    from pcflow.readings.series import Point

    lines = [Point("loss", 1.0, step=s, epoch=s // 10) for s in range(0, 27, 2)]  # attempt 0 logs up to step 26
    lines += [Point("probe_accuracy", 0.5, step=99, split="eval")]  # an evaluation's step is no training step
    lines += [Point("resumed_from", 20, step=20, epoch=2)]  # attempt 1: from the checkpoint at step 20
    lines += [Point("loss", 1.0, step=s, epoch=s // 10) for s in range(20, 25, 2)]  # lost again at step 24
    lines += [Point("resumed_from", 20, step=20, epoch=2), Point("loss", 0.5, step=30, epoch=3)]
    record = resume_record(lines, restarts=2)
    assert record["attempts"] == [
        {"reached_step": 26, "resumed_from_step": 20, "resumed_from_epoch": 2, "steps_lost": 6, "recovery_s": None},
        {"reached_step": 24, "resumed_from_step": 20, "resumed_from_epoch": 2, "steps_lost": 4, "recovery_s": None},
    ]
    assert (record["restarts"], record["steps_lost"], record["resumed_from"]) == (2, 10, {"step": 20, "epoch": 2})
    assert record["recovery_s"] is None  # no Slurm record of the requeues, no times on the lines
    assert resume_record([Point("loss", 1.0, step=3)], restarts=0) == {
        **{"restarts": 0, "resumed_from": None, "reached_step": None, "steps_lost": 0, "recovery_s": None},
        "attempts": [],
    }


def test_recovery_time_runs_from_slurms_requeue_to_the_first_step_after_the_resume():
    """Per resumed attempt: Slurm's End of the lost attempt to the first training step logged after the
    `resumed_from` line (not the resumed_from line itself: loading is part of the recovery)."""
    import datetime as dt

    from pcflow.metrics.resume import resume_record
    from pcflow.readings.series import Point

    t0 = dt.datetime(2026, 12, 4, 16, 0, 0, tzinfo=dt.UTC).timestamp()
    history = [
        {"attempt": 1, "state": "NODE_FAIL", "end": "2026-12-04T16:00:10"},
        {"attempt": 2, "state": "NODE_FAIL", "end": "2026-12-04T16:01:00"},
        {"attempt": 3, "state": "COMPLETED", "end": "2026-12-04T16:02:00"},
    ]
    lines = [Point("loss", 1.0, step=s, epoch=0, time=t0 + s) for s in range(0, 9)]  # lost at 16:00:10
    lines += [Point("resumed_from_epoch", 1, step=5, epoch=1, time=t0 + 40)]
    lines += [Point("resumed_from", 5, step=5, epoch=1, time=t0 + 40)]
    lines += [Point("loss", 1.0, step=s, epoch=1, time=t0 + 40 + s) for s in range(6, 12)]  # first: 16:00:46
    lines += [Point("resumed_from", 10, step=10, epoch=2, time=t0 + 70)]  # requeued at 16:01:00
    lines += [Point("lr", 0.1, step=11, epoch=2, time=t0 + 75), Point("loss", 1.0, step=11, epoch=2, time=t0 + 76)]
    record = resume_record(lines, restarts=2, history=history)
    assert [a["recovery_s"] for a in record["attempts"]] == [36.0, 15.0]
    assert record["recovery_s"] == 51.0
    assert [a["steps_lost"] for a in record["attempts"]] == [3, 1]
    # A first attempt that resumed an earlier job's checkpoint (a task retry): no requeue of this job to time.
    retry = [Point("resumed_from", 5, step=5, epoch=1, time=t0), Point("loss", 1.0, step=6, epoch=1, time=t0 + 1)]
    assert resume_record(retry, restarts=0, history=history[-1:])["attempts"][0]["recovery_s"] is None


@pytest.mark.security
def test_the_publish_marker_is_read_only_up_to_its_bound():
    """The marker of what was published (pcflow.metrics.publish) is an object in a bucket others may write:
    its read asks for no more than the bound + 1 bytes and refuses an object past it, unparsed."""
    from pcflow.aws.clients import ObjectTooLarge
    from pcflow.metrics import publish

    asked = []

    class Body:
        def __init__(self, size: int):
            self.size = size

        def read(self, n: int) -> bytes:
            asked.append(n)
            return b"[" * min(n, self.size)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class S3:
        def __init__(self, size: int):
            self.size = size

        def get_object(self, **request):
            return {"Body": Body(self.size)}

    with pytest.raises(ObjectTooLarge, match="more than pcflow writes there"):
        publish.read_json(S3(1 << 40), "b", "runs/k/published.json")  # a terabyte planted under the marker's key
    assert asked == [publish.MAX_MARKER_BYTES + 1]
    assert publish.read_json(
        type("S3", (), {"get_object": lambda self, **r: {"Body": io.BytesIO(b"[1]")}})(), "b", "k"
    ) == [1]
