"""The train task's cost meter (pcflow.budget.CostMeter): the cost so far from Slurm's answers and the
clock, requeued attempts paid for, extrapolated between answers so the budget's moment is met within a
poll, Slurm asked again before a waiting job could reach it, a line at a steady cadence; and the watch
reads the wrapper's budget marker as `budget_exhausted`, a decision like early stopping, not a failure.
Offline, well under a second."""

from __future__ import annotations

import pytest

from pcflow.budget import CostMeter
from pcflow.jobstates import JobInfo, JobState
from pcflow.slurm.watch import JobWatch, Outcome

COST = {"compute_per_node_hour": 3.6, "infrastructure_per_hour": 0.36, "nodes": 2, "budget_usd": 1.0}
T0 = 1_800_000_000.0  # the run's start, epoch seconds


def job(state: JobState, elapsed: int, restarts: int = 0, job_id: str = "42") -> JobInfo:
    return JobInfo(job_id=job_id, state=state, raw_state=str(state), elapsed_s=elapsed, restarts=restarts)


def test_cost_so_far_counts_every_attempt_and_runs_on_between_answers():
    meter = CostMeter(COST, T0)
    meter.observe([job(JobState.RUNNING, 100)], T0 + 200)
    # nodes: 2 x 100 s at $3.60/h = $0.20; head node and FSx: 200 s at $0.36/h = $0.02
    assert meter.so_far(T0 + 200) == pytest.approx(0.22)
    assert meter.so_far(T0 + 300) == pytest.approx(0.22 + 2 * 100 * 0.001 + 100 * 0.0001)  # extrapolated
    meter.observe([job(JobState.PENDING, 0, restarts=1)], T0 + 400)  # requeued: the first attempt was paid
    assert meter.node_seconds(T0 + 500) == 200
    meter.observe([job(JobState.RUNNING, 50, restarts=1)], T0 + 500)
    assert meter.node_seconds(T0 + 510) == 200 + 2 * 60


def test_the_budget_is_met_within_a_poll_and_slurm_is_asked_before_it_could_be():
    meter = CostMeter(COST, T0)
    assert meter.ask_within(T0 + 100) == 0  # Slurm never asked: the job may have run since its submission
    meter.observe([job(JobState.PENDING, 0)], T0 + 100)
    # Pending: ask Slurm before the job, starting now, could spend the rest ($0.99 at $7.56/h).
    assert meter.ask_within(T0 + 100) == pytest.approx((1.0 - 0.01) / (7.56 / 3600))
    meter.observe([job(JobState.RUNNING, 0)], T0 + 100)
    assert meter.ask_within(T0 + 100) is None  # running: its extrapolation tells the moment alone
    moment = T0 + 100 + (1.0 - 0.01) / (7.56 / 3600)  # $1.00 reached
    assert not meter.exhausted(moment - 1) and meter.exhausted(moment + 0.001)
    assert meter.record("42", moment)["cost_usd"] == pytest.approx(1.0)


def test_a_line_at_a_steady_cadence():
    meter = CostMeter(COST, T0, report_every_s=60)
    meter.observe([job(JobState.RUNNING, 100)], T0 + 200)
    line = meter.report(T0 + 200)
    assert line.startswith("Cost so far: $0.22 of the $1.00 budget (22%): 0.056 node-hours at $3.60/h")
    assert meter.report(T0 + 230) is None and meter.report(T0 + 260) is not None


def test_an_arrays_elements_each_count():
    meter = CostMeter(COST, T0, jobs=3)
    meter.observe([job(JobState.RUNNING, 10, job_id="7_0"), job(JobState.COMPLETED, 30, job_id="7_1")], T0 + 60)
    assert meter.node_seconds(T0 + 60) == 2 * 10 + 2 * 30
    meter.observe([job(JobState.COMPLETED, 30, job_id="7_1")], T0 + 70)  # an ended element counts once
    assert meter.node_seconds(T0 + 60) == 80


def test_the_budget_marker_reads_as_budget_exhausted_not_a_failure():
    marker = {"job_id": "42", "exit_code": 143, "restart": 0, "signal": "budget_exhausted"}
    verdict = JobWatch("42").assess(job(JobState.CANCELLED, 10), marker, 0)
    assert verdict.outcome is Outcome.BUDGET_EXHAUSTED and verdict.outcome.ok
    assert "reached its budget" in verdict.message
    assert JobWatch("42").assess(None, marker, 0).outcome is Outcome.BUDGET_EXHAUSTED  # slurmctld forgot it
