"""Run one Slurm job per run key: submitted exactly once, waited for without a worker slot.

A retry, a worker that died right after sbatch, or a cleared task first looks for the job it may
already have started: the job id kept in the task state store, then a job of the same name in Slurm
(squeue, and sacct with accounting), then the `submitted` file sbatch's wrapper left in the run
directory. It re-attaches to a live job, adopts a completed one, and submits again only after a
failure.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, conf
from pydantic import ValidationError

from pcflow.compat import read_state
from pcflow.errors import (
    ConfigurationError,
    JobFailed,
    JobFailedForGood,
    PcflowInputError,
    TriggerEventError,
    connection_admin,
    refused,
    task_author,
)
from pcflow.events import validate_event
from pcflow.jobstates import JobInfo, JobState
from pcflow.naming import run_key_from_context, slug
from pcflow.readings.stopping import BUDGET_FILE
from pcflow.slurm.head_node import HeadNode, head_node_argument
from pcflow.slurm.kills import kill_verdict
from pcflow.slurm.outcomes import (
    BUDGET_SIGNAL,
    ENDED_ON_PURPOSE,
    STOPPED_ON_PURPOSE,
    JobOutputsMissing,
    Outcome,
    output_problems,
)
from pcflow.slurm.watch import WatchPolicy

if TYPE_CHECKING:
    from airflow.sdk import Context

    from pcflow.slurm.hook import SlurmHook
    from pcflow.slurm.spec import ArraySpec, JobSpec, RunDir
    from pcflow.slurm.trigger import HeadNodeTrigger

# The hook (paramiko, the SSH provider), the trigger (asyncssh), the job spec (pydantic models) and the
# batch-script templates are imported where they are used: a DAG file declaring these operators must
# parse without them.

STATE_KEY = "slurm_job"
#: What the SSH user writes into a job's directory: the job (in the directory's group, hook.make_job_dirs) reads it,
#: nobody else does; the directory keeps anyone else out whatever the mode.
JOB_READS = 0o640


class SlurmJobOperator(BaseOperator):
    """Submit a training (or any) job to Slurm over SSH once per run key and wait for it without a worker slot.

    Before submitting, the task looks for the job an earlier try of it left (the module docstring says
    where): a job still running or requeued is waited on again, one that completed, or that pcflow ended
    on purpose (early stopping, the budget), is adopted as this try's result, and only one that failed
    makes it submit again. A job named like this run's but submitted by another user is never adopted.
    Bad input (the spec, the shared root) fails the task without retry before anything reaches the
    cluster; a failed job raises `JobFailed` (retried: the retry re-attaches or resubmits) with the log's
    last lines, or `JobFailedForGood` (not retried) where a retry would end the same way or undo a person's
    cancel (pcflow.slurm.outcomes.END_STATES says which); a host-key mismatch fails without retry. A job that
    completed without one of its declared `outputs` fails without retry too. A job that waited past
    `pending_timeout` or restarted more than `max_restarts` times is cancelled before the task fails; killing
    the task cancels the job too.

    Returns (XCom) `job_id`, `outcome` (`success`, `stopped_early`, `budget_exhausted`), `state`,
    `exit_code`, `elapsed_s`, `restarts`, `nodes` (Slurm's node list of the last attempt), `run_dir`,
    `log` and `metrics_file`: what the metrics stage reads.

    :param program: the program and its arguments, one list element each (never shell text), interpreter
        included: every launcher's workers run it as given, so changing the launcher never changes it.
    :param launcher: `srun`, `torchrun`, `vissl` or `mpirun` (templates in pcflow/slurm/templates/).
    :param allocation: the Slurm resources (BaseOperator already owns `resources`): nodes,
        tasks_per_node, gpus_per_node, cpus_per_task, partition, time_limit, exclusive, requeue,
        extra_sbatch (allow-listed options).
    :param hyperparameters: written to hparams.json in the run directory; the job reads `$PCFLOW_HPARAMS`.
    :param env: environment variables for the job: passed through sbatch's environment, never written in
        the script or spec.json (which name them only), and every value masked in logs once rendered.
    :param python: the environment's interpreter on the cluster (a baked venv's python): it runs the
        shipped payload's script under every launcher, and torchrun's per-node agent.
    :param payload_dir: the run's shipped payload on the cluster (`pcflow.slurm.payload`): `program[0]` is
        then a script inside it (or `pkg.module:function` in it), run with `python`; None runs `program` as
        it is, interpreter included.
    :param hyperparameter_args: also pass the hyperparameters as `--key value` arguments (hparams.json and
        `$PCFLOW_HPARAMS_JSON` have them always).
    :param head_node: the head node (`pcflow.slurm.head_node.HeadNode`, its dict, or an SSH connection id;
        connection extras: shared_root, slurm_bin): a cluster made by this run gives its address and
        pinned host key with the connection id. `ssh_conn_id`, `remote_host`, `host_key`: its parts, as
        before HeadNode (still accepted; give them or `head_node`, not both).
    :param shared_root: a directory all nodes see; defaults to the connection's `shared_root` extra. The
        job's files live in `<shared_root>/pcflow/runs/<run key>/<task>/`.
    :param poll_interval: seconds between the waiter's looks at the exit marker and the log (SFTP: cheap).
    :param confirm_interval: seconds between questions to slurmctld (and at once when a marker appears).
    :param pending_timeout: seconds a job may stay pending before pcflow cancels it and fails.
    :param max_restarts: Slurm requeues (node failure, preemption) tolerated before pcflow gives up.
    :param early_stopping: `{"objective": {"name", "mode"}, "patience", "min_delta"}`: the wait scancels
        a trial whose objective has not improved for `patience` evaluations or is NaN/inf; the task
        still succeeds, with outcome `stopped_early` (see metrics/early_stop.py).
    :param budget: the first task's cost section (pcflow.budget: prices, nodes, `budget_usd`): the wait
        logs the run's cost so far every `report_every_s` and, when it reaches the budget, cancels the job;
        the task still succeeds, with outcome `budget_exhausted`.
    :param outputs: files (relative to the run directory, e.g. `model.pt`, `metrics.jsonl`) a job that
        completed must have left: each present, not empty, and of the size the job's exit marker recorded
        (the wrapper records model.pt's and metrics.jsonl's). Checked for a single job; an array's trials are not.
    :param container: the run's image as the prepare_image task imported it (pcflow.slurm.images): each task
        of the job runs in it, seeing its run, code and data directories at their own paths; None (or a
        dict without an image): on the nodes themselves. The result records its reference and digest.
    :param warm_start: the model the job starts from, on the cluster (the warm_start task's `path`: verified
        against its run's recorded sha256, read-only): the job reads its path in `$PCFLOW_WARM_START`.
    :param secret_env: the references (`{name: {"variable": key}}`, pcflow.runspec.SecretReference) of the
        secrets among `env`: the trigger reads them again so the log lines it streams show `***` instead.
    :param capacity: the run's capacity options in order (the first task's `capacity_order`, pcflow.capacity):
        while the job is pending and its partition's nodes are down for insufficient capacity, the wait moves
        it to the next option's partition and says so with that option's price; the result lists the moves
        (`capacity_moves`). One job only: an array's elements stay where they are.
    :param fabric_env: the cluster's network settings (its ensure task's `fabric_env`: EFA's libfabric, see
        pcflow.cluster.fabric), exported by the batch script where `env` does not set them.
    :param retry_failed_jobs: whether a job that failed in a way a retry may fix (a node lost, preempted, out
        of time; the waiter giving up) fails the task with retries (a retry submits it again) or for good. False
        (the pipelines' train task): the task's retries are for the orchestrator's own losses (a worker or
        triggerer gone), whose retry adopts the job; a failed job costs no second allocation unless a person
        clears the task.
    :param deferrable: wait in the triggerer, or in this worker with the same semantics; the default is
        Airflow's `operators.default_deferrable` (pcflow's deployments set it true).
    """

    template_fields: Sequence[str] = (
        "program",
        "launcher",
        "allocation",
        "hyperparameters",
        "env",
        "python",
        "shared_root",
        "head_node",
        "max_restarts",
        "pending_timeout",
        "early_stopping",
        "payload_dir",
        "hyperparameter_args",
        "budget",
        "secret_env",
        "container",
        "warm_start",
        "capacity",
        "fabric_env",
    )
    template_fields_renderers = {"hyperparameters": "json", "allocation": "json", "env": "json"}  # noqa: RUF012
    ui_color = "#b5e3c3"
    # What execute learns (set per task instance; a new try starts from these).
    job_id: str | None = None
    run_started: float | None = None
    task_instance: Any = None

    def __init__(
        self,
        *,
        program: list[str],
        launcher: str = "srun",
        allocation: dict[str, Any] | None = None,
        hyperparameters: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        python: str = "python3",
        head_node: HeadNode | Mapping[str, Any] | str | None = None,
        ssh_conn_id: str | None = None,
        remote_host: str | None = None,
        host_key: str | None = None,
        shared_root: str | None = None,
        poll_interval: float = 1.0,
        confirm_interval: float = 30.0,
        pending_timeout: float | None = None,
        max_restarts: int = 3,
        early_stopping: dict[str, Any] | None = None,
        payload_dir: str | None = None,
        hyperparameter_args: bool = False,
        budget: dict[str, Any] | None = None,
        secret_env: dict[str, dict[str, str]] | None = None,
        container: dict[str, Any] | None = None,
        warm_start: str | None = None,
        outputs: Sequence[str] = (),
        capacity: list[dict[str, Any]] | None = None,
        fabric_env: dict[str, str] | None = None,
        retry_failed_jobs: bool = True,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.capacity = capacity
        self.fabric_env = fabric_env
        self.program = program
        self.payload_dir = payload_dir
        self.hyperparameter_args = hyperparameter_args
        self.launcher = launcher
        self.allocation = allocation or {}
        self.hyperparameters = hyperparameters or {}
        self.env = env or {}
        self.python = python
        self.head_node = head_node_argument(head_node, ssh_conn_id, remote_host, host_key)
        self.shared_root = shared_root
        self.poll_interval = poll_interval
        self.confirm_interval = confirm_interval
        self.pending_timeout = pending_timeout
        self.max_restarts = max_restarts
        self.early_stopping = early_stopping
        self.budget = budget
        self.secret_env = secret_env
        self.container = container
        self.warm_start = warm_start
        self.outputs = tuple(outputs)
        self.retry_failed_jobs = retry_failed_jobs
        self.deferrable = deferrable

    @cached_property
    def hook(self) -> SlurmHook:
        from pcflow.slurm.hook import SlurmHook  # paramiko: not when a DAG file is parsed

        return SlurmHook(HeadNode.of(self.head_node))

    @property
    def ssh_conn_id(self) -> str:
        return HeadNode.of(self.head_node).conn_id

    def render_template_fields(self, context: Context, jinja_env: Any = None) -> None:
        """Every value of the environment is masked once rendered, whatever its name: in this task's log
        and in the rendered fields Airflow stores and shows (any of them may be a token or a key)."""
        super().render_template_fields(context, jinja_env)
        from airflow.sdk.log import mask_secret

        for value in (self.env if isinstance(self.env, dict) else {}).values():
            mask_secret(value)

    def job_spec(self) -> JobSpec:
        """The validated spec; bad input fails the task for good (a retry would not fix it)."""
        from pcflow.slurm.spec import JobSpec

        try:
            return JobSpec(
                launcher=self.launcher,
                program=list(self.program),
                resources=self.job_resources(),
                hyperparameters=self.hyperparameters,
                env=self.env,
                python=self.python,
                array=self.array_spec(),
                payload_dir=self.payload_dir or None,
                hyperparameter_args=bool(self.hyperparameter_args),
                container=self.container if (self.container or {}).get("digest") else None,
                warm_start=self.warm_start or None,
                fabric_env=self.fabric_env or {},
            )
        except ValidationError as exc:
            raise ConfigurationError(
                f"Invalid Slurm job for task {self.task_id}: {errors_without_values(exc)}; {task_author(self.task_id)}"
            ) from None

    def array_spec(self) -> ArraySpec | None:
        """None: one job. The array operator's hook into the spec, so one submit path serves both."""
        return None

    def job_resources(self) -> dict[str, Any]:
        """The allocation as given (the array operator's hook: its elements' nodes are their own)."""
        return self.allocation

    def run_dir(self, context: Context) -> RunDir:
        """The job's directory under the shared root, named by run key and task so every try of the task finds
        the same one; no shared root configured fails the task without retry."""
        from pcflow.slurm.spec import RunDir

        root = self.shared_root or self.hook.shared_root
        if not root:
            problem = (
                f"No shared directory for the run: set shared_root on task {self.task_id} or the `shared_root` "
                f"extra of connection {self.ssh_conn_id!r} (a path every Slurm node sees, e.g. /fsx)"
            )
            raise refused("shared_root", problem, connection_admin(self.ssh_conn_id))
        try:
            return RunDir.for_job(root, run_key_from_context(context), slug(self.task_id, 64) or "job")
        except ValueError as exc:
            raise refused("shared_root", str(exc), connection_admin(self.ssh_conn_id)) from exc

    def job_name(self, context: Context) -> str:
        """The job's identity in Slurm: the run key plus the task, stable across retries."""
        return f"{run_key_from_context(context)}.{slug(self.task_id, 64) or 'job'}"

    # -- finding what a previous try left --------------------------------------------------------

    def find_previous_job(self, context: Context, run_dir: RunDir) -> tuple[JobInfo | None, int]:
        """The newest job this task instance submitted, if any, and the log offset it started at."""
        saved = read_state(context.get("task_state_store"), STATE_KEY)
        if saved:
            info = self.job_status(saved["job_id"], run_dir)
            if info is not None:
                return info, int(saved.get("log_offset", 0))
        named = self.own_jobs(self.hook.find_jobs(self.job_name(context)))
        if named:
            return self.job_status(named[-1].job_id.split("_")[0], run_dir), 0
        submitted = self.hook.read_file(run_dir.submitted, 0, 64).decode(errors="replace").strip()
        if submitted.isdigit():
            return self.job_status(submitted, run_dir), 0
        return None, 0

    def own_jobs(self, jobs: list[JobInfo]) -> list[JobInfo]:
        """The jobs the run's job user (or, without one, the connection's user) submitted. A run's job name is
        predictable, and on a shared cluster any user can submit under it: such a job is never adopted (its
        outcome is not ours)."""
        user = self.hook.job_user or self.hook.login
        for job in jobs:
            if job.user != user:
                self.log.warning(
                    "Not adopting Slurm job %s named %s: it was submitted by user %r, not by %r (this run's job "
                    "user, or the user of connection %r). This run submits its own job; ask who owns that one why "
                    "it uses this name.",
                    job.job_id,
                    job.name,
                    job.user or "unknown",
                    user,
                    self.ssh_conn_id,
                )
        return [job for job in jobs if job.user == user]

    def job_status(self, job_id: str, run_dir: RunDir) -> JobInfo | None:
        """Slurm's word on the job, or its exit marker's once Slurm has forgotten it; None when neither knows it."""
        return self.hook.job_info(job_id) or self._from_marker(job_id, run_dir)

    def _marker(self, job_id: str, run_dir: RunDir) -> dict | None:
        """The batch wrapper's exit record of this job, if it left one."""
        marker = self.hook.read_json(run_dir.marker)
        return marker if marker and str(marker.get("job_id")) == job_id else None

    def ended_on_purpose(self, info: JobInfo, run_dir: RunDir, budget_dir: str | None = None) -> Outcome | None:
        """How pcflow ended the job, when it did (Slurm says CANCELLED): the early-stopping rule or the
        budget (its record in `budget_dir`, the run's directory, names the job even when it never started)."""
        if info.state.is_active:
            return None
        signal = (self._marker(info.job_id, run_dir) or {}).get("signal")
        if signal in ENDED_ON_PURPOSE:
            return ENDED_ON_PURPOSE[signal]
        spent = self.hook.read_json(f"{budget_dir or run_dir.root}/{BUDGET_FILE}") or {}
        return ENDED_ON_PURPOSE[BUDGET_SIGNAL] if str(spent.get("job_id")) == info.job_id.split("_")[0] else None

    def _from_marker(self, job_id: str, run_dir: RunDir) -> JobInfo | None:
        """Slurm forgot the job (no accounting, MinJobAge passed): its exit marker still tells the end."""
        marker = self._marker(job_id, run_dir)
        if not marker:
            return None
        code = int(marker.get("exit_code", 1))
        state = JobState.COMPLETED if code == 0 else JobState.FAILED
        return JobInfo(job_id=job_id, state=state, raw_state=str(state), exit_code=code, source="marker")

    # -- execute -----------------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        self.task_instance = context.get("ti")  # on_kill asks Airflow what became of it
        spec = self.job_spec()
        run_dir = self.run_dir(context)
        previous, log_offset = self.find_previous_job(context, run_dir)

        if previous is not None and (adopted := self.adopt(previous, run_dir)) is not None:
            return adopted
        if previous is not None and self.waits_again(previous):
            self.log.info("Re-attaching to Slurm job %s (%s)", previous.job_id, previous.raw_state)
            self.job_id = previous.job_id
        else:
            if previous is not None:
                self.log.info("Previous Slurm job %s ended %s; submitting again", previous.job_id, previous.raw_state)
            self.job_id, log_offset = self.submit(context, spec, run_dir)

        started = getattr(context.get("dag_run"), "start_date", None)
        self.run_started = started.timestamp() if started else time.time()
        trigger = self.make_trigger(run_dir, log_offset)
        if self.deferrable:
            self.defer(trigger=trigger, method_name="execute_complete")
        event = asyncio.run(_first_event(trigger))
        return self.execute_complete(context, event)

    def adopt(self, previous: JobInfo, run_dir: RunDir) -> dict[str, Any] | None:
        """The result of this run's earlier job when it is over and wants no other (it completed, or pcflow
        ended it on purpose); None otherwise."""
        if previous.state is JobState.COMPLETED:
            self.log.info("Slurm job %s of this run already completed; adopting its result", previous.job_id)
            self.job_id = previous.job_id
            self.check_outputs(run_dir)
            return self.result(run_dir, previous, exit_code=previous.exit_code or 0)
        if outcome := self.ended_on_purpose(previous, run_dir):
            self.log.info(
                "Slurm job %s of this run was ended on purpose; adopting that outcome (%s)", previous.job_id, outcome
            )
            self.job_id = previous.job_id
            return self.result(run_dir, previous, outcome=str(outcome))
        return None

    def waits_again(self, previous: JobInfo) -> bool:
        """Whether to wait on this run's earlier job (running, or interrupted and coming back) rather than
        submit another."""
        return previous.state.is_active or previous.state.is_interruption

    def trigger_kwargs(self, run_dir: RunDir) -> dict[str, Any]:
        """What the trigger needs, all JSON: it is stored with the deferred task and shown, so the environment
        travels only as secret references."""
        return {
            "head_node": self.hook.head_node.as_dict(),
            "job_id": self.job_id,
            "run_dir": run_dir.root,
            "accounting": self.hook.accounting_enabled,
            "slurm_bin": self.hook.extras.get("slurm_bin"),
            "policy": self.policy_kwargs(),
            "early_stopping": self.early_stopping or None,
            "budget": {**self.budget, "run_started": self.run_started} if self.budget else None,
            "secret_env": self.secret_env or None,
        }

    def make_trigger(self, run_dir: RunDir, log_offset: int) -> HeadNodeTrigger:
        """The wait for this job, from `log_offset` on: the same trigger serves a deferred wait and a wait in
        the worker."""
        from pcflow.slurm.trigger import SlurmJobTrigger

        return SlurmJobTrigger(log_offset=log_offset, capacity=self.capacity, **self.trigger_kwargs(run_dir))

    def policy_kwargs(self) -> dict[str, Any]:
        """The waiter's pacing as WatchPolicy's fields, its defaults filled in: the trigger rebuilds the same
        policy from them."""
        policy = WatchPolicy(
            poll_interval=self.poll_interval,
            confirm_interval=self.confirm_interval,
            pending_timeout=self.pending_timeout,
            max_restarts=self.max_restarts,
        )
        return {k: getattr(policy, k) for k in policy.__dataclass_fields__}

    def submit(self, context: Context, spec: JobSpec, run_dir: RunDir) -> tuple[str, int]:
        """Upload script and hyperparameters, then sbatch; nothing is submitted if an upload fails."""
        from pcflow.readings.utilisation import sampler_source
        from pcflow.slurm.render import render_batch_script

        run_key = run_key_from_context(context)
        script = render_batch_script(spec, run_dir, job_name=self.job_name(context), run_key=run_key)
        # The SSH user's and the job user's only (hook.make_run_dirs): the job reads its inputs, cannot change
        # them; the environment (tokens, keys) goes with sbatch, not in a file.
        self.hook.make_run_dirs(run_dir.parent, run_dir.root)
        self.write_inputs(spec, run_dir)
        self.write_bundle(spec, run_dir)
        self.hook.write_file(run_dir.sampler, sampler_source(), mode=JOB_READS)  # the wrapper runs python3 <file>
        self.hook.write_file(run_dir.root + "/spec.json", spec_record(spec), mode=JOB_READS)
        self.hook.write_file(run_dir.script, script, mode=JOB_READS)  # sbatch reads it, as the job user
        self.hook.make_job_logs(*self.log_paths(run_dir))
        log_offset = self.hook.file_size(run_dir.log) or 0
        job_id = self.hook.submit(run_dir.script, submitted_marker=run_dir.submitted, env=spec.env)
        store = context.get("task_state_store")
        if store is not None:
            store.set(STATE_KEY, {"job_id": job_id, "log_offset": log_offset})
        self.log.info("Submitted Slurm job %s (%s) in %s", job_id, self.job_name(context), run_dir.root)
        return job_id, log_offset

    def write_bundle(self, spec: JobSpec, run_dir: RunDir) -> None:
        """The job's OCI bundle, for Slurm's `--container` (pcflow.slurm.images): its mounts are this job's
        directories only. Nothing for Pyxis (its options carry the mounts) or without a container."""
        if spec.container is None or spec.container.runtime != "oci":
            return
        from pcflow.slurm.images import bundle_config, write_bundle
        from pcflow.slurm.render import container_mounts

        c = spec.container
        config = bundle_config(c.model_dump(), c.shared_root, container_mounts(spec, run_dir), run_dir.root)
        write_bundle(self.hook, run_dir.bundle, config, c.path + "/rootfs")

    def log_paths(self, run_dir: RunDir) -> list[str]:
        """Where Slurm writes the job's log (an array: each element's, `SlurmArrayJobOperator`)."""
        return [run_dir.log]

    def write_inputs(self, spec: JobSpec, run_dir: RunDir) -> None:
        """Write the job's hyperparameters (data the job reads, never shell text) before sbatch is called."""
        from pcflow.slurm.render import render_hparams

        self.hook.write_file(run_dir.hparams, render_hparams(spec), mode=JOB_READS)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """The wait's end: the result XCom on success; a host-key mismatch fails without retry; a job's failure
        raises JobFailed (retried; for good without `retry_failed_jobs`), after cancelling a job the waiter gave
        up on; the wait's own error (its track of the job lost) is retried: the retry re-attaches."""
        from pcflow.slurm.spec import RunDir

        event = validate_event(event, task=self.task_id, required=("job_id", "run_dir", "message"))
        self.job_id = event["job_id"]
        run_dir = RunDir(event["run_dir"])
        if event["status"] == "success":
            self.log.info("%s", event["message"])
            return self.result_from_event(run_dir, event)
        if event.get("retryable") is False and event["status"] == "failed":  # outcomes.END_STATES: a final end
            raise JobFailedForGood(self.failure_message(run_dir, event))
        if event.get("retryable") is False:  # the trigger's own refusal (a host key mismatch): not retried
            raise PcflowInputError(event["message"])
        if event.get("outcome") in {str(o) for o in Outcome if o.needs_cancel}:
            self.hook.cancel(self.job_id)
        if not self.retry_failed_jobs and event["status"] == "failed":
            message = f"{event['message']} This task does not retry a failed job: clear it to submit it again."
            raise JobFailedForGood(self.failure_message(run_dir, {**event, "message": message}))
        raise JobFailed(self.failure_message(run_dir, event))

    def result_from_event(self, run_dir: RunDir, event: dict[str, Any]) -> dict[str, Any]:
        """The result XCom from the trigger's success event (a subclass reads its own event shape)."""
        info = JobInfo.from_dict(event["job"]) if event.get("job") else None
        if event["outcome"] == str(Outcome.SUCCESS):
            self.check_outputs(run_dir, event.get("log_tail") or [])
        result = self.result(run_dir, info, exit_code=event.get("exit_code") or 0, outcome=event["outcome"])
        return {
            **result,
            "capacity_moves": event.get("capacity_moves") or [],
            "held_releases": event.get("held_releases") or 0,  # holds after a failed launch the wait released
        }

    def check_outputs(self, run_dir: RunDir, log_tail: Sequence[str] = ()) -> None:
        """A job that completed without one of its declared outputs, or with one empty or cut short, did not do
        its work: the task fails for good, naming them (a retry would adopt the same job, find the same files)."""
        if not self.outputs:
            return
        marker = self._marker(self.job_id, run_dir) or {}
        recorded = marker.get("outputs") if isinstance(marker.get("outputs"), dict) else {}
        sizes = {name: self.hook.file_size(f"{run_dir.root}/{name}") for name in self.outputs}
        problems = output_problems(sizes, recorded)
        if not problems:
            return
        message = (
            f"Slurm job {self.job_id} completed, but {'; '.join(problems)} (in {run_dir.root}): the program exited "
            "0 without leaving what this task declares (outputs). Its log says what it did last. The task is not "
            "retried: a retry would adopt the same completed job."
        )
        raise JobOutputsMissing(self.failure_message(run_dir, {"message": message, "log_tail": list(log_tail)}))

    def failure_message(self, run_dir: RunDir, event: dict[str, Any]) -> str:
        """The trigger's reason with the log's last lines, so the task log shows why without a trip to the cluster."""
        tail = "\n".join(event.get("log_tail") or [])
        return f"{event['message']}\nLast lines of {run_dir.log}:\n{tail}"

    def result(
        self, run_dir: RunDir, info: JobInfo | None, exit_code: int = 0, outcome: str = str(Outcome.SUCCESS)
    ) -> dict[str, Any]:
        """The small XCom of a successful job, for the metrics stage and for users."""
        stopped = outcome in STOPPED_ON_PURPOSE
        return {
            "job_id": self.job_id,
            "outcome": outcome,
            "state": info.raw_state if stopped and info else str(JobState.COMPLETED),
            "exit_code": exit_code,
            "elapsed_s": info.elapsed_s if info else None,
            "restarts": info.restarts if info else 0,
            "nodes": info.nodes if info else "",  # Slurm's node list of the last attempt, e.g. node[1-2]
            "run_dir": run_dir.root,
            "log": run_dir.log,
            "metrics_file": run_dir.metrics,
            "container": image.provenance() if (image := self.job_spec().container) else None,
        }

    def on_kill(self) -> None:
        """Killed in this worker (while submitting, or waiting with deferrable=False): the job is cancelled
        only when a person stopped the task (pcflow.slurm.kills); a worker shutting down or losing its
        heartbeat leaves it running for the next try to adopt. A deferred wait's kill is its trigger's."""
        if not self.job_id:
            return
        verdict = kill_verdict(self.task_instance)
        if verdict.by_person:
            self.log.info(
                "Cancelling Slurm job %s: a person stopped this task (Airflow has it as %s now)",
                self.job_id,
                verdict.said,
            )
            self.hook.cancel(self.job_id)
            return
        self.log.warning(
            "Slurm job %s keeps running: this task was killed, but not by a person (%s), so the worker or "
            "Airflow went away; the next try of this task adopts the job. To stop it, mark the task failed "
            "or clear it.",
            self.job_id,
            verdict.said,
        )


class SlurmArrayJobOperator(SlurmJobOperator):
    """Every trial of a sweep as one Slurm job array: one sbatch, one SSH connection, one waiter.

    Element i runs with `trials[i]` as its hyperparameters in `<run dir>/<i>/` (its own log, metrics,
    checkpoints and exit marker); the same exactly-once rules apply to the array as a whole. Elements run
    side by side up to `max_parallel`, each on nodes of its own (`exclusive`): two trials never share a
    node, its GPUs, or the rendezvous port a job derives from its id, and one trial's speed is not another's.

    :param trials: one hyperparameter dict per element.
    :param max_parallel: at most this many elements run at once (`--array=0-N%max_parallel`); None: as many
        as the cluster holds.
    :param exclusive: each element allocates its nodes whole (`--exclusive`), whatever `allocation` says.
    :param min_success_ratio: the share of elements that must succeed for the task to succeed.
    """

    template_fields: Sequence[str] = (*SlurmJobOperator.template_fields, "trials", "max_parallel")

    def __init__(
        self,
        *,
        trials: list[dict[str, Any]],
        max_parallel: int | None = None,
        exclusive: bool = True,
        min_success_ratio: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.trials = trials
        self.max_parallel = max_parallel
        self.exclusive = exclusive
        self.min_success_ratio = min_success_ratio

    def array_spec(self) -> ArraySpec:
        from pcflow.slurm.spec import ArraySpec

        if not self.trials:
            raise refused("trials", "a job array needs at least one trial", task_author(self.task_id))
        return ArraySpec(size=len(self.trials), max_parallel=self.max_parallel)

    def job_resources(self) -> dict[str, Any]:
        return {**self.allocation, "exclusive": True} if self.exclusive else self.allocation

    def job_spec(self) -> JobSpec:
        spec = super().job_spec()
        self.trial_specs(spec)  # refuse a bad trial before anything reaches the cluster
        return spec

    def trial_specs(self, spec: JobSpec) -> list[JobSpec]:
        """One validated JobSpec per trial; a bad trial fails the task without retry, naming where it is wrong
        but not its values."""
        from pcflow.slurm.spec import JobSpec

        try:
            return [JobSpec.model_validate({**spec.model_dump(), "hyperparameters": t}) for t in self.trials]
        except ValidationError as exc:
            problem = f"Invalid trial for task {self.task_id}: {errors_without_values(exc)}"
            raise refused("trials", problem, task_author(self.task_id)) from None

    def log_paths(self, run_dir: RunDir) -> list[str]:
        return [run_dir.element(index).log for index in range(len(self.trials))]

    def write_inputs(self, spec: JobSpec, run_dir: RunDir) -> None:
        from pcflow.slurm.render import render_hparams

        trial_specs = self.trial_specs(spec)
        self.hook.make_job_dirs(*(run_dir.element(i).root for i in range(len(trial_specs))))
        for index, trial_spec in enumerate(trial_specs):
            self.hook.write_file(run_dir.element(index).hparams, render_hparams(trial_spec), mode=JOB_READS)

    def job_status(self, job_id: str, run_dir: RunDir) -> JobInfo | None:
        """The array as one job: active while any element is, completed when enough elements are."""
        elements = self.hook.array_elements(job_id)
        if not elements:
            return None
        if any(e.state.is_active for e in elements):
            state = JobState.RUNNING
        else:
            succeeded = sum(
                e.state is JobState.COMPLETED
                or (
                    e.array_index is not None
                    and self.ended_on_purpose(e, run_dir.element(e.array_index), run_dir.root) is not None
                )
                for e in elements
            )
            enough = succeeded >= math.ceil(self.min_success_ratio * len(self.trials))
            state = JobState.COMPLETED if enough else JobState.FAILED
        return JobInfo(job_id=job_id, state=state, raw_state=str(state), exit_code=0, source="array")

    def adopt(self, previous: JobInfo, run_dir: RunDir) -> dict[str, Any] | None:
        """Never from the array's summary, which says only whether enough elements succeeded: an array over
        and done is waited on again (`waits_again`), and its trigger reads each element's end anew."""
        return None

    def waits_again(self, previous: JobInfo) -> bool:
        return super().waits_again(previous) or previous.state is JobState.COMPLETED

    def make_trigger(self, run_dir: RunDir, log_offset: int) -> HeadNodeTrigger:
        from pcflow.slurm.trigger import SlurmArrayTrigger

        return SlurmArrayTrigger(
            size=len(self.trials),
            min_success_ratio=self.min_success_ratio,
            max_parallel=self.array_spec().max_parallel,
            **self.trigger_kwargs(run_dir),
        )

    def result_from_event(self, run_dir: RunDir, event: dict[str, Any]) -> dict[str, Any]:
        trials = []
        for element in event["elements"]:
            trial_dir = run_dir.element(element["index"])
            trials.append(
                {
                    **element,
                    "hyperparameters": self.trials[element["index"]],
                    "run_dir": trial_dir.root,
                    "log": trial_dir.log,
                    "metrics_file": trial_dir.metrics,
                }
            )
        return {"job_id": self.job_id, "run_dir": run_dir.root, "trials": trials}

    def failure_message(self, run_dir: RunDir, event: dict[str, Any]) -> str:
        return f"{event['message']}\nLogs: {run_dir.root}/<index>/job.log"


def errors_without_values(exc: ValidationError) -> str:
    """What is wrong and where, without the values pydantic would print (the environment holds secrets)."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'job'}: {e['msg']}" for e in exc.errors(include_input=False))


def spec_record(spec: JobSpec) -> str:
    """The job as submitted, for a person reading the run directory: the environment's names, not its values."""
    return json.dumps({**spec.model_dump(mode="json"), "env": sorted(spec.env)}, indent=2) + "\n"


async def _first_event(trigger: HeadNodeTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return event.payload
    raise TriggerEventError("the Slurm job trigger ended without an event")
