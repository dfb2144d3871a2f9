"""Work lost to requeues, read from the metrics lines a job wrote.

When Slurm requeues a job (a lost node, a reclaimed spot instance), the next attempt resumes from its newest
checkpoint, and whatever the earlier attempt trained after that checkpoint is done again. The payload
contract (include/payloads/README.md) asks a program that starts an attempt from a checkpoint, or any
attempt after a requeue, to write one `resumed_from` line: its `step` (and `value`) the step it resumes
from, its `epoch` the epochs done (0 and 0: from scratch). The step an attempt reached is the highest step
among the lines it wrote (the attempt's lines lie between two `resumed_from` lines), so the steps lost are
that minus the next attempt's `resumed_from`: a lower bound, as a program logs every few steps only.

The recovery time of a requeue is from the moment Slurm ended the lost attempt (its accounting record's End:
the node lost, the instance reclaimed) to the first training step the next attempt logged after resuming
(that line's `time`): the queue, the new nodes' start, the job's start-up and the checkpoint's load. Slurm's
times are read as UTC, as elsewhere in pcflow (ParallelCluster's and the local stack's clocks).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from pcflow.readings.series import Point

#: The metric a program writes when an attempt resumes (the payload contract).
RESUMED_FROM = "resumed_from"


def resume_record(
    points: Iterable[Point], restarts: int | None, history: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """`{restarts, resumed_from: {step, epoch}, reached_step, steps_lost, recovery_s, attempts: [...]}` from the
    metrics file's points in file order and Slurm's attempts (`history`: JobUsage.history, oldest first):
    restarts as Slurm counted them, and per resumed attempt the step the one before reached, the step and
    epoch it resumed from, the steps lost (reached minus resumed from, never below 0) and its recovery time
    (None when Slurm's record or a timed step is missing). The totals add up every resumed attempt;
    `resumed_from` is the last one."""
    attempts = _resumed_attempts(points)
    _time_recoveries(attempts, history)
    for attempt in attempts:
        attempt.pop("first_step_time")
    last = attempts[-1] if attempts else None
    recoveries = [a["recovery_s"] for a in attempts if a["recovery_s"] is not None]
    return {
        "restarts": int(restarts or 0),
        "resumed_from": {"step": last["resumed_from_step"], "epoch": last["resumed_from_epoch"]} if last else None,
        "reached_step": last["reached_step"] if last else None,
        "steps_lost": sum(a["steps_lost"] for a in attempts),
        "recovery_s": round(sum(recoveries), 1) if recoveries else None,
        "attempts": attempts,
    }


def _resumed_attempts(points: Iterable[Point]) -> list[dict[str, Any]]:
    """One entry per `resumed_from` line: what the attempt before reached, what was lost, and the time of the
    first training step logged after it."""
    attempts: list[dict[str, Any]] = []
    reached: int | None = None
    for point in points:
        if point.name == RESUMED_FROM and point.step is not None:
            step = int(point.step)
            lost = max(0, (reached if reached is not None else step) - step)
            attempts.append(
                {
                    "reached_step": reached,
                    "resumed_from_step": step,
                    "resumed_from_epoch": point.epoch,
                    "steps_lost": lost,
                    "recovery_s": None,
                    "first_step_time": None,
                }
            )
            reached = step
        elif point.step is not None and point.split != "eval":
            reached = max(reached, int(point.step)) if reached is not None else int(point.step)
            if attempts and attempts[-1]["first_step_time"] is None and not point.name.startswith(RESUMED_FROM):
                attempts[-1]["first_step_time"] = point.time
    return attempts


def _time_recoveries(attempts: list[dict[str, Any]], history: Sequence[dict[str, Any]]) -> None:
    """Each resumed attempt's recovery time: every Slurm attempt but the last ended in a requeue, and the
    newest requeues belong to the newest resumes (a first attempt may resume from an earlier job's checkpoint:
    a task retry, no requeue of this job)."""
    requeued = [_epoch(h.get("end") or "") for h in history[:-1]]
    paired = min(len(attempts), len(requeued))
    for attempt, ended in zip(attempts[len(attempts) - paired :], requeued[len(requeued) - paired :], strict=True):
        first = attempt["first_step_time"]
        if ended is not None and first is not None:
            attempt["recovery_s"] = round(float(first) - ended, 1)


def _epoch(text: str) -> float | None:
    """A Slurm timestamp (`2026-12-04T16:20:01`, UTC) as epoch seconds; None when absent or unreadable."""
    try:
        return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        return None
