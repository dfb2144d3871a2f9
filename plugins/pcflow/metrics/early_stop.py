"""Early stopping: cancel a trial whose objective stopped improving or diverged, as a decision, not a failure.

The rule is `pcflow.readings.stopping.decide` (pure, tested alone); the wait applies it to a trial's
metrics file and writes `early_stop.json` into the trial's directory before `scancel`
(`HeadNodeTrigger.stop_trial`) — the job's wait then reports the trial as `stopped_early`, and so
does the harvest. The pipeline gives the rule to the train task (`SlurmJobOperator(early_stopping=...)`),
whose trigger checks each running trial as it confirms the job with slurmctld. `EarlyStoppingOperator`
is the same check as a task of its own, for a job pcflow's train task did not submit: it finds the job
from the run directory's `submitted` file.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from pcflow.events import SUCCESS, validate_event
from pcflow.naming import run_key_from_context, slug
from pcflow.readings.series import Objective
from pcflow.slurm.head_node import HeadNode, head_node_argument
from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.spec import RunDir
from pcflow.slurm.trigger import HeadNodeTrigger
from pcflow.values import known_at_run_time

if TYPE_CHECKING:
    from airflow.sdk import Context

    from pcflow.slurm.session import Seat, View


class EarlyStoppingTrigger(HeadNodeTrigger):
    """Fires when the trial was stopped (payload outcome `stopped_early`) or ended by itself (`finished`).
    The rule is the base trigger's `early_stopping`, the same one a train task's wait applies."""

    def __init__(self, *, element: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not self.early_stopping:
            raise ValueError("EarlyStoppingTrigger needs an early_stopping rule")
        self.element = element

    def kwargs(self) -> dict[str, Any]:
        return {**super().kwargs(), "element": self.element}

    @property
    def trial_dir(self) -> str:
        return self.run_dir if self.element is None else posixpath.join(self.run_dir, str(self.element))

    async def poll(self, seat: Seat, view: View) -> dict | None:
        sftp = seat.sftp
        submitted = await self.read_bytes(sftp, posixpath.join(self.run_dir, "submitted")) or b""
        submitted = submitted.decode(errors="replace").strip()
        if not submitted.isdigit():
            return None  # not submitted yet
        job_id = submitted if self.element is None else f"{submitted}_{self.element}"
        marker = await self.read_json(sftp, posixpath.join(self.trial_dir, "exit.json"))
        decision = await self.evaluate_trial(sftp, self.trial_dir)
        base = {"job_id": job_id, "run_dir": self.trial_dir, "decision": asdict(decision)}
        if decision.stop and not marker:
            await self.stop_trial(seat, job_id=job_id, trial_dir=self.trial_dir, decision=decision)
            return {**base, "status": "success", "outcome": "stopped_early"}
        if marker and str(marker.get("job_id")) == job_id:
            return {**base, "status": "success", "outcome": "finished"}
        return None

    async def on_kill(self) -> None:
        """The check is advisory: killing it leaves the training alone."""


class EarlyStoppingOperator(BaseOperator):
    """Watch a running trial and scancel it when its objective has not improved for `patience`
    evaluations or has diverged (NaN/inf). Succeeds either way; returns `{"outcome":
    "stopped_early"|"finished", "job_id", "run_dir", "decision"}`.

    :param train_task_id: the SlurmJobOperator/SlurmArrayJobOperator task of the same DAG run.
    :param element: the trial's index when the train task is a job array.
    """

    template_fields: Sequence[str] = ("objective", "patience", "min_delta", "element", "head_node")

    def __init__(
        self,
        *,
        train_task_id: str,
        objective: dict[str, str] | str,
        patience: int = 5,
        min_delta: float = 0.0,
        element: int | None = None,
        head_node: HeadNode | Mapping[str, Any] | str | None = None,
        ssh_conn_id: str | None = None,
        remote_host: str | None = None,
        host_key: str | None = None,
        shared_root: str | None = None,
        poll_interval: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.train_task_id = train_task_id
        self.objective = objective
        self.patience = patience
        self.min_delta = min_delta
        self.element = element
        self.head_node = head_node_argument(head_node, ssh_conn_id, remote_host, host_key)
        self.shared_root = shared_root
        self.poll_interval = poll_interval
        if not known_at_run_time(objective):
            Objective.parse(objective)

    @cached_property
    def hook(self) -> SlurmHook:
        return SlurmHook(HeadNode.of(self.head_node))

    def make_trigger(self, context: Context) -> EarlyStoppingTrigger:
        """The check's wait, aimed at the train task's run directory (the same path the train task computes from
        the run key), its rule validated first."""
        root = self.shared_root or self.hook.shared_root
        run_dir = RunDir.for_job(root, run_key_from_context(context), slug(self.train_task_id, 64) or "job")
        return EarlyStoppingTrigger(
            head_node=self.hook.head_node,
            job_id="",
            run_dir=run_dir.root,
            slurm_bin=self.hook.extras.get("slurm_bin"),
            policy={"poll_interval": self.poll_interval},
            early_stopping={
                "objective": Objective.parse(self.objective).as_dict(),
                "patience": int(self.patience),
                "min_delta": float(self.min_delta),
            },
            element=None if self.element in (None, "") else int(self.element),
        )

    def execute(self, context: Context) -> None:
        self.defer(trigger=self.make_trigger(context), method_name="execute_complete")

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """The check's outcome. Advisory: a wait that gave up returns `unchecked` instead of failing (the
        training is not this task's to fail)."""
        event = validate_event(event, task=self.task_id)
        if event["status"] != SUCCESS:  # advisory: the training goes on, unchecked
            self.log.warning("Early-stopping check gave up: %s", event.get("message"))
            return {"outcome": "unchecked", "message": event.get("message")}
        event = validate_event(event, task=self.task_id, required=("outcome", "job_id", "run_dir", "decision"))
        if event["outcome"] == "stopped_early":
            self.log.info("Stopped trial %s early (%s)", event["job_id"], event["decision"]["reason"])
        return {k: event[k] for k in ("outcome", "job_id", "run_dir", "decision")}
