"""What a waiting task's log says while its job waits: why it is pending, when that changes, and how
far a job array has got. Free of I/O: the trigger feeds in what Slurm last said and logs the lines.

A pending reason is squeue's REASON field (squeue(1), "JOB REASON CODES"); the ones a training job
meets on ParallelCluster get a plain-words gloss, any other is shown as Slurm spells it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pcflow.jobstates import JobInfo, JobState

#: Reason (up to its first comma: `ReqNodeNotAvail, UnavailableNodes:node[1-2]`) -> what it means.
PENDING_REASONS = {
    "None": "waiting for the scheduler's next pass",
    "Resources": "waiting for nodes, CPUs or GPUs to become free",
    "Priority": "jobs of higher priority are queued ahead of it",
    "ReqNodeNotAvail": "the nodes it needs are down, drained, powered down or reserved; on ParallelCluster "
    "usually a compute resource disabled after an EC2 capacity shortage (spot or on-demand), retried after "
    "insufficient_capacity_timeout",
    "Nodes required for job are DOWN": "the nodes it needs are down or drained; on ParallelCluster usually "
    "an EC2 capacity shortage (spot or on-demand) or nodes being replaced",
    "launch failed requeued held": "its nodes failed to launch (on ParallelCluster: an instance that did not "
    "start, or a capacity shortage) and Slurm held it; `scontrol release` lets it try again",
    "BadConstraints": "its constraints cannot be met by any node now (on ParallelCluster this can follow a "
    "lost spot node)",
    "NodeDown": "a node it needs is down",
    "BeginTime": "its earliest start time has not come yet",
    "Dependency": "waiting for a job it depends on",
    "DependencyNeverSatisfied": "a job it depends on failed, so it can never start",
    "JobHeldUser": "held by its user (`scontrol release` starts it)",
    "JobHeldAdmin": "held by an administrator",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "PartitionNodeLimit": "it asks for more nodes than its partition allows",
    "PartitionTimeLimit": "its time limit exceeds its partition's",
    "Reservation": "waiting for its reservation to start",
}
#: Reasons by prefix: a family of limits, one gloss.
REASON_PREFIXES = {
    "QOS": "a quality-of-service limit holds it back",
    "Assoc": "an account (association) limit holds it back",
}


def explain_reason(reason: str) -> str:
    """`Resources` -> `Resources: waiting for nodes, CPUs or GPUs to become free`."""
    reason = reason or "None"
    key = reason.split(",", 1)[0].strip()
    gloss = PENDING_REASONS.get(key) or next(
        (text for prefix, text in REASON_PREFIXES.items() if key.startswith(prefix)), None
    )
    return f"{reason}: {gloss}" if gloss else reason


def describe(info: JobInfo) -> str | None:
    """One line for a job's state worth telling while waiting; None for states the verdict reports."""
    if info.state in (JobState.PENDING, JobState.REQUEUED):
        attempt = f" (attempt {info.restarts + 1})" if info.restarts else ""
        return f"Slurm job {info.job_id} is pending{attempt}: {explain_reason(info.reason)}"
    if info.raw_state.upper() in ("CONFIGURING", "CF"):
        nodes = f" {info.nodes}" if info.nodes else ""
        return f"Slurm job {info.job_id} is starting: its nodes{nodes} are booting"
    if info.state is JobState.RUNNING:
        return f"Slurm job {info.job_id} is running on {info.nodes or 'its nodes'}"
    if info.state is JobState.SUSPENDED:
        return f"Slurm job {info.job_id} is suspended ({info.raw_state})"
    return None


@dataclass
class JobProgress:
    """Says when a job's state or pending reason changes (the first sight counts as a change)."""

    last: str | None = None

    def note(self, info: JobInfo | None) -> str | None:
        """The line to log when the job's state or pending reason changed since the last call, else None (no
        line per poll)."""
        line = describe(info) if info is not None else None
        if line is None or line == self.last:
            return None
        self.last = line
        return line


@dataclass
class ArrayProgress:
    """Says how many elements of an array are pending, running, done and failed, whenever that changes."""

    array_id: str
    size: int
    last: dict[str, int] | None = None

    def note(self, counts: dict[str, int]) -> str | None:
        """The line to log when the array's counts changed since the last call, else None."""
        if counts == self.last:
            return None
        self.last = dict(counts)
        parts = ", ".join(f"{n} {what}" for what, n in counts.items())
        return f"Slurm job array {self.array_id} ({self.size} elements): {parts}"
