"""Read everything a job left in its run directory, over SSH, into one JSON document.

Sources, each optional: the job's JSON-lines metrics, VISSL's metrics.json, regex definitions over the
log, Slurm's accounting (sacct, or scontrol without accounting), the sampler's utilisation lines. What
could not be read is listed under `missing` with the reason; only a metric the caller declared
required makes the harvest fail. The job wrote every one of these files, so each is read up to a
limit: the tail of the line files (the latest points; `skipped_bytes` says how much came before),
small JSON files only when small.
"""

from __future__ import annotations

import datetime as dt
import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pcflow.errors import PcflowInputError
from pcflow.jobstates import SACCT_USAGE_FIELDS, JobState, JobUsage, parse_sacct_usage, parse_scontrol_usage
from pcflow.metric_definitions import MetricDefinition
from pcflow.metrics.definitions import scan_log
from pcflow.metrics.resume import resume_record
from pcflow.readings.jsonlines import from_line_start, read_metric_lines
from pcflow.readings.series import Objective, Point, group
from pcflow.readings.stopping import BUDGET_FILE, EARLY_STOP_FILE
from pcflow.readings.utilisation import read_samples

VISSL_FILES = ("checkpoints/metrics.json", "metrics.json")
MAX_LOG_BYTES = 32 * 1024 * 1024
MAX_METRICS_BYTES = 32 * 1024 * 1024
MAX_UTILISATION_BYTES = 16 * 1024 * 1024


class RequiredMetricMissing(PcflowInputError):
    """A metric the caller declared required is absent: the run's result cannot be judged, and harvesting
    the same output again would not change that (not retried)."""


@dataclass(frozen=True)
class JobRef:
    """One job (or one trial of an array) as SlurmJobOperator/SlurmArrayJobOperator report it."""

    job_id: str
    run_dir: str
    log: str
    metrics_file: str
    state: str | None = None
    exit_code: int | None = None
    elapsed_s: int | None = None
    trial: int | None = None
    outcome: str | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0  # Slurm's requeues of the job, as the train task saw them

    @property
    def run_root(self) -> str:
        """The run's directory: a trial's parent (an array's root), else the job's own."""
        return posixpath.dirname(self.run_dir) if self.trial is not None else self.run_dir

    @property
    def slurm_id(self) -> str:
        """An array element is `<array id>_<index>` in sacct and scontrol."""
        return f"{self.job_id}_{self.trial}" if self.trial is not None and "_" not in self.job_id else self.job_id


def load_job(job: Mapping[str, Any] | str) -> dict[str, Any]:
    """The job XCom as a dict; a JSON string (a template rendered without native objects) is decoded."""
    if isinstance(job, str):
        try:
            job = json.loads(job)
        except json.JSONDecodeError as exc:
            raise ValueError(f"job must be the train task's XCom (a dict or its JSON), got {job[:80]!r}") from exc
    if not isinstance(job, Mapping) or "run_dir" not in job:
        raise ValueError(
            f"job must be the XCom of SlurmJobOperator or SlurmArrayJobOperator (with run_dir), got {str(job)[:120]!r}"
        )
    return dict(job)


def job_refs(job: Mapping[str, Any] | str) -> list[JobRef]:
    """One JobRef for a single job; one per trial for an array job."""
    job = load_job(job)
    if "trials" in job:
        return [
            JobRef(
                job_id=str(job["job_id"]),
                run_dir=t["run_dir"],
                log=t.get("log") or posixpath.join(t["run_dir"], "job.log"),
                metrics_file=t.get("metrics_file") or posixpath.join(t["run_dir"], "metrics.jsonl"),
                exit_code=t.get("exit_code"),
                trial=int(t["index"]),
                outcome=t.get("outcome"),
                hyperparameters=dict(t.get("hyperparameters") or {}),
            )
            for t in job["trials"]
        ]
    run_dir = job["run_dir"]
    return [
        JobRef(
            job_id=str(job.get("job_id") or ""),
            run_dir=run_dir,
            log=job.get("log") or posixpath.join(run_dir, "job.log"),
            metrics_file=job.get("metrics_file") or posixpath.join(run_dir, "metrics.jsonl"),
            state=job.get("state"),
            exit_code=job.get("exit_code"),
            elapsed_s=job.get("elapsed_s"),
            restarts=int(job.get("restarts") or 0),
        )
    ]


def job_usage(hook: Any, slurm_id: str) -> JobUsage | None:
    """sacct (all attempts, steps for MaxRSS) with accounting; scontrol (while slurmctld remembers) otherwise."""
    if not slurm_id:
        return None
    if hook.accounting_enabled:
        out = hook.run(["sacct", "-n", "-P", "-D", "-j", slurm_id, "-o", ",".join(SACCT_USAGE_FIELDS)], check=False)
        usage = parse_sacct_usage(out.stdout, slurm_id)
        if usage is not None:
            return usage
    return parse_scontrol_usage(hook.run(["scontrol", "show", "job", "-o", slurm_id], check=False).stdout)


@dataclass(frozen=True)
class Tail:
    """The last bytes of a file the job wrote, from the start of a line."""

    data: bytes
    skipped_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        """`skipped_bytes` for the harvest document when a tail was cut (nothing otherwise), so a reader knows
        points came before."""
        return {"skipped_bytes": self.skipped_bytes} if self.skipped_bytes else {}


def read_tail(hook: Any, path: str, max_bytes: int) -> Tail | None:
    """At most the last `max_bytes` of a file, whole lines only; None when it does not exist."""
    size = hook.file_size(path)
    if size is None:
        return None
    offset = max(0, size - max_bytes)
    raw = hook.read_file(path, offset, max_bytes)
    data = from_line_start(raw, offset)
    return Tail(data, offset + len(raw) - len(data))


def read_points(
    hook: Any, ref: JobRef, definitions: Sequence[MetricDefinition]
) -> tuple[list[Point], dict[str, Any], list[dict[str, str]]]:
    """Points from the JSON-lines file (first, in file order), VISSL's metrics.json and the log's regexes;
    what each gave."""
    missing: list[dict[str, str]] = []
    sources: dict[str, Any] = {}
    points: list[Point] = []

    tail = read_tail(hook, ref.metrics_file, MAX_METRICS_BYTES)
    if tail is None:
        missing.append({"what": "metrics file", "path": ref.metrics_file, "why": "does not exist"})
    else:
        read = read_metric_lines(tail.data)
        points += read.points
        sources["metrics_file"] = {"path": ref.metrics_file, **read.as_dict(), **tail.as_dict()}
    for name in VISSL_FILES:
        path = posixpath.join(ref.run_dir, name)
        tail = read_tail(hook, path, MAX_METRICS_BYTES)
        if tail is not None:
            read = read_metric_lines(tail.data)
            points += read.points
            sources["vissl"] = {"path": path, **read.as_dict(), **tail.as_dict()}
            break
    if definitions:
        log = read_tail(hook, ref.log, MAX_LOG_BYTES)
        if log is None:
            missing.append({"what": "job log", "path": ref.log, "why": "does not exist"})
        else:
            found, unmatched = scan_log(log.data, definitions)
            points += found
            sources["log"] = {"path": ref.log, "points": len(found), "unmatched": unmatched, **log.as_dict()}
            missing += [{"what": f"metric {n}", "path": ref.log, "why": "regex matched nothing"} for n in unmatched]

    return points, sources, missing


def harvest_job(
    hook: Any,
    ref: JobRef,
    *,
    definitions: Sequence[MetricDefinition] = (),
    objective: Objective | None = None,
    required: Sequence[str] = (),
) -> dict[str, Any]:
    """Everything one job left behind, as the document written to S3 as metrics.json."""
    points, sources, missing = read_points(hook, ref, definitions)
    from_file = points[: (sources.get("metrics_file") or {}).get("points", 0)]
    series = group(points)
    modes = {objective.name: objective.mode} if objective else {}
    metrics = {name: s.summary(modes.get(name)) for name, s in series.items()}
    _require_metrics(series, required, ref)
    obj = None
    if objective is not None:
        obj = {**objective.as_dict(), **_objective_values(metrics.get(objective.name))}
        if objective.name not in series:
            missing.append({"what": f"objective {objective.name}", "path": ref.run_dir, "why": "never reported"})

    usage = job_usage(hook, ref.slurm_id)
    if usage is None:
        missing.append({"what": "accounting", "path": ref.slurm_id, "why": "Slurm no longer knows the job"})
    samples_tail = read_tail(hook, posixpath.join(ref.run_dir, "utilisation.jsonl"), MAX_UTILISATION_BYTES)
    samples = read_samples(samples_tail.data if samples_tail else b"")
    if not samples.samples:
        missing.append({"what": "utilisation samples", "path": ref.run_dir, "why": "no sample was written"})
    early_stop = hook.read_json(posixpath.join(ref.run_dir, EARLY_STOP_FILE))
    budget = hook.read_json(posixpath.join(ref.run_root, BUDGET_FILE))
    if budget and str(budget.get("job_id")) != ref.job_id.split("_")[0]:
        budget = None  # another (earlier) job of the run

    return {
        "job": {
            "job_id": ref.job_id,
            "slurm_id": ref.slurm_id,
            "run_dir": ref.run_dir,
            "trial": ref.trial,
            "hyperparameters": ref.hyperparameters,
        },
        "outcome": _outcome(ref, usage, early_stop, budget),
        "early_stop": early_stop,
        "budget_exhausted": budget,
        "resume": resume_record(from_file, ref.restarts, usage.history if usage else ()),
        "accounting": usage.as_dict() if usage else None,
        "elapsed_s": usage.elapsed_s if usage and usage.elapsed_s is not None else ref.elapsed_s,
        "objective": obj,
        "metrics": metrics,
        "series": {name: [[p.step, p.epoch, p.time, p.value] for p in s.points] for name, s in series.items()},
        "utilisation": samples.summary(),
        "utilisation_timeline": {k: [list(p) for p in v] for k, v in samples.timeline().items()},
        "sources": sources,
        "missing": missing,
        "harvested_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _require_metrics(series: Mapping[str, Any], required: Sequence[str], ref: JobRef) -> None:
    """A metric the run declared required but that has no finite value fails the harvest: a job that ended
    COMPLETED without it did not produce what the run is judged by."""
    for name in required:
        if name not in series or not series[name].finite_points():
            raise RequiredMetricMissing(
                f"required metric {name!r} has no finite value in {ref.run_dir} (metrics found: "
                f"{', '.join(sorted(series)) or 'none'}); see the job log {ref.log}"
            )


def _objective_values(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    if not summary or "final" not in summary:
        return {"value": None, "final": None}
    return {
        "value": summary.get("best"),
        "final": summary.get("final"),
        "best_step": summary.get("best_step"),
        "best_epoch": summary.get("best_epoch"),
        "diverged": bool(summary.get("diverged")),
    }


def _outcome(ref: JobRef, usage: JobUsage | None, early_stop: dict | None, budget: dict | None) -> str:
    """`stopped_early` or `budget_exhausted` (decisions, not failures), else Slurm's state, else what the
    operator said. A job that completed before the budget's cancel reached it completed."""
    if early_stop:
        return "stopped_early"
    if budget and not (usage is not None and usage.state is JobState.COMPLETED):
        return "budget_exhausted"
    if usage is not None:
        return str(usage.state).lower()
    return (ref.state or ref.outcome or "unknown").lower()


def xcom_summary(document: Mapping[str, Any], *, report_url: str | None = None) -> dict[str, Any]:
    """The small XCom: final and best of each metric, the objective, cost, elapsed, what is missing."""
    metrics = {
        name: {k: s[k] for k in ("final", "best") if k in s} for name, s in document["metrics"].items() if "final" in s
    }
    cost = document.get("cost") or {}
    util = document.get("utilisation") or {}
    return {
        "run_key": document.get("run_key"),
        "job_id": document["job"]["job_id"],
        "trial": document["job"]["trial"],
        "outcome": document["outcome"],
        "elapsed_s": document.get("elapsed_s"),
        "objective": document.get("objective"),
        "metrics": metrics,
        "gpu_util_percent_mean": util.get("gpu_util_percent_mean"),
        "cost_usd_estimate": cost.get("total_usd"),
        "missing": [m["what"] for m in document["missing"]],
        "resume": {k: v for k, v in (document.get("resume") or {}).items() if k != "attempts"} or None,
        **({"report": report_url} if report_url else {}),
    }
