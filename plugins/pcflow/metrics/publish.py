"""Publish a harvest: S3 (metrics.json, report.html), CloudWatch (custom metrics, one dashboard per stack).

Idempotent by construction: S3 keys are the run key's, so a re-harvest overwrites them (a PUT is
atomic: a reader sees the old object or the new one, never half). CloudWatch cannot overwrite a
datapoint, so the datapoints already sent are recorded beside the report (`cloudwatch.json`) and a
re-harvest sends only the new ones. The dashboard is merged, never duplicated: one per stack.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pcflow.aws.clients import error_code, read_object
from pcflow.naming import validate_stack_name

NAMESPACE = "pcflow"
MAX_DATUMS_PER_CALL = 500
MAX_POINTS_PER_SERIES = 1000
#: The record of what was sent: datum keys of one run's series, far below this.
MAX_MARKER_BYTES = 16 * 1024**2
CLOUDWATCH_MAX_AGE = dt.timedelta(days=14)
_METRIC_NAME = re.compile(r"[^A-Za-z0-9_.:/\-]+")


def run_prefix(run_key: str) -> str:
    """`runs/<run key>/`: every object of a run under one prefix, so a re-harvest overwrites instead of adding."""
    return f"runs/{run_key}/"


def dashboard_name(stack: str) -> str:
    """`pcflow-<stack>`: one dashboard per stack; a stack name that is not valid is refused."""
    return f"pcflow-{validate_stack_name(stack)}"


def put_object(s3: Any, bucket: str, key: str, body: bytes | str, content_type: str) -> str:
    """One PUT (atomic for readers), checksummed; returns the s3:// URL."""
    data = body.encode() if isinstance(body, str) else body
    s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type, ChecksumAlgorithm="SHA256")
    return f"s3://{bucket}/{key}"


def dimensions(*, stack: str, dag_id: str, run_key: str, trial: int | None) -> list[dict[str, str]]:
    """The CloudWatch dimensions of a run's metric: stack, DAG, run and trial (`none` outside a sweep), so a
    dashboard can search across runs."""
    return [
        {"Name": "stack", "Value": stack},
        {"Name": "dag", "Value": dag_id},
        {"Name": "run", "Value": run_key},
        {"Name": "trial", "Value": "none" if trial is None else str(trial)},
    ]


def metric_name(name: str) -> str:
    """A metric name CloudWatch accepts: other characters replaced, at most 255."""
    return _METRIC_NAME.sub("_", name)[:255]


def _datum(name: str, value: float, when: dt.datetime, dims: list[dict[str, str]], unit: str = "None") -> dict:
    return {"MetricName": metric_name(name), "Value": float(value), "Timestamp": when, "Dimensions": dims, "Unit": unit}


def metric_data(document: Mapping[str, Any], dims: list[dict[str, str]], now: dt.datetime) -> list[dict[str, Any]]:
    """Datapoints of the run: each series' points (with their own times, within CloudWatch's two weeks),
    and summary values (objective best, GPU/CPU use, cost, elapsed) stamped with the run's end."""
    oldest = now - CLOUDWATCH_MAX_AGE + dt.timedelta(hours=1)
    data: list[dict[str, Any]] = []
    last_time = None
    for name, points in document.get("series", {}).items():
        for _step, _epoch, when, value in points[-MAX_POINTS_PER_SERIES:]:
            if when is None or value is None or not math.isfinite(value):
                continue
            stamp = dt.datetime.fromtimestamp(when, dt.UTC)
            if oldest <= stamp <= now + dt.timedelta(minutes=5):
                data.append(_datum(name, value, stamp, dims))
                last_time = max(last_time or stamp, stamp)
    end = _run_end(document) or last_time or now
    summary: dict[str, tuple[Any, str]] = {}
    objective = document.get("objective") or {}
    if objective.get("value") is not None:
        summary[f"{objective['name']}_best"] = (objective["value"], "None")
    util = document.get("utilisation") or {}
    for key in (
        "gpu_util_percent_mean",
        "gpu_util_percent_per_gpu_mean",
        "gpu_memory_percent_mean",
        "cpu_percent_mean",
    ):
        if util.get(key) is not None:
            summary[key.removesuffix("_mean")] = (util[key], "Percent")
    cost = document.get("cost") or {}
    if cost.get("total_usd") is not None:
        summary["cost_usd_estimate"] = (cost["total_usd"], "None")
    if document.get("elapsed_s") is not None:
        summary["elapsed_s"] = (document["elapsed_s"], "Seconds")
    for name, (value, unit) in summary.items():
        data.append(_datum(name, value, max(min(end, now), oldest), dims, unit))
    return data


#: What each run cost (its final estimate), one datapoint per run with the stack as its only dimension:
#: summed by day, it is the stack's spend.
RUN_COST_METRIC = "RunCostUSD"


def run_cost(documents: Iterable[Mapping[str, Any]]) -> float | None:
    """A run's cost from its harvested documents (one, or one per trial of a sweep): every trial's compute
    nodes, and the head node and FSx once (each trial's estimate prices them over the same run window)."""
    compute, infrastructure, priced = 0.0, 0.0, False
    for document in documents:
        lines = (document.get("cost") or {}).get("lines") or []
        nodes = sum(line["usd"] for line in lines if line["what"].startswith("compute"))
        compute += nodes
        infrastructure = max(infrastructure, sum(line["usd"] for line in lines) - nodes)
        priced = priced or bool(lines)
    return round(compute + infrastructure, 4) if priced else None


def run_cost_datum(stack: str, usd: float, when: dt.datetime, now: dt.datetime) -> dict[str, Any]:
    """RunCostUSD of one run, stamped with its start (stable across re-harvests, so sent once)."""
    oldest = now - CLOUDWATCH_MAX_AGE + dt.timedelta(hours=1)
    return _datum(RUN_COST_METRIC, usd, max(min(when, now), oldest), [{"Name": "stack", "Value": stack}])


def spend_widget(stack: str, region: str, index: int) -> dict[str, Any]:
    """The stack's spend per day: the sum of its runs' RunCostUSD."""
    search = f"SEARCH('{{{NAMESPACE},stack}} MetricName=\"{RUN_COST_METRIC}\" stack=\"{stack}\"', 'Sum', 86400)"
    return {
        "type": "metric",
        "x": (index % 2) * 12,
        "y": (index // 2) * 6,
        "width": 12,
        "height": 6,
        "properties": {
            "title": f"pcflow {RUN_COST_METRIC} per day",
            "region": region,
            "view": "timeSeries",
            "stat": "Sum",
            "period": 86400,
            "metrics": [[{"expression": search, "id": f"e{index}", "label": ""}]],
        },
    }


def _run_end(document: Mapping[str, Any]) -> dt.datetime | None:
    end = (document.get("accounting") or {}).get("end")
    try:
        return dt.datetime.fromisoformat(end).replace(tzinfo=dt.UTC) if end else None
    except ValueError:
        return None


def datum_key(datum: Mapping[str, Any]) -> str:
    """A datapoint's identity (name, dimensions, time), by which a re-harvest knows it was sent: CloudWatch
    cannot overwrite one."""
    dims = ",".join(f"{d['Name']}={d['Value']}" for d in datum["Dimensions"])
    return f"{datum['MetricName']}|{dims}|{datum['Timestamp'].isoformat()}"


def read_json(s3: Any, bucket: str, key: str) -> Any:
    """A small JSON object from S3 (bounded read), None when the key does not exist."""
    try:
        return json.loads(read_object(s3, bucket=bucket, key=key, limit=MAX_MARKER_BYTES))
    except Exception as exc:
        if error_code(exc) in ("NoSuchKey", "404"):
            return None
        raise


def publish_metric_data(
    cloudwatch: Any, s3: Any, bucket: str, marker_key: str, data: Iterable[Mapping[str, Any]]
) -> dict[str, int]:
    """put_metric_data for datapoints not sent before (per the marker object), then update the marker."""
    sent = set((read_json(s3, bucket, marker_key) or {}).get("sent", []))
    fresh = [d for d in data if datum_key(d) not in sent]
    for start in range(0, len(fresh), MAX_DATUMS_PER_CALL):
        cloudwatch.put_metric_data(Namespace=NAMESPACE, MetricData=fresh[start : start + MAX_DATUMS_PER_CALL])
        sent.update(datum_key(d) for d in fresh[start : start + MAX_DATUMS_PER_CALL])
        put_object(s3, bucket, marker_key, json.dumps({"sent": sorted(sent)}), "application/json")
    return {"sent": len(fresh), "already_sent": len(sent) - len(fresh)}


def dashboard_body(stack: str, region: str, metric_names: Iterable[str], existing: Mapping[str, Any] | None) -> dict:
    """One graph per metric name, across every run of the stack (a SEARCH expression), merged with the
    widgets the dashboard already has so that runs with other objectives keep theirs."""
    widgets = list((existing or {}).get("widgets", []))
    have = {w.get("properties", {}).get("title") for w in widgets}
    for name in metric_names:
        title = f"pcflow {metric_name(name)}"
        if title in have:
            continue
        search = (
            f'SEARCH(\'{{{NAMESPACE},stack,dag,run,trial}} MetricName="{metric_name(name)}" stack="{stack}"\', '
            "'Average', 300)"
        )
        index = len(widgets)
        widgets.append(
            {
                "type": "metric",
                "x": (index % 2) * 12,
                "y": (index // 2) * 6,
                "width": 12,
                "height": 6,
                "properties": {
                    "title": title,
                    "region": region,
                    "view": "timeSeries",
                    "stat": "Average",
                    "period": 300,
                    "metrics": [[{"expression": search, "id": f"e{index}", "label": ""}]],
                },
            }
        )
        have.add(title)
    if f"pcflow {RUN_COST_METRIC} per day" not in have:
        widgets.append(spend_widget(stack, region, len(widgets)))
    return {"widgets": widgets}


def publish_dashboard(cloudwatch: Any, stack: str, region: str, metric_names: Iterable[str]) -> str:
    """Create or merge the stack's dashboard, written only when it changed; returns its name."""
    name = dashboard_name(stack)
    try:
        existing = json.loads(cloudwatch.get_dashboard(DashboardName=name)["DashboardBody"])
    except Exception as exc:
        if error_code(exc) not in ("ResourceNotFound", "ResourceNotFoundException"):
            raise
        existing = None
    body = dashboard_body(stack, region, metric_names, existing)
    if body != existing:
        cloudwatch.put_dashboard(DashboardName=name, DashboardBody=json.dumps(body))
    return name


def dashboard_url(region: str, name: str) -> str:
    """The dashboard in the AWS console."""
    return f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#dashboards/dashboard/{name}"


def s3_console_url(bucket: str, key: str, region: str) -> str:
    """A prefix in the S3 console (the run's model, for the task's summary)."""
    return f"https://s3.console.aws.amazon.com/s3/object/{bucket}?region={region}&prefix={key}"
