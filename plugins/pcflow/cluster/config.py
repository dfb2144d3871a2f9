"""Render a ParallelCluster config from a `ClusterSpec`, and the hash that identifies it.

The Jinja template (package data: `templates/<template>.yaml.j2`) emits every value through `tojson`; the result
is parsed back with `yaml.safe_load`, `extra_config` is deep-merged, and the document is dumped with
`yaml.safe_dump`. So user values never become YAML structure, and the text is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import jinja2
import yaml

from pcflow.capacity import strategy_for
from pcflow.cluster.node_setup import NodeSetup, node_setup_for
from pcflow.cluster.spec import ClusterSpec, ClusterSpecError
from pcflow.merge import deep_merge
from pcflow.naming import TAG_RUN, TAG_STACK, digest

DEFAULT_TEMPLATE = "gpu-training.yaml.j2"
TAG_CONFIG_HASH = "pcflow:config-hash"
#: The hash of the config but its image: a dry run, made before the bake with the image the bake starts
#: from, can tell a kept cluster that differs only by its image (the ensure step compares the image after it).
TAG_SHAPE_HASH = "pcflow:shape-hash"
CONFIG_HASH_LEN = 16


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("pcflow.cluster", "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # YAML, not HTML; values are escaped by `tojson`
        keep_trailing_newline=True,
    )


def s3_uri(bucket: str, prefix: str) -> str:
    """`s3://bucket/prefix` without stray slashes (`s3://bucket` for an empty prefix), as FSx's data repository
    paths must be spelled."""
    return f"s3://{bucket}/{prefix.strip('/')}" if prefix.strip("/") else f"s3://{bucket}"


@dataclass(frozen=True)
class RenderedConfig:
    """The config document (YAML text), its parsed form, and the hash of everything but its tags."""

    text: str
    document: dict[str, Any]
    config_hash: str
    shape_hash: str
    #: The script the config's custom actions name, which the cluster stage keeps in the bucket (or None).
    node_setup: NodeSetup | None = None

    @property
    def owner(self) -> tuple[str | None, str | None]:
        """The (stack, run) the cluster is made for: a cluster found under its name must carry the same."""
        tags = {t["Key"]: t["Value"] for t in self.document.get("Tags") or ()}
        return tags.get(TAG_STACK), tags.get(TAG_RUN)


def config_hash(document: Mapping[str, Any]) -> str:
    """Identity of a cluster config: tags are excluded (their expiry label changes on every render)."""
    return digest({k: v for k, v in document.items() if k != "Tags"}, length=CONFIG_HASH_LEN)


def shape_hash(document: Mapping[str, Any]) -> str:
    """The config hash of the document without its image (`Image.CustomAmi`)."""
    image = {k: v for k, v in (document.get("Image") or {}).items() if k != "CustomAmi"}
    return config_hash({**document, "Image": image})


def refuse_replaced(spec: ClusterSpec, document: Mapping[str, Any], node_setup: NodeSetup | None = None) -> None:
    """`extra_config` may add settings, not undo those pcflow renders from the admin's trust settings:
    the permissions boundary, who may SSH to the head node (AllowedIps, pcflow's head group), IMDSv2, and
    the node setup on the head node and every queue (a queue without it would run jobs with IMDS open)."""
    boundary = (document.get("Iam") or {}).get("PermissionsBoundary")
    networking = (document.get("HeadNode") or {}).get("Networking") or {}
    allowed_ips = ((document.get("HeadNode") or {}).get("Ssh") or {}).get("AllowedIps")
    groups, extra = networking.get("SecurityGroups"), networking.get("AdditionalSecurityGroups")
    imds = (document.get("Imds") or {}).get("ImdsSupport")
    checks = [
        (
            "Iam.PermissionsBoundary",
            boundary,
            not spec.permissions_boundary or boundary == spec.permissions_boundary,
            f"the profile's permissions_boundary {spec.permissions_boundary!r}",
        ),
        (
            "HeadNode.Ssh.AllowedIps",
            allowed_ips,
            allowed_ips == spec.ssh_allowed_ips,
            f"the profile's ssh_allowed_ips {spec.ssh_allowed_ips!r} (network.ssh_ingress_cidrs)",
        ),
        ("HeadNode.Networking.SecurityGroups", groups, groups is None, "ParallelCluster's own head security group"),
        (
            "HeadNode.Networking.AdditionalSecurityGroups",
            extra,
            set(spec.head_security_group_ids) <= set(extra or ()),
            f"the network's head security group {list(spec.head_security_group_ids)}",
        ),
        ("Imds.ImdsSupport", imds, imds == "v2.0", "IMDSv2 only (v2.0)"),
        *subnet_checks(spec, document),
        *node_setup_checks(document, node_setup),
    ]
    for path, value, kept, what in checks:
        if not kept:
            raise ClusterSpecError(
                f"extra_config: {path} {value!r} replaces {what}; only the deployment admin sets it, in the profile"
            )


def subnet_checks(spec: ClusterSpec, document: Mapping[str, Any]) -> list[tuple[str, Any, bool, str]]:
    """Each queue's subnets, as rendered: the network's (compute's, or a fallback zone's), never others."""
    ours = {*spec.compute_subnets, *spec.zone_subnet_ids.values()}
    what = "the network's subnets (network.zone_subnet_cidrs for other zones)"
    checks = []
    for index, queue in enumerate((document.get("Scheduling") or {}).get("SlurmQueues") or ()):
        found = ((queue or {}).get("Networking") or {}).get("SubnetIds")
        kept = found is None or (isinstance(found, list) and set(found) <= ours)  # None: ParallelCluster's schema
        checks.append((f"Scheduling.SlurmQueues[{index}].Networking.SubnetIds", found, kept, what))
    return checks


def node_setup_checks(document: Mapping[str, Any], node_setup: NodeSetup | None) -> list[tuple[str, Any, bool, str]]:
    """The node setup's custom action, on the head node and on each queue, as rendered."""
    if node_setup is None:
        return []
    wanted, what = node_setup.custom_action, f"pcflow's node setup {node_setup.uri} (the jobs' account)"
    head = ((document.get("HeadNode") or {}).get("CustomActions") or {}).get("OnNodeConfigured")
    checks = [("HeadNode.CustomActions.OnNodeConfigured", head, head == wanted, what)]
    for index, queue in enumerate((document.get("Scheduling") or {}).get("SlurmQueues") or ()):
        found = ((queue or {}).get("CustomActions") or {}).get("OnNodeConfigured")
        checks.append((f"Scheduling.SlurmQueues[{index}].CustomActions.OnNodeConfigured", found, found == wanted, what))
    return checks


def dataset_keys(spec: ClusterSpec) -> str:
    """What the nodes' roles may read of the dataset bucket (S3Access KeyName): the dataset's prefix, and
    nothing else of the bucket. They write none of it: the worker uploads models and reports (through
    the head node's SSH), and FSx imports and exports with its own role, so a job cannot overwrite
    another run's model or plant files under a prefix FSx imports for other runs."""
    return f"{spec.s3_prefix}/*" if spec.s3_prefix else "*"


def node_iam(spec: ClusterSpec, node_setup: NodeSetup | None) -> dict[str, Any]:
    """The head node's and each queue's `Iam`: read access to the dataset's prefix and the node setup's
    script (nothing else of the bucket, nothing written), and the admin's node policy."""
    iam: dict[str, Any] = {}
    if spec.s3_bucket:
        dataset = {"BucketName": spec.s3_bucket, "KeyName": dataset_keys(spec), "EnableWriteAccess": False}
        iam["S3Access"] = [dataset, *([node_setup.s3_access] if node_setup else [])]
    if node_setup and spec.node_policy:
        iam["AdditionalIamPolicies"] = [{"Policy": spec.node_policy}]
    return iam


def queues(spec: ClusterSpec, efa: bool | Mapping[str, bool]) -> list[dict[str, Any]]:
    """The Slurm queues in the profile's capacity order (pcflow.capacity): the run's own (`queue_name`), then one
    per fallback option (`<queue_name>-2`, ...), each with one compute resource of its instance types, in compute's
    subnets or, for an option naming an availability zone, in the network's subnet of that zone. EFA where
    every type of the queue has it (`efa`: a bool for all, or each type's answer from EC2) and the spec allows;
    a cluster placement group where EFA is on, unless the spec says otherwise (ParallelCluster warns of EFA
    without one); the GPU health check on a GPU queue unless the spec says otherwise."""
    first = {
        "instance_types": [spec.instance_type, *(t for t in spec.instance_types if t != spec.instance_type)],
        "capacity_type": spec.capacity_type,
        "allocation_strategy": strategy_for(spec.capacity_type, spec.allocation_strategy),
        "capacity_reservation_id": spec.capacity_reservation_id,
        "subnet_ids": list(spec.compute_subnets),
    }
    options = [first] + [
        {
            **o.model_dump(exclude={"partition", "availability_zone"}),
            "capacity_type": o.capacity_type.upper(),
            "subnet_ids": list(spec.subnets_for(o)),  # a zone's option: that zone's subnet
        }
        for o in spec.fallback
    ]
    found = []
    for index, option in enumerate(options):
        suffix = f"-{index + 1}" if index else ""
        types = option["instance_types"]
        supported = all(efa.get(t, False) for t in types) if isinstance(efa, Mapping) else efa
        queue_efa = supported if spec.efa is None else spec.efa
        placement = queue_efa if spec.placement_group is None else spec.placement_group
        found.append(
            {
                **option,
                "name": f"{spec.queue_name}{suffix}",
                "compute_resource_name": f"{spec.compute_resource_name}{suffix}",
                "instances": [{"InstanceType": t} for t in types],
                "min_count": spec.min_count if not index else 0,  # no fallback keeps nodes up
                "efa": queue_efa,
                "placement_group": placement,
                "gpu_health_checks": spec.gpus_required if spec.gpu_health_checks is None else spec.gpu_health_checks,
            }
        )
    return found


def render_config(
    spec: ClusterSpec,
    *,
    efa: bool | Mapping[str, bool] = False,
    tags: Mapping[str, str] | None = None,
    template: str = DEFAULT_TEMPLATE,
    node_script: bytes | None = None,
) -> RenderedConfig:
    """The ParallelCluster YAML for `spec`; the spec's own tags, then `tags` (e.g. `naming.standard_tags`)
    and the config-hash tag, go on the cluster's CloudFormation stack and everything in it (`efa`: whether the
    instance types have EFA, one answer for all or each type's, `queues`). pcflow's tags
    come last, so no spec tag replaces them (the spec refuses `pcflow:` keys anyway). `node_script`: the
    node setup's bytes (default: pcflow's, node-setup.sh), whose hash names the object the config runs."""
    data_path = export_path = None
    if spec.fsx is not None and spec.s3_bucket:
        data_path = s3_uri(spec.s3_bucket, spec.s3_prefix)
        export_path = s3_uri(spec.s3_bucket, spec.fsx.export_prefix) if spec.fsx.export_prefix else data_path
    node_setup = node_setup_for(spec, node_script)
    body = (
        _environment()
        .get_template(template)
        .render(
            s=spec,
            queues=queues(spec, efa),
            data_repository_path=data_path,
            export_path=export_path,
            node_iam=node_iam(spec, node_setup),
            node_setup=node_setup,
            tags={},
        )
    )
    document = yaml.safe_load(body)
    if spec.extra_config:
        document = deep_merge(document, spec.extra_config, by_name=True)
        refuse_replaced(spec, document, node_setup)
    digest_value, shape = config_hash(document), shape_hash(document)
    all_tags = {**spec.tags, **dict(tags or {}), TAG_CONFIG_HASH: digest_value, TAG_SHAPE_HASH: shape}
    document["Tags"] = [{"Key": k, "Value": v} for k, v in all_tags.items()]
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
    return RenderedConfig(
        text=text, document=document, config_hash=digest_value, shape_hash=shape, node_setup=node_setup
    )
