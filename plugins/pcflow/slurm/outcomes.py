"""How a Slurm job ended, and what that means for the task: one table, END_STATES, read by the waiter
(watch.py, in the triggerer or the worker) and the operator (operators.py), so a state's meaning and its
message live in one place.

A row is keyed by Slurm's end state and who or what ended the job (`EndedBy`): the program itself (its
exit code), a signal, pcflow on purpose (early stopping, the budget: the wrapper's marker signal or the
run directory's budget_exhausted.json), a user or an administrator (`CANCELLED by <uid>` in sacct;
squeue and scontrol say only `CANCELLED`), or Slurm. It says the `Ending` (succeeded, stopped on purpose,
failed and worth a retry, failed for good), the stored `Outcome`, and the message: what happened and
what to do. tests/pcflow/slurm/test_end_states.py holds each row against a real sacct line.

A COMPLETED job succeeds whatever its steps' exit codes (sacct's DerivedExitCode, not asked): the batch
script's own code is the program's (the wrapper passes it on, so a failed program makes the job FAILED),
and the utilisation sampler's step always ends by a signal. What a program that exits 0 without its
outputs left is the declared-outputs check's to judge (`output_problems`, run by the train task).
"""

from __future__ import annotations

import re
import signal as signals
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from pcflow.errors import JobFailedForGood
from pcflow.jobstates import JobInfo, JobState


class Outcome(StrEnum):
    """How a wait ended. Its values are stored (the result's and the event's `outcome`): a rename breaks readers
    of old runs."""

    SUCCESS = "success"
    STOPPED_EARLY = "stopped_early"
    BUDGET_EXHAUSTED = "budget_exhausted"
    FAILED = "failed"
    PENDING_TIMEOUT = "pending_timeout"
    TOO_MANY_RESTARTS = "too_many_restarts"
    LOST = "lost"

    @property
    def ok(self) -> bool:
        """The task succeeds: the job completed, or pcflow ended it on purpose (early stopping, the budget)."""
        return self in (Outcome.SUCCESS, Outcome.STOPPED_EARLY, Outcome.BUDGET_EXHAUSTED)

    @property
    def needs_cancel(self) -> bool:
        """The job may still be queued or running: the waiter gave up, so Slurm must be told."""
        return self in (Outcome.PENDING_TIMEOUT, Outcome.TOO_MANY_RESTARTS)


class Ending(StrEnum):
    """What the task does with a job's end: succeed, succeed as stopped on purpose, fail and let Airflow
    retry (a retry resubmits, resuming from the newest checkpoint), or fail without retry (a retry would end
    the same way, or would undo a person's decision)."""

    SUCCEEDED = "succeeded"
    STOPPED_ON_PURPOSE = "stopped_on_purpose"
    FAILED_RETRYABLE = "failed_retryable"
    FAILED_FINAL = "failed_final"


class EndedBy(StrEnum):
    """Who or what ended the job, as far as Slurm's answer and the run directory tell."""

    PROGRAM = "program"  # its own exit code
    SIGNAL = "signal"  # a signal (sacct's `code:signal`, or the wrapper's 128+N)
    EARLY_STOP = "early_stop"  # pcflow's early-stopping check (early_stop.json)
    BUDGET = "budget"  # pcflow's budget cap (budget_exhausted.json)
    USER = "user"  # scancel by a uid other than root (sacct: `CANCELLED by <uid>`)
    ADMIN = "admin"  # scancel by root (`CANCELLED by 0`)
    UNSAID = "unsaid"  # CANCELLED from squeue or scontrol, which do not say by whom
    SLURM = "slurm"  # Slurm itself: the time limit, a node, preemption, the deadline


#: The wrapper's marker signal when the SIGTERM came from pcflow's early-stopping check (metrics.early_stop).
EARLY_STOP_SIGNAL = "early_stop"
#: ... and when it came from the train task's budget cap (pcflow.budget, budget_exhausted.json).
BUDGET_SIGNAL = "budget_exhausted"


@dataclass(frozen=True)
class EndRule:
    """One row of END_STATES: the task's ending, the stored outcome, what happened and what to do."""

    ending: Ending
    outcome: Outcome
    what: str  # after "Slurm job <id> "; may use {code}, {signal}, {uid}, {raw}
    todo: str = ""  # may use {job_id}

    @property
    def retryable(self) -> bool:
        """A failure Airflow may retry (a success or a stop is not retried either way)."""
        return self.ending is not Ending.FAILED_FINAL


_RETRY = "A retry of the task submits it again (a program that checkpoints resumes from its newest checkpoint)."
_NO_RETRY = "The task is not retried"

#: Every end state pcflow tells apart, keyed (Slurm's state, who ended it); `None` as the state: whatever
#: Slurm says (pcflow's own decisions, told by the marker or the budget record, outrank the state).
END_STATES: dict[tuple[JobState | None, EndedBy], EndRule] = {
    (JobState.COMPLETED, EndedBy.PROGRAM): EndRule(Ending.SUCCEEDED, Outcome.SUCCESS, "completed"),
    (None, EndedBy.EARLY_STOP): EndRule(
        Ending.STOPPED_ON_PURPOSE,
        Outcome.STOPPED_EARLY,
        "was stopped early by pcflow's early-stopping check (its objective stopped improving or diverged; the "
        "reason is in early_stop.json in its run directory)",
    ),
    (None, EndedBy.BUDGET): EndRule(
        Ending.STOPPED_ON_PURPOSE,
        Outcome.BUDGET_EXHAUSTED,
        "was cancelled by pcflow when the run's cost so far reached its budget (the figures are in "
        "budget_exhausted.json in its run directory)",
    ),
    (JobState.FAILED, EndedBy.PROGRAM): EndRule(
        Ending.FAILED_RETRYABLE,
        Outcome.FAILED,
        "failed{code}: the program ended with an error",
        f"Its log's last lines say why. {_RETRY}",
    ),
    (JobState.FAILED, EndedBy.SIGNAL): EndRule(
        Ending.FAILED_RETRYABLE,
        Outcome.FAILED,
        "failed{code}: the program was killed by {signal}",
        "SIGKILL is often the kernel's out-of-memory killer, SIGTERM a cancel or a time limit Slurm did not "
        f"record; its log's last lines may say more. {_RETRY}",
    ),
    (JobState.TIMEOUT, EndedBy.SLURM): EndRule(
        Ending.FAILED_RETRYABLE,
        Outcome.FAILED,
        "reached its time limit{code}",
        "Raise resources.time_limit or checkpoint more often (a retry resumes from the last checkpoint).",
    ),
    (JobState.OUT_OF_MEMORY, EndedBy.SLURM): EndRule(
        Ending.FAILED_FINAL,
        Outcome.FAILED,
        "ran out of memory{code}",
        f"Use a larger instance type, fewer tasks per node or a smaller batch size. {_NO_RETRY}: with the same "
        "resources it would run out again.",
    ),
    (JobState.NODE_FAIL, EndedBy.SLURM): EndRule(
        Ending.FAILED_RETRYABLE,
        Outcome.FAILED,
        "lost a node and Slurm did not requeue it (requeue disabled, or --no-requeue){code}",
        f"If nodes keep failing, look at `sinfo -R` and the compute fleet's health. {_RETRY}",
    ),
    (JobState.PREEMPTED, EndedBy.SLURM): EndRule(
        Ending.FAILED_RETRYABLE,
        Outcome.FAILED,
        "was preempted and Slurm did not requeue it{code}",
        f"Use a partition without preemption, or allow requeue. {_RETRY}",
    ),
    (JobState.BOOT_FAIL, EndedBy.SLURM): EndRule(
        Ending.FAILED_RETRYABLE,
        Outcome.FAILED,
        "could not start because its node failed to boot{code}",
        f"If it recurs, check the compute fleet (instance capacity, the image, the node's bootstrap log). {_RETRY}",
    ),
    (JobState.DEADLINE, EndedBy.SLURM): EndRule(
        Ending.FAILED_FINAL,
        Outcome.FAILED,
        "missed its --deadline: Slurm ended it because it could not finish by then{code}",
        f"Move or remove the deadline (resources.extra_sbatch). {_NO_RETRY}: it would miss the deadline again.",
    ),
    (JobState.CANCELLED, EndedBy.USER): EndRule(
        Ending.FAILED_FINAL,
        Outcome.FAILED,
        "was cancelled by the user with uid {uid} (scancel){code}",
        f"{_NO_RETRY}: a person stopped it; clear the task to run it again.",
    ),
    (JobState.CANCELLED, EndedBy.ADMIN): EndRule(
        Ending.FAILED_FINAL,
        Outcome.FAILED,
        "was cancelled by an administrator (uid 0, root){code}",
        f"Ask the cluster's administrators why. {_NO_RETRY}: clear the task to run it again.",
    ),
    (JobState.CANCELLED, EndedBy.UNSAID): EndRule(
        Ending.FAILED_FINAL,
        Outcome.FAILED,
        "was cancelled (scancel by a user, an administrator or pcflow's on_kill; Slurm did not say by whom){code}",
        f"`sacct -X -j {{job_id}} -o State` names the uid. {_NO_RETRY}: clear the task to run it again.",
    ),
}
#: What an end no row names (an unheard-of state, an active state with a non-zero exit code) reads as.
OTHER_END = EndRule(
    Ending.FAILED_RETRYABLE, Outcome.FAILED, "ended in state {raw}{code}", f"Its log's last lines say why. {_RETRY}"
)
#: A job pcflow ended on purpose, by the marker's signal: a decision, not a failure.
ENDED_ON_PURPOSE = {
    EARLY_STOP_SIGNAL: END_STATES[None, EndedBy.EARLY_STOP].outcome,
    BUDGET_SIGNAL: END_STATES[None, EndedBy.BUDGET].outcome,
}
_ON_PURPOSE_BY = {EARLY_STOP_SIGNAL: EndedBy.EARLY_STOP, BUDGET_SIGNAL: EndedBy.BUDGET}
#: The stored outcomes of pcflow's decisions (`stopped_early`, `budget_exhausted`).
STOPPED_ON_PURPOSE = frozenset(str(r.outcome) for r in END_STATES.values() if r.ending is Ending.STOPPED_ON_PURPOSE)


def canceller_uid(raw_state: str) -> str | None:
    """The uid in sacct's `CANCELLED by <uid>`; None where the state does not say (squeue, scontrol)."""
    match = re.search(r"\bby (\d+)", raw_state or "")
    return match.group(1) if match else None


def cancelled_by(raw_state: str) -> EndedBy:
    """sacct's `CANCELLED by <uid>` -> ADMIN (root) or USER; squeue's and scontrol's plain CANCELLED -> UNSAID."""
    uid = canceller_uid(raw_state)
    if uid is None:
        return EndedBy.UNSAID
    return EndedBy.ADMIN if uid == "0" else EndedBy.USER


def ended_by(
    state: JobState, raw_state: str, exit_code: int | None, signal: int | None, marker_signal: str = ""
) -> EndedBy:
    """Who or what ended a job in `state`: pcflow on purpose (the marker's signal) before anything Slurm says."""
    if marker_signal in _ON_PURPOSE_BY:
        return _ON_PURPOSE_BY[marker_signal]
    if state is JobState.CANCELLED:
        return cancelled_by(raw_state)
    if state is JobState.FAILED and kill_signal(exit_code, signal) is not None:
        return EndedBy.SIGNAL
    return EndedBy.PROGRAM if state in (JobState.COMPLETED, JobState.FAILED) else EndedBy.SLURM


def kill_signal(exit_code: int | None, signal: int | None) -> int | None:
    """The signal that ended the program: sacct's `:N`, or the shell's 128+N exit code (SIGTERM's 143 is the
    wrapper passing on a cancel, a time limit or a requeue, so it counts as a signal too)."""
    if signal:
        return signal
    if exit_code is not None and 128 < exit_code < 128 + 65:
        return exit_code - 128
    return None


def end_rule(state: JobState, by: EndedBy) -> EndRule:
    """The row for this end: pcflow's decision whatever the state, else (state, who), else OTHER_END."""
    return END_STATES.get((None, by)) or END_STATES.get((state, by)) or OTHER_END


@dataclass(frozen=True)
class End:
    """A job's end as the table reads it: the row, and the message for the task log."""

    rule: EndRule
    message: str

    @property
    def outcome(self) -> Outcome:
        """The stored outcome, what the task's result and the trigger's event carry."""
        return self.rule.outcome


def describe_end(info: JobInfo, exit_code: int | None = None, marker_signal: str = "") -> End:
    """The row and message for a job Slurm (or its marker) says is over; `exit_code` when known better than
    Slurm's (the marker's). A job still shown active is over by its marker: exit code 0 reads as COMPLETED,
    any other as FAILED."""
    code = info.exit_code if exit_code is None else exit_code
    state = info.state
    if state.is_active:
        state = JobState.COMPLETED if code == 0 else JobState.FAILED
    rule = end_rule(state, ended_by(state, info.raw_state, code, info.signal, marker_signal))
    sig = kill_signal(code, info.signal)
    raw = info.raw_state or str(info.state)
    values = {
        "code": f" with exit code {code}" if code else "",
        "signal": _signal_name(sig) if sig is not None else "a signal",
        "uid": canceller_uid(info.raw_state) or "?",
    }
    return End(rule, end_message(info.job_id, rule, raw, **values))


def end_message(job_id: str, rule: EndRule, raw: str = "", **values: str) -> str:
    """`Slurm job <id> <what happened> (Slurm state <state>). <What to do>`; pcflow's own decisions and a success
    say only what happened."""
    values = {"code": "", "signal": "a signal", "uid": "?", "raw": raw, "job_id": job_id, **values}
    what = rule.what.format(**values)
    if rule.ending in (Ending.SUCCEEDED, Ending.STOPPED_ON_PURPOSE):
        return f"Slurm job {job_id} {what}"
    return f"Slurm job {job_id} {what} (Slurm state {raw}). {rule.todo.format(**values)}".rstrip()


def _signal_name(number: int) -> str:
    try:
        return f"signal {number} ({signals.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


# -- the declared outputs of a completed job ------------------------------------------------------------


class JobOutputsMissing(JobFailedForGood):
    """A job completed without an output it declares (or with one cut short): it did not do its work, and a
    retry would adopt the same completed job and find the same files (not retried)."""


def output_problems(sizes: Mapping[str, int | None], recorded: Mapping[str, object]) -> list[str]:
    """What is wrong with each declared output, by its size on the head node now (None: absent) and the size
    the job's exit marker recorded on its node (`outputs`; -1 or nothing: not recorded): absent, empty, or
    not the size the job left (a copy cut short, a shared filesystem not caught up, a file changed since)."""
    problems = []
    for name, size in sizes.items():
        at_exit = recorded.get(name)
        at_exit = at_exit if isinstance(at_exit, int) and not isinstance(at_exit, bool) and at_exit >= 0 else None
        if size is None:
            problems.append(f"its output {name} does not exist")
        elif size == 0:
            problems.append(f"its output {name} is empty (0 bytes)")
        elif at_exit is not None and size != at_exit:
            problems.append(
                f"its output {name} has {size} bytes where the job's exit marker recorded {at_exit} "
                "(truncated, or changed since the job ended)"
            )
    return problems
