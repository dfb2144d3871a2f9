"""The early-stopping rule, pure: a trial's objective values in, a decision out.

No I/O and no Slurm: the wait that watches a running trial (`pcflow.slurm.trigger`) reads the metrics
and writes the stop record; this module only decides, and names the record and what it holds, so both
the trigger (the Slurm stage) and the early-stopping operator and the harvest (the metrics stage) import
it, and the Slurm stage imports no metrics module. The budget's stop record is named here too.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pcflow.readings.jsonlines import read_metric_lines
from pcflow.readings.series import Objective, group

#: Written into a trial's run directory by the early-stopping check when it cancels the trial (`stop_record`
#: is what it holds); the harvest reads it back to tell a trial stopped early from one that failed.
EARLY_STOP_FILE = "early_stop.json"
#: The other stop record: what the train task's wait writes into the run directory before it cancels the job
#: at its budget (pcflow.budget's meter decides; `usd`-valued fields). The batch wrapper reads it on SIGTERM
#: (a decision, not a failure), and so does the harvest, which needs no budget module to know its name.
BUDGET_FILE = "budget_exhausted.json"
#: How much of a running trial's metrics the rule reads: the latest evaluations, whatever the job wrote.
METRICS_TAIL_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Decision:
    """The rule's answer: whether to stop, why (`diverged`, `no_improvement`), after how many evaluations, and
    the best and last values, for the stop record and the task log."""

    stop: bool
    reason: str = ""  # "diverged" | "no_improvement" | ""
    evaluations: int = 0
    best: float | None = None
    last: float | None = None


def decide(values: Sequence[float], objective: Objective, *, patience: int, min_delta: float = 0.0) -> Decision:
    """Stop when the last value is NaN/inf, or when none of the last `patience` evaluations beat the
    best before them by more than `min_delta`."""
    if patience < 1:
        raise ValueError("patience must be at least 1 evaluation")
    if not values:
        return Decision(False)
    last = values[-1]
    if not math.isfinite(last):
        return Decision(True, "diverged", len(values), None, last)
    finite = [v for v in values if math.isfinite(v)]
    best_at, best = 0, finite[0]
    for i, v in enumerate(finite):
        if i and (v - best if objective.mode == "max" else best - v) > min_delta:
            best_at, best = i, v
    stale = len(finite) - 1 - best_at
    return Decision(stale >= patience, "no_improvement" if stale >= patience else "", len(values), best, last)


def decide_from_lines(data: bytes, rule: dict[str, Any]) -> Decision:
    """The rule (`{"objective", "patience", "min_delta"}`) applied to metrics lines (JSON lines)."""
    objective = Objective.parse(rule["objective"])
    series = group(read_metric_lines(data).points).get(objective.name)
    values = [p.value for p in series.points] if series else []
    return decide(values, objective, patience=int(rule["patience"]), min_delta=float(rule.get("min_delta") or 0.0))


def stop_record(*, job_id: str, trial_dir: str, rule: dict[str, Any], decision: Decision) -> bytes:
    """What `early_stop.json` holds. json.dumps' default spacing: the batch wrapper greps for
    `"job_id": "<its id>"` on SIGTERM and marks the trial stopped early instead of failed."""
    record = {
        "job_id": job_id,
        "run_dir": trial_dir,
        "decision": asdict(decision),
        "objective": Objective.parse(rule["objective"]).as_dict(),
        "time": time.time(),
    }
    return json.dumps(record, default=str).encode()
