"""Nothing idle billing: a kept ParallelCluster cluster (the nightly's, shared by its stack's runs) whose
Slurm queue has been idle longer than its profile's `budget.idle_minutes` gets its compute fleet
stopped (`pcluster update-compute-fleet --status STOP_REQUESTED`); the next run starts it again
(`ParallelClusterProvider.start_fleet_if_stopped`, before it submits).

The janitor's hourly run asks, for each kept cluster whose fleet is running, its Slurm queue over SSH to
the head node (host key pinned from the console output, as the pipeline does): idle means no job pending
or running (`squeue`), no node busy (the newest `LastBusyTime` of `scontrol show node`) and the fleet not
started again (describe-compute-fleet's `lastStatusUpdatedTime`) for `idle_minutes`. Slurm, not EC2:
a job pending for capacity has no instance yet, and stopping the fleet would strand it; and ParallelCluster
already ends idle dynamic nodes itself (ScaledownIdletime), so no instance says nothing of the queue.

Which kept cluster has which settings comes from the deployment's profiles (the cluster's `pcflow:stack`
tag names its stack, a profile names the stack, its SSH connection and `idle_minutes`): a kept cluster no
profile names is reported, not touched.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pcflow.naming import TAG_RUN, TAG_STACK

log = logging.getLogger(__name__)

STOP, START = "STOP_REQUESTED", "START_REQUESTED"
_LAST_BUSY = re.compile(r"\bLastBusyTime=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")
SLURM_TIME = "%Y-%m-%dT%H:%M:%S"


@dataclass(frozen=True)
class KeptClusterSettings:
    """What a profile says about its stack's kept cluster."""

    stack: str
    ssh_conn_id: str
    idle_minutes: float
    profile: str


@dataclass(frozen=True)
class QueueActivity:
    """Slurm's view of a queue, in the head node's own clock (Slurm prints local times without a zone)."""

    jobs: int
    last_busy: dt.datetime | None
    now: dt.datetime

    def idle_for(self, fleet_started: dt.datetime | None) -> dt.timedelta | None:
        """How long nothing has run nor waited; None while a job is queued or running."""
        if self.jobs:
            return None
        since = max((t for t in (self.last_busy, fleet_started) if t is not None), default=None)
        return self.now - since if since is not None else dt.timedelta.max


def settings_by_stack(profiles: Iterable[str] | None = None) -> dict[str, KeptClusterSettings]:
    """For each stack a ParallelCluster profile with `budget.idle_minutes` names: its settings (the
    smallest `idle_minutes` when several profiles share a stack). A profile that does not load is skipped."""
    from pcflow.paths import profile_names
    from pcflow.runspec import RunSpecError, resolve_run_spec

    found: dict[str, KeptClusterSettings] = {}
    for name in profiles if profiles is not None else profile_names():
        try:
            spec = resolve_run_spec(name)
        except RunSpecError as exc:
            log.warning("profile %s does not load, its kept cluster is not checked: %s", name, exc)
            continue
        minutes = spec.budget.idle_minutes
        if spec.cluster.provider != "parallelcluster" or minutes is None:
            continue
        known = found.get(spec.stack)
        if known is None or minutes < known.idle_minutes:
            found[spec.stack] = KeptClusterSettings(spec.stack, spec.cluster.ssh_conn_id, minutes, name)
    return found


def queue_activity(slurm: Any) -> QueueActivity:
    """Jobs pending or running, the newest LastBusyTime of the nodes, and the head node's clock."""
    jobs = slurm.run(["squeue", "-h", "-o", "%i"]).stdout.split()
    nodes = slurm.run(["scontrol", "show", "node", "-o"]).stdout
    busy = [dt.datetime.strptime(m, SLURM_TIME) for m in _LAST_BUSY.findall(nodes)]
    now = dt.datetime.strptime(slurm.run(["date", f"+{SLURM_TIME}"]).stdout.strip(), SLURM_TIME)
    return QueueActivity(jobs=len(jobs), last_busy=max(busy, default=None), now=now)


def fleet_started(fleet: Mapping[str, Any], head_now: dt.datetime, local_now: dt.datetime) -> dt.datetime | None:
    """describe-compute-fleet's `lastStatusUpdatedTime` (UTC) on the head node's clock."""
    when = fleet.get("lastStatusUpdatedTime")
    if not when:
        return None
    utc = dt.datetime.fromisoformat(str(when).replace("Z", "+00:00"))
    return head_now - (local_now - utc)


def check_cluster(
    hook: Any,
    name: str,
    settings: KeptClusterSettings,
    slurm_for: Callable[[Mapping[str, Any]], Any],
    *,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Stop one kept cluster's fleet when its queue is idle long enough; what was found and done."""
    result = {"cluster": name, "stack": settings.stack, "idle_minutes": settings.idle_minutes}
    fleet = hook.describe_compute_fleet(name)
    if fleet.get("status") != "RUNNING":
        return {**result, "fleet": fleet.get("status"), "action": "none (fleet not running)"}
    slurm = slurm_for(hook.describe_cluster(name) or {})
    try:
        activity = queue_activity(slurm)
    finally:
        slurm.close()
    started = fleet_started(fleet, activity.now, dt.datetime.now(dt.UTC))
    idle = activity.idle_for(started)
    result |= {"fleet": "RUNNING", "jobs": activity.jobs}
    if idle is None or idle < dt.timedelta(minutes=settings.idle_minutes):
        held = "jobs queued" if idle is None else f"idle {idle.total_seconds() / 60:.0f} min"
        return {**result, "action": f"none ({held})"}
    idle_text = "ever" if idle == dt.timedelta.max else f"{idle.total_seconds() / 60:.0f} min"
    if dry_run:
        return {**result, "action": f"would stop (queue idle {idle_text}; dry run)"}
    answer = hook.update_compute_fleet(name, STOP)
    return {**result, "fleet": answer.get("status"), "action": f"stopped (queue idle {idle_text})"}


def kept_clusters(cloudformation: Any, ec2: Any, stack: str | None = None) -> list[tuple[str, str]]:
    """(cluster name, stack) of every ParallelCluster cluster pcflow keeps: tagged with a stack, no run."""
    from pcflow.aws.teardown import Selector
    from pcflow.cluster.teardown import ParallelClusterStackHandler

    selector = Selector(stack=stack, predicate=lambda tags: TAG_RUN not in tags)
    listed = ParallelClusterStackHandler(cloudformation, ec2).list(selector)
    return [(r.id, r.tags[TAG_STACK]) for r in listed if not r.state.startswith("DELETE")]


from pcflow.aws.base import PcflowAwsOperator, aws_template_fields  # noqa: E402 - the functions above stay importable without it


class StopIdleFleetsOperator(PcflowAwsOperator):
    """The janitor's check of kept clusters: stop the compute fleet of each whose queue has been idle
    longer than its profile's `budget.idle_minutes`. Returns one line per kept cluster: what was found
    and done. A cluster that cannot be asked (its head node unreachable) fails the task, untouched.

    :param stack: only this stack's kept clusters (default: every stack).
    :param profiles: the profiles to read the settings from (default: every profile of the deployment).
    :param dry_run: report what would be stopped; None: as the janitor (dry run when triggered by hand).
    """

    template_fields: Sequence[str] = aws_template_fields("stack", "dry_run")

    def __init__(
        self,
        *,
        stack: str | None = None,
        profiles: Sequence[str] | None = None,
        pcluster_path: str | None = None,
        dry_run: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stack = stack
        self.profiles = profiles
        self.pcluster_path = pcluster_path
        self.dry_run = dry_run

    @cached_property
    def provider(self) -> Any:
        from pcflow.cluster.providers import make_provider

        connection = {**self.aws_connection, "region_name": self.hook.region_name}
        return make_provider("parallelcluster", **connection, pcluster_path=self.pcluster_path)

    def slurm_for(self, settings: KeptClusterSettings) -> Callable[[Mapping[str, Any]], Any]:
        """The head node of a described cluster, over the profile's SSH connection, its host key pinned
        from the instance's console output (never trusted on first use)."""
        from pcflow.slurm.head_node import HeadNode
        from pcflow.slurm.hook import SlurmHook

        def connect(described: Mapping[str, Any]) -> Any:
            head = described.get("headNode") or {}
            address = head.get("publicIpAddress") or head.get("privateIpAddress")
            host_key = self.provider.head_node_host_key(head.get("instanceId"))
            return SlurmHook(HeadNode(settings.ssh_conn_id, address, host_key))

        return connect

    def execute(self, context: Any) -> dict[str, Any]:
        from pcflow.aws.janitor import resolve_dry_run

        dry_run = resolve_dry_run(self.dry_run, context)
        settings = settings_by_stack(self.profiles)
        results = []
        for name, stack in kept_clusters(self.client("cloudformation"), self.ec2, self.stack or None):
            if stack not in settings:
                why = f"none (no profile of stack {stack} sets budget.idle_minutes)"
                results.append({"cluster": name, "stack": stack, "action": why})
                continue
            found = settings[stack]
            results.append(check_cluster(self.provider.hook, name, found, self.slurm_for(found), dry_run=dry_run))
        for result in results:
            self.log.info("kept cluster %s (stack %s): %s", result["cluster"], result["stack"], result["action"])
        return {"clusters": results}
