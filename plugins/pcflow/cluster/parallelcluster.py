"""The ParallelCluster provider: validate (dry run), ensure (describe, adopt, refuse, update or create),
diagnose a failed creation, delete (optionally exporting FSx to S3 first).

The waits are not here: operators defer on the cluster's CloudFormation stack (`triggers.py`), the plain
functions block on the same botocore waiters. Every decision is made from `describe-cluster`, so a retry
after a crash lands on the same branch.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pcflow.cluster.config import TAG_CONFIG_HASH, TAG_SHAPE_HASH, RenderedConfig, queues, render_config
from pcflow.cluster.fabric import fabric_env
from pcflow.cluster.info import ClusterInfo, Partition
from pcflow.cluster.node_setup import ensure_uploaded
from pcflow.cluster.pcluster import ParallelClusterHook, PclusterError
from pcflow.cluster.spec import ClusterSpec, check_instance_type
from pcflow.errors import PcflowError, PcflowInputError, ResourceConflict, ServiceFailed
from pcflow.naming import TAG_EXPIRES, TAG_RUN, TAG_STACK, Component, expiry_advances, resource_name, standard_tags

log = logging.getLogger(__name__)

HOST_KEYS_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
HOST_KEYS_END = "-----END SSH HOST KEY KEYS-----"
HOST_KEY_PREFERENCE = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa")
READY = frozenset({"CREATE_COMPLETE", "UPDATE_COMPLETE"})
IN_PROGRESS = frozenset({"CREATE_IN_PROGRESS", "UPDATE_IN_PROGRESS"})
#: Compute fleet states `update-compute-fleet --status START_REQUESTED` brings back to RUNNING.
FLEET_STOPPED = frozenset({"STOP_REQUESTED", "STOPPING", "STOPPED"})
FAILED = frozenset({"CREATE_FAILED", "UPDATE_FAILED", "DELETE_FAILED", "ROLLBACK_COMPLETE", "ROLLBACK_FAILED"})
BOOTSTRAP_LOG_RE = re.compile(r"error|fail|cfn-init|cloud-init.*(warn|error)|chef|bootstrap", re.IGNORECASE)
MAX_DIAGNOSTIC_LINES = 40
#: A kept cluster's expiry is moved on by a run only when that postpones it by more than this.
EXPIRY_REFRESH_MARGIN = dt.timedelta(hours=1)


#: How long an FSx export before delete may take (a large file system writing back to S3).
EXPORT_WAIT_LIMIT_S = 12 * 3600


def export_attempts(delay: int, at_least: int = 40) -> int:
    """Polls of an export task that cover EXPORT_WAIT_LIMIT_S at `delay` seconds apart."""
    return max(at_least, EXPORT_WAIT_LIMIT_S // max(delay, 1))


class ClusterMismatch(ResourceConflict, PcflowInputError):
    """A cluster with this name exists with another configuration: a person decides (another name, the
    cluster deleted, updates allowed), so it is not retried."""


class ClusterNotOwned(ClusterMismatch):
    """A cluster with this name belongs to another stack or run, or was not made by pcflow."""


def _owner_text(stack: str | None, run: str | None) -> str:
    if stack is None:
        return "no pcflow stack (not made by pcflow)"
    return f"stack {stack}" + (f", run {run}" if run else " (shared by its runs)")


def check_owner(name: str, described: Mapping[str, Any], owner: tuple[str | None, str | None]) -> None:
    """A run adopts, updates or deletes only a cluster its stack made, and, for a cluster made for one
    run (run-scoped), only that run's: the cluster's `pcflow:stack` and `pcflow:run` tags must match."""
    tags = describe_tags(described)
    found = (tags.get(TAG_STACK), tags.get(TAG_RUN))
    if found != tuple(owner):
        raise ClusterNotOwned(
            f"cluster {name} belongs to {_owner_text(*found)}, not to {_owner_text(*owner)}: pcflow adopts, "
            "updates or deletes only a cluster made for the same stack (and, for a run's own cluster, the same "
            "run). Nothing was changed; use another cluster name, or delete it from the stack that owns it"
        )


class ClusterCreateFailed(ServiceFailed):
    """Creation failed; the message carries the failure codes, stack events and bootstrap log lines."""


class ClusterBusy(PcflowError):
    """The cluster is in a state that allows no action now (e.g. being deleted)."""


class HostKeyUnavailable(PcflowError):
    """The head node's SSH host key is not (yet) in its console output."""


def default_cluster_name(stack: str, *parts: str) -> str:
    """`pcflow-<stack>-cluster[-parts]`, at most 40 characters (fits the Slurm-accounting limit too)."""
    return resource_name(stack, Component.CLUSTER, *parts, max_len=40)


def describe_tags(described: Mapping[str, Any]) -> dict[str, str]:
    """The cluster's tags from describe-cluster's `[{key, value}]` (ParallelCluster's spelling, not EC2's):
    where ownership, config hash and expiry are read."""
    return {t["key"]: t["value"] for t in described.get("tags") or ()}


def host_key_from_console(text: str) -> str | None:
    """`<type> <base64>` of the preferred key cloud-init printed between the SSH HOST KEY KEYS markers."""
    if HOST_KEYS_BEGIN not in text:
        return None
    block = text.split(HOST_KEYS_BEGIN, 1)[1].split(HOST_KEYS_END, 1)[0]
    keys = {}
    for line in block.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] in HOST_KEY_PREFERENCE:
            keys.setdefault(fields[0], f"{fields[0]} {fields[1]}")
    return next((keys[t] for t in HOST_KEY_PREFERENCE if t in keys), None)


def console_text(ec2: Any, instance_id: str) -> str:
    """The instance's console output; AWS returns base64, some emulators plain text."""
    output = ec2.get_console_output(InstanceId=instance_id).get("Output") or ""
    try:
        decoded = base64.b64decode(output, validate=True).decode(errors="replace")
    except (binascii.Error, ValueError):
        return output
    return decoded


@dataclass(frozen=True)
class EnsureStep:
    """What `ParallelClusterProvider.start` decided: `ready` (adopt now) or `wait` for `waiter` on `stack`."""

    action: str  # created | updating | adopted | refreshed (adopted, expiry moved on) | waiting
    cluster_name: str
    stack_name: str
    waiter: str | None  # stack_create_complete | stack_update_complete | None (ready)
    config_hash: str


class ParallelClusterProvider:
    """ParallelCluster through `ParallelClusterHook`; `clients(service)` gives retrying boto3 clients."""

    name = "parallelcluster"

    def __init__(
        self,
        *,
        hook: ParallelClusterHook,
        clients: Any,
        ssh_conn_id: str = "pcluster_default",
        suppress_validators: Sequence[str] = (),
        require_host_key: bool = True,
    ):
        self.hook = hook
        self.clients = clients
        self.ssh_conn_id = ssh_conn_id
        self.suppress_validators = tuple(suppress_validators)
        self.require_host_key = require_host_key

    # -- validate ---------------------------------------------------------------------------

    def render(
        self,
        spec: ClusterSpec,
        *,
        stack: str,
        run: str | None = None,
        ttl: dt.timedelta | None = None,
        dag_run: tuple[str, str] | None = None,
    ) -> RenderedConfig:
        """Checks every instance type of every queue with EC2 (GPUs, EFA: `NetworkInfo.EfaSupported`) and
        renders the config with the standard tags (`dag_run`: the DAG run making or adopting the cluster,
        named in its tags for the janitor)."""
        tags = standard_tags(stack=stack, component=Component.CLUSTER, run=run, ttl=ttl, dag_run=dag_run)
        return render_config(spec, efa=self.efa_support(spec), tags=tags)

    def efa_support(self, spec: ClusterSpec) -> dict[str, bool]:
        """Each instance type of each queue: whether EC2 says it has EFA (refusing a CPU type for a GPU queue,
        and a type without EFA where the spec asks for it)."""
        ec2 = self.clients("ec2")
        return {
            kind: check_instance_type(ec2, kind, gpus_required=spec.gpus_required, efa=spec.efa)["efa_supported"]
            for kind in spec.all_instance_types
        }

    def job_fabric_env(self, spec: ClusterSpec) -> dict[str, str]:
        """The job environment of the cluster's network (pcflow.cluster.fabric): EFA's settings when every
        queue has EFA (a job may run in any of them), none otherwise."""
        rendered = queues(spec, self.efa_support(spec))
        efa = all(q["efa"] for q in rendered)
        return fabric_env(efa, [t for q in rendered for t in q["instance_types"]])

    def validate(self, spec: ClusterSpec, rendered: RenderedConfig) -> dict[str, Any]:
        """ParallelCluster's own validators, nothing created: `create-cluster --dryrun true`, or for a
        cluster that already exists (a nightly's, kept between runs) what the ensure step will do with
        it: adopt (same config: validated when it was made), update (`update-cluster --dryrun true`),
        or refuse, now rather than after the bake and the data load. A config that differs only by its
        image passes here: the dry run's image is the one the bake starts from, so the image is compared
        by the ensure step, after the bake (a kept stack's bake reuses the image its cluster runs)."""
        self.keep_node_setup(rendered)  # the dry run looks the script up (UrlValidator)
        described = self.hook.describe_cluster(spec.name)
        messages: list[dict[str, Any]] = []
        existing = None
        if described is None:
            answer = self.hook.create_cluster(
                spec.name, rendered.text, dryrun=True, suppress_validators=self.suppress_validators
            )
            messages = answer.get("validationMessages", [])
        else:
            check_owner(spec.name, described, rendered.owner)
            tags = describe_tags(described)
            found_hash = tags.get(TAG_CONFIG_HASH)
            existing = {"status": described.get("clusterStatus"), "config_hash": found_hash}
            if found_hash != rendered.config_hash:
                if tags.get(TAG_SHAPE_HASH) == rendered.shape_hash:
                    existing["image_checked_after_bake"] = True
                else:
                    self.check_update(spec, rendered, described, found_hash)
                    existing["update"] = True
            existing["file_system_ids"] = self.file_system_ids(spec.name)
        for message in messages:
            log.warning("pcluster %s %s: %s", message.get("level"), message.get("type"), message.get("message"))
        return {
            "provider": self.name,
            "cluster_name": spec.name,
            "config_hash": rendered.config_hash,
            "config": rendered.text,
            "validation_messages": messages,
            "suppressed_validators": list(self.suppress_validators),
            "existing": existing,
        }

    # -- ensure -----------------------------------------------------------------------------

    def start(self, spec: ClusterSpec, rendered: RenderedConfig) -> EnsureStep:
        """Describe first; create when absent; refuse a cluster of another stack or run; adopt a matching
        one, refuse (or update) a different one."""
        name = spec.name
        self.keep_node_setup(rendered)  # the nodes read it while they boot
        described = self.hook.describe_cluster(name)
        if described is None:
            answer = self.hook.create_cluster(
                name, rendered.text, rollback_on_failure=False, suppress_validators=self.suppress_validators
            )
            log.info("creating cluster %s: %s", name, (answer.get("cluster") or {}).get("clusterStatus"))
            return EnsureStep("created", name, name, "stack_create_complete", rendered.config_hash)
        check_owner(name, described, rendered.owner)
        status = described.get("clusterStatus", "")
        found_hash = describe_tags(described).get(TAG_CONFIG_HASH)
        if status.startswith("DELETE"):
            raise ClusterBusy(
                f"cluster {name} is {status}: wait for the deletion to finish (or pick another cluster name) and retry"
            )
        if status in FAILED:
            raise ClusterCreateFailed(self.diagnose(name, described))
        if found_hash != rendered.config_hash:
            return self._update_or_refuse(spec, rendered, described, found_hash)
        if status in IN_PROGRESS:
            waiter = "stack_update_complete" if status.startswith("UPDATE") else "stack_create_complete"
            return EnsureStep("waiting", name, name, waiter, rendered.config_hash)
        if self.expiry_outdated(described, rendered):
            self.hook.update_cluster(name, rendered.text, suppress_validators=self.suppress_validators)
            log.info("cluster %s adopted; its pcflow:expires is postponed (a tags-only update)", name)
            return EnsureStep("refreshed", name, name, "stack_update_complete", rendered.config_hash)
        return EnsureStep("adopted", name, name, None, rendered.config_hash)

    def keep_node_setup(self, rendered: RenderedConfig) -> None:
        """The node setup script the config names, in the stack's bucket under the hash of its bytes
        (checked, and put when missing or different): nodes run what this config names, nothing else."""
        if rendered.node_setup is not None and ensure_uploaded(self.clients("s3"), rendered.node_setup):
            log.info("node setup script kept at %s", rendered.node_setup.uri)

    @staticmethod
    def expiry_outdated(described: Mapping[str, Any], rendered: RenderedConfig) -> bool:
        """A kept cluster (a nightly's) lives its TTL past its last run: its expiry tag is moved on when
        this run's is later by more than EXPIRY_REFRESH_MARGIN (so a retry does not update it again).
        ParallelCluster updates Tags in place since 3.15 (only the head node's root volume keeps its
        old tags); the config hash leaves tags out, so this is no config change."""
        wanted = next((t["Value"] for t in rendered.document.get("Tags", []) if t["Key"] == TAG_EXPIRES), None)
        current = describe_tags(described).get(TAG_EXPIRES)
        return wanted is not None and expiry_advances(current, wanted, by=EXPIRY_REFRESH_MARGIN)

    def _update_or_refuse(
        self, spec: ClusterSpec, rendered: RenderedConfig, described: Mapping[str, Any], found_hash: str | None
    ) -> EnsureStep:
        name = spec.name
        self.check_update(spec, rendered, described, found_hash)
        self.hook.update_cluster(name, rendered.text, suppress_validators=self.suppress_validators)
        return EnsureStep("updating", name, name, "stack_update_complete", rendered.config_hash)

    def check_update(
        self, spec: ClusterSpec, rendered: RenderedConfig, described: Mapping[str, Any], found_hash: str | None
    ) -> None:
        """An existing cluster with another config: refused unless the spec allows updates and
        ParallelCluster's `update-cluster --dryrun true` says the change can be made in place."""
        name = spec.name
        if not spec.allow_updates:
            found = found_hash or "none: not made by pcflow"
            raise ClusterMismatch(
                f"cluster {name} exists with another configuration (config hash {found}, this spec "
                f"{rendered.config_hash}). pcflow will not change it: use another cluster name, "
                "delete the cluster, or set allow_updates=true to update it in place when the change allows"
            )
        if described.get("clusterStatus") not in READY:
            raise ClusterBusy(f"cluster {name} is {described.get('clusterStatus')}: it can be updated only when ready")
        try:
            self.hook.update_cluster(name, rendered.text, dryrun=True, suppress_validators=self.suppress_validators)
        except PclusterError as error:
            if not error.pcluster_message.startswith("Request would have succeeded"):
                raise ClusterMismatch(
                    f"cluster {name} has another configuration and ParallelCluster cannot update it in place: "
                    f"{error}. Delete the cluster (or stop its compute fleet if the change needs it) and retry"
                ) from error

    def finish(self, spec: ClusterSpec, step_action: str = "adopted") -> ClusterInfo:
        """After the wait: the cluster is ready, or its failure is diagnosed and raised."""
        name = spec.name
        described = self.hook.describe_cluster(name)
        if described is None:
            raise ClusterCreateFailed(f"cluster {name} disappeared while pcflow waited for it; run the task again")
        status = described.get("clusterStatus", "")
        if status not in READY:
            raise ClusterCreateFailed(self.diagnose(name, described))
        head = described.get("headNode") or {}
        address = head.get("publicIpAddress") or head.get("privateIpAddress")
        host_key = self.head_node_host_key(head.get("instanceId"))
        self.start_fleet_if_stopped(name)
        return ClusterInfo(
            provider=self.name,
            name=name,
            head_node_address=address,
            head_node_host_key=host_key,
            ssh_conn_id=self.ssh_conn_id,
            shared_root=spec.effective_shared_root,
            mounts=tuple(spec.mounts),
            partitions=(Partition(spec.queue_name, "up", spec.max_count, spec.max_count, 0),),
            config_hash=describe_tags(described).get(TAG_CONFIG_HASH),
            status=status,
            adopted=step_action in ("adopted", "refreshed"),
            fabric_env=self.job_fabric_env(spec),
        )

    def start_fleet_if_stopped(self, name: str) -> None:
        """A kept cluster whose compute fleet the janitor stopped (idle queue) is started again before this
        run submits its job: the job then waits, pending, while ParallelCluster brings the queue back up."""
        fleet = self.hook.describe_compute_fleet(name)
        if fleet.get("status") in FLEET_STOPPED:
            answer = self.hook.update_compute_fleet(name, "START_REQUESTED")
            log.info("cluster %s: compute fleet was %s, now %s", name, fleet.get("status"), answer.get("status"))

    def head_node_host_key(self, instance_id: str | None) -> str | None:
        """The head node's host key from its console output; raises HostKeyUnavailable (retried) when required
        and not printed yet: pcflow never trusts a key on first use."""
        key = host_key_from_console(console_text(self.clients("ec2"), instance_id)) if instance_id else None
        if key is None and self.require_host_key:
            raise HostKeyUnavailable(
                f"the head node {instance_id}'s SSH host key is not in its console output yet (cloud-init prints it "
                "between '-----BEGIN SSH HOST KEY KEYS-----' markers a few minutes after boot): retry the task "
                "later; pcflow never trusts a host key on first use"
            )
        return key

    def diagnose(self, name: str, described: Mapping[str, Any]) -> str:
        """ParallelCluster's failure codes, the failed stack events, the head node's bootstrap log lines."""
        stack_status = described.get("cloudFormationStackStatus")
        lines = [f"cluster {name} is {described.get('clusterStatus')} (stack {stack_status})"]
        for failure in described.get("failures") or ():
            lines.append(f"failure {failure.get('failureCode')}: {failure.get('failureReason')}")
        cfn = self.clients("cloudformation")
        try:
            events = cfn.describe_stack_events(StackName=name).get("StackEvents", [])
        except Exception as error:  # the diagnosis must not hide the failure it explains
            events = []
            lines.append(f"(stack events unavailable: {error})")
        for event in events:
            if str(event.get("ResourceStatus", "")).endswith("FAILED"):
                lines.append(
                    f"stack event {event.get('LogicalResourceId')} {event.get('ResourceType')} "
                    f"{event.get('ResourceStatus')}: {event.get('ResourceStatusReason', '')}"
                )
        instance_id = (described.get("headNode") or {}).get("instanceId")
        if instance_id:
            try:
                text = console_text(self.clients("ec2"), instance_id)
            except Exception as error:
                text = ""
                lines.append(f"(head node console output unavailable: {error})")
            bootstrap = [line for line in text.splitlines() if BOOTSTRAP_LOG_RE.search(line)]
            if bootstrap:
                lines.append(f"head node {instance_id} bootstrap log (console output):")
                lines += [f"  {line}" for line in bootstrap[-MAX_DIAGNOSTIC_LINES:]]
        lines.append(
            "The cluster was created with rollback disabled, so its resources are kept for diagnosis: fix the "
            "cause, then delete the cluster (DeleteClusterOperator or `pcluster delete-cluster`) and run again"
        )
        return "\n".join(lines)

    # -- delete -----------------------------------------------------------------------------

    def file_system_ids(self, name: str) -> list[str]:
        """The FSx file systems the cluster's stack created: those an export before delete must cover."""
        cfn = self.clients("cloudformation")
        resources = cfn.describe_stack_resources(StackName=name).get("StackResources", [])
        return [r["PhysicalResourceId"] for r in resources if r.get("ResourceType") == "AWS::FSx::FileSystem"]

    def start_delete(
        self,
        name: str,
        *,
        owner: tuple[str | None, str | None] | None = None,
        export_fsx: bool = False,
        task_key: str | None = None,
        export_delay: int = 15,
    ) -> dict[str, Any]:
        """Export FSx (when asked, waiting here), then `delete-cluster`. Returns what happened and
        whether there is a stack to wait for. With `owner` (stack, run), a cluster of anyone else is
        refused before anything is exported or deleted."""
        from pcflow.aws.storage import EXPORT_BEFORE_DELETE

        described = self.hook.describe_cluster(name)
        if described is not None and owner is not None:
            check_owner(name, described, owner)
        exports = []
        if export_fsx:
            exports = self.export_file_systems(
                name, described, task_key=task_key or f"{name}/{EXPORT_BEFORE_DELETE}", delay=export_delay
            )
        return {**self.delete_described(name, described), "exports": exports}

    def delete_described(self, name: str, described: Mapping[str, Any] | None) -> dict[str, Any]:
        """`delete-cluster` for a cluster just described (None: it does not exist, nothing to delete)."""
        if described is None:
            log.info("cluster %s does not exist: nothing to delete", name)
            return {"cluster_name": name, "deleted": False, "wait": False}
        self.hook.delete_cluster(name)
        return {"cluster_name": name, "deleted": True, "wait": True}

    def start_exports(self, name: str, described: Mapping[str, Any] | None, *, task_key: str) -> list[str]:
        """Start (or adopt: same `task_key`) the export of each of the cluster's FSx file systems to its
        S3 repository; returns the task ids. Nothing to export once the cluster is gone or going."""
        from pcflow.aws.storage import start_data_repository_task

        if described is None or str(described.get("clusterStatus", "")).startswith("DELETE"):
            return []
        fsx = self.clients("fsx")
        task_ids = []
        for fs_id in self.file_system_ids(name):
            task_id = start_data_repository_task(fsx, file_system_id=fs_id, task_type="export", task_key=task_key)
            log.info("exporting FSx %s to S3 before deleting cluster %s (task %s)", fs_id, name, task_id)
            task_ids.append(task_id)
        return task_ids

    def export_file_systems(
        self, name: str, described: Mapping[str, Any] | None, *, task_key: str, delay: int = 15
    ) -> list[dict[str, Any]]:
        """The exports, waited for here (the operator defers instead); a failed export raises, so the
        cluster (and the data only it holds) stays until someone looks."""
        from pcflow.aws.storage import wait_for_data_repository_task
        from pcflow.aws.waits import custom_waiter

        fsx = self.clients("fsx")
        waiter = custom_waiter(fsx, "fsx", "DataRepositoryTaskComplete")
        return [
            wait_for_data_repository_task(fsx, waiter, task_id, delay=delay, max_attempts=export_attempts(delay))
            for task_id in self.start_exports(name, described, task_key=task_key)
        ]
