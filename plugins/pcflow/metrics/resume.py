"""Work lost to requeues, read from the metrics lines a job wrote.

When Slurm requeues a job (a lost node, a reclaimed spot instance), the next attempt resumes from its newest
checkpoint, and whatever the earlier attempt trained after that checkpoint is done again. The payload
contract (include/payloads/README.md) asks a program that starts an attempt from a checkpoint, or any
attempt after a requeue, to write one `resumed_from` line: its `step` (and `value`) the step it resumes
from, its `epoch` the epochs done (0 and 0: from scratch). The step an attempt reached is the highest step
among the lines it wrote (the attempt's lines lie between two `resumed_from` lines), so the steps lost are
that minus the next attempt's `resumed_from`: a lower bound, as a program logs every few steps only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pcflow.metrics.series import Point

#: The metric a program writes when an attempt resumes (the payload contract).
RESUMED_FROM = "resumed_from"


def resume_record(points: Iterable[Point], restarts: int | None) -> dict[str, Any]:
    """`{restarts, resumed_from: {step, epoch}, reached_step, steps_lost, attempts: [...]}` from the metrics
    file's points in file order: restarts as Slurm counted them, and per resumed attempt the step the one
    before reached, the step and epoch it resumed from and the steps lost (reached minus resumed from,
    never below 0). The totals add up every resumed attempt; `resumed_from` is the last one."""
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
                }
            )
            reached = step
        elif point.step is not None and point.split != "eval":
            reached = max(reached, int(point.step)) if reached is not None else int(point.step)
    last = attempts[-1] if attempts else None
    return {
        "restarts": int(restarts or 0),
        "resumed_from": {"step": last["resumed_from_step"], "epoch": last["resumed_from_epoch"]} if last else None,
        "reached_step": last["reached_step"] if last else None,
        "steps_lost": sum(a["steps_lost"] for a in attempts),
        "attempts": attempts,
    }
