"""A capacity fallback in another availability zone (issue 27.3): its queue is rendered in the network's subnet of
that zone, passes the real `pcluster create-cluster --dryrun true` (without a file system ParallelCluster creates:
its ManagedFsxMultiAzValidator refuses one beside compute subnets in two places, and so does pcflow, first), and
when EC2 has no capacity for the type in the network's own zone (the stand-in's `PCFLOW_STANDIN_ICE=<type>@<zone>`)
the train wait moves the pending job on to that zone's queue and says so, with the price."""

from __future__ import annotations

import os

import pytest
import yaml
from taskcontext import deferred_trigger, first_event, make_context

from pcflow.aws.clients import aws_client
from pcflow.capacity import CapacitySettings, capacity_order
from pcflow.cluster.config import render_config
from pcflow.cluster.pcluster import PclusterError
from pcflow.cluster.providers import delete_cluster, ensure_cluster, make_provider, validate_cluster
from pcflow.cluster.spec import ClusterSpec, ClusterSpecError
from pcflow.runspec import load_profile
from pcflow.slurm.operators import SlurmJobOperator

pytestmark = pytest.mark.stack
MOTO_SUPPRESSED_VALIDATORS = tuple(load_profile("aws-gpu-rehearsal")["cluster"]["suppress_validators"])
TYPE = "g5.xlarge"


@pytest.fixture
def other_zone(site):
    """(zone, subnet id): a subnet of the site's VPC in another zone than its own subnet's, as the network
    makes one for each zone of `network.zone_subnet_cidrs`; and the site subnet's own zone."""
    ec2 = aws_client("ec2")
    own = ec2.describe_subnets(SubnetIds=[site.subnet_id])["Subnets"][0]
    zones = ec2.describe_availability_zones()["AvailabilityZones"]
    zone = next(z["ZoneName"] for z in zones if z["ZoneName"] != own["AvailabilityZone"])
    subnet = ec2.create_subnet(VpcId=own["VpcId"], CidrBlock="10.77.16.0/20", AvailabilityZone=zone)["Subnet"]
    yield own["AvailabilityZone"], zone, subnet["SubnetId"]
    ec2.delete_subnet(SubnetId=subnet["SubnetId"])


def zone_spec(site, other_zone, **overrides) -> dict:
    """The run's spot queue in the network's zone, then on-demand there, then on-demand in the other zone."""
    _, zone, subnet = other_zone
    fallback = [
        {"instance_types": [TYPE], "capacity_type": "ondemand"},
        {"instance_types": [TYPE], "capacity_type": "ondemand", "availability_zone": zone},
    ]
    values = {"capacity_type": "SPOT", "fallback": fallback, "zone_subnet_ids": {zone: subnet}, "gpus_required": False}
    return site.spec(**{**values, **overrides})


def spot_run(zone: str) -> dict:
    """capacity_order's settings of a spot run of TYPE on ParallelCluster (queue `gpu`) whose network makes a
    compute subnet in `zone` too (`network.zone_subnet_cidrs`)."""
    return {
        **{"instance_type": TYPE, "capacity_type": "spot", "provider": "parallelcluster"},
        **{"first_partition": "gpu", "zones": [zone]},
    }


def queue_subnets(config: dict) -> dict[str, list[str]]:
    return {q["Name"]: q["Networking"]["SubnetIds"] for q in config["Scheduling"]["SlurmQueues"]}


def test_a_zone_fallback_is_rendered_in_that_zones_subnet_and_passes_the_real_dry_run(pcluster_cli, site, other_zone):
    cli = make_provider(
        "parallelcluster", pcluster_path=str(pcluster_cli), suppress_validators=MOTO_SUPPRESSED_VALIDATORS
    )
    result = validate_cluster(cli, zone_spec(site, other_zone), stack=site.stack)
    assert not [m for m in result["validation_messages"] if m["level"] == "ERROR"], result["validation_messages"]
    subnets = queue_subnets(yaml.safe_load(result["config"]))
    assert subnets == {"gpu": [site.subnet_id], "gpu-2": [site.subnet_id], "gpu-3": [other_zone[2]]}


def test_a_zone_fallback_beside_managed_fsx_is_refused_as_parallelcluster_refuses_it(pcluster_cli, site, other_zone):
    with pytest.raises(ClusterSpecError, match="ManagedFsxMultiAzValidator"):
        ClusterSpec.parse(zone_spec(site, other_zone, fsx={"deployment_type": "SCRATCH_2"}))
    # The same config written by hand (pcflow would not render it): the real dry run's own refusal.
    cli = make_provider(
        "parallelcluster", pcluster_path=str(pcluster_cli), suppress_validators=MOTO_SUPPRESSED_VALIDATORS
    )
    fallback = [{"instance_types": [TYPE], "capacity_type": "ondemand"}]
    spec = site.spec(fsx={"deployment_type": "SCRATCH_2"}, fallback=fallback, gpus_required=False)
    document = render_config(ClusterSpec.parse(spec)).document
    document["Scheduling"]["SlurmQueues"][1]["Networking"]["SubnetIds"] = [other_zone[2]]
    with pytest.raises(PclusterError, match="Managed FSx storage created by ParallelCluster is not supported"):
        cli.hook.create_cluster(
            f"pcflow-{site.unique}", yaml.safe_dump(document), dryrun=True, suppress_validators=cli.suppress_validators
        )


def test_a_zone_the_network_has_no_subnet_in_is_refused(site, other_zone):
    with pytest.raises(ClusterSpecError, match="no subnet of the network"):
        ClusterSpec.parse(zone_spec(site, other_zone, zone_subnet_ids={}))
    fallback = [{"instance_types": [TYPE], "capacity_type": "ondemand", "availability_zone": "us-east-1f"}]
    with pytest.raises(ValueError, match=r"network\.zone_subnet_cidrs"):
        capacity_order(CapacitySettings(fallback=fallback), **spot_run(other_zone[1]))


@pytest.mark.usefixtures("local_stack")
def test_ice_in_the_networks_zone_moves_the_job_to_the_other_zones_queue_and_says_so(
    standin_cli, site, other_zone, monkeypatch, capsys
):
    own_zone, zone, _ = other_zone
    spec = zone_spec(site, other_zone)
    monkeypatch.setenv("PCFLOW_STANDIN_ICE", f"{TYPE}@{own_zone}")  # short in the network's zone only, as EC2 says
    provider = make_provider("parallelcluster", pcluster_path=str(standin_cli))
    capacity = CapacitySettings(fallback=[dict(option) for option in spec["fallback"]])
    order = [option.model_dump(mode="json") for option in capacity_order(capacity, **spot_run(zone))]  # as XCom
    order[-1]["usd_per_node_hour"] = 1.006
    try:
        ensure_cluster(provider, spec, stack=site.stack, waiter_delay=1, waiter_max_attempts=10)
        monkeypatch.delenv("PCFLOW_STANDIN_ICE")
        op = SlurmJobOperator(
            task_id="zone_ice",
            program=["bash", "-c", 'echo "ran in $SLURM_JOB_PARTITION"'],
            allocation={"partition": "gpu", "nodes": 1},
            capacity=order,
            pending_timeout=120,  # a bound on a broken fallback, not a timing assertion
            poll_interval=0.2,
            confirm_interval=1.0,
        )
        context = make_context("zone_ice")
        result = op.execute_complete(context, first_event(deferred_trigger(op, context)))
    finally:
        os.environ.pop("PCFLOW_STANDIN_ICE", None)
        delete_cluster(provider, spec["name"], waiter_delay=1, waiter_max_attempts=10)
    assert result["state"] == "COMPLETED"
    moves = [(m["from"], m["to"], m["availability_zone"]) for m in result["capacity_moves"]]
    assert moves == [("gpu", "gpu-2", None), ("gpu-2", "gpu-3", zone)]  # the same type on-demand: short there too
    said = [line for line in capsys.readouterr().out.splitlines() if "moves the job to partition gpu-3" in line]
    assert said and f"on-demand in {zone} (that zone's subnet) at $1.01 per node-hour" in said[0], said
