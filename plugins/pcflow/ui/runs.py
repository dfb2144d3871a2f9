"""The runs of pcflow's training DAGs as the page shows them: each run's outcome, objective, cost and
duration, read from Airflow's metadata (the DAG run, and the XCom the `metrics` task returned), never
from the job itself. Every read is bounded: DAGs, runs per DAG, leaderboard rows."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pcflow.metrics.publish import run_prefix
from pcflow.naming import run_key

#: DAGs that train carry this tag (dags/pretrain*.py); their `metrics` task returns the run's summary.
TRAINING_TAG = "training"
METRICS_TASK = "metrics"
MAX_DAGS = 20
RUNS_PER_DAG = 20
MAX_SWEEPS = 3
MAX_LEADERBOARD_ROWS = 10


@dataclass
class RunRow:
    """One DAG run and what its metrics task said about it (None while it has said nothing)."""

    dag_id: str
    run_id: str
    state: str
    start: dt.datetime | None
    end: dt.datetime | None
    summary: Mapping[str, Any] | None = field(default=None, repr=False)

    @property
    def duration_s(self) -> float | None:
        return (self.end - self.start).total_seconds() if self.start and self.end else None

    @property
    def trials(self) -> list[Mapping[str, Any]]:
        """A sweep's ranked rows, or a multi-trial harvest's summaries; [] for a single job."""
        summary = self.summary or {}
        return list(summary.get("leaderboard") or summary.get("trials") or [])

    @property
    def outcome(self) -> str:
        """The harvest's outcome (completed, failed, stopped_early, budget_exhausted, ...); a sweep's
        trials counted by outcome; the run's own state when no harvest was made."""
        if self.summary is None:
            return self.state
        if self.trials:
            counts = Counter(str(t.get("outcome")) for t in self.trials)
            return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
        return str(self.summary.get("outcome") or self.state)

    @property
    def objective(self) -> tuple[str | None, float | None]:
        """(name, value): the best value of the run's objective (a sweep: its best trial's)."""
        summary = self.summary or {}
        objective = summary.get("objective") or {}
        if self.trials:
            values = [t["value"] for t in self.trials if isinstance(t.get("value"), int | float)]
            best = (summary.get("best") or {}).get("value")
            if best is None and values:
                best = max(values) if objective.get("mode") == "max" else min(values)
            return objective.get("name"), best
        return objective.get("name"), objective.get("value")

    @property
    def cost_usd(self) -> float | None:
        """The run's cost estimate; a sweep's counts the shared head node and FSx once (metrics task)."""
        summary = self.summary or {}
        if summary.get("cost_usd_estimate") is not None:
            return summary["cost_usd_estimate"]
        costs = [t.get("cost_usd_estimate") for t in self.trials]
        return round(sum(costs), 4) if costs and None not in costs else None

    @property
    def started_from(self) -> str | None:
        """The run key of the model the run started from (its summary's `warm_start`, pcflow.warmstart), or
        None: trained from scratch, or nothing harvested yet."""
        warm = (self.summary or {}).get("warm_start")
        return warm.get("run") if isinstance(warm, Mapping) else None

    @property
    def has_report(self) -> bool:
        return report_location(self.dag_id, self.run_id, self.summary) is not None


def report_location(
    dag_id: str, run_id: str, summary: Mapping[str, Any] | None, trial: int | None = None
) -> tuple[str, str] | None:
    """(bucket, key) of the run's report (a sweep: its leaderboard page, or one trial's report), taken
    from the metrics task's XCom and accepted only under this run's own prefix in S3."""
    summary = summary or {}
    url = summary.get("report") or summary.get("leaderboard_html")
    if url is None and summary.get("trials"):
        url = summary["trials"][0].get("report")
    if not isinstance(url, str):
        return None
    parts = urlsplit(url)
    own = run_prefix(run_key(dag_id, run_id))
    key = parts.path.lstrip("/")
    if trial is not None:
        key = f"{run_prefix(f'{run_key(dag_id, run_id)}/trials/{int(trial)}')}report.html"
    if parts.scheme != "s3" or not parts.netloc or not key.startswith(own) or ".." in key.split("/"):
        return None
    return parts.netloc, key


def dag_run_state(session: Any) -> Callable[[str, str], str | None]:
    """A DAG run's state from the metadata database (the API server has one; a task asks the execution
    API instead), None when there is no such run: how the page's "would delete" judges a run's resources
    as the janitor does (pcflow.aws.janitor)."""
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    def state(dag_id: str, run_id: str) -> str | None:
        query = select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
        found = session.scalar(query)
        return None if found is None else str(getattr(found, "value", found))

    return state


def training_dag_ids(session: Any, permitted: Collection[str]) -> list[str]:
    """The training DAGs (tagged `training`) the user may read, by name."""
    from airflow.models.dag import DagTag
    from sqlalchemy import select

    query = select(DagTag.dag_id).where(DagTag.name == TRAINING_TAG).order_by(DagTag.dag_id).limit(MAX_DAGS * 5)
    return [dag_id for dag_id in session.scalars(query) if dag_id in permitted][:MAX_DAGS]


def recent_runs(session: Any, dag_id: str, limit: int = RUNS_PER_DAG, *, with_summaries: bool = True) -> list[RunRow]:
    """The DAG's last `limit` runs, newest first, each with its metrics task's returned summary (none
    read when `with_summaries` is false: the user may not read the DAG's XComs)."""
    return _runs(session, dag_id, limit=limit, with_summaries=with_summaries)


def one_run(session: Any, dag_id: str, run_id: str) -> RunRow | None:
    """One run of the DAG with its summary, None when there is no such run."""
    found = _runs(session, dag_id, limit=1, run_id=run_id)
    return found[0] if found else None


def _runs(
    session: Any, dag_id: str, *, limit: int, run_id: str | None = None, with_summaries: bool = True
) -> list[RunRow]:
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    query = select(DagRun.run_id, DagRun.state, DagRun.start_date, DagRun.end_date).where(DagRun.dag_id == dag_id)
    if run_id is not None:
        query = query.where(DagRun.run_id == run_id)
    runs = session.execute(query.order_by(DagRun.run_after.desc()).limit(limit)).all()
    if not runs or not with_summaries:
        return [RunRow(dag_id, r.run_id, str(r.state), r.start_date, r.end_date, None) for r in runs]
    xcoms = session.execute(
        select(XComModel.run_id, XComModel.value).where(
            XComModel.dag_id == dag_id,
            XComModel.task_id == METRICS_TASK,
            XComModel.key == "return_value",
            XComModel.map_index == -1,
            XComModel.run_id.in_([r.run_id for r in runs]),
        )
    ).all()
    summaries = {x.run_id: XComModel.deserialize_value(x) for x in xcoms}
    return [
        RunRow(dag_id, r.run_id, str(r.state), r.start_date, r.end_date, _mapping(summaries.get(r.run_id)))
        for r in runs
    ]


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def trend(rows: Sequence[RunRow]) -> dict[str, list[tuple[float, float]]]:
    """Objective and cost over the runs (oldest first, x = the run's place), for the per-DAG charts."""
    ordered = [r for r in reversed(rows) if r.summary is not None]
    objective = [(i, r.objective[1]) for i, r in enumerate(ordered, 1) if isinstance(r.objective[1], int | float)]
    cost = [(i, r.cost_usd) for i, r in enumerate(ordered, 1) if isinstance(r.cost_usd, int | float)]
    return {"objective": objective, "cost": cost}


def leaderboards(rows: Sequence[RunRow]) -> list[dict[str, Any]]:
    """The last sweeps' ranked trials (best first), as the sweep's metrics task returned them."""
    boards = []
    for row in rows:
        ranked = (row.summary or {}).get("leaderboard")
        if ranked:
            boards.append(
                {"run": row, "objective": row.summary.get("objective") or {}, "rows": ranked[:MAX_LEADERBOARD_ROWS]}
            )
        if len(boards) == MAX_SWEEPS:
            break
    return boards
