"""The account preflight against the moto server: each check passes on a ready account and, made to fail
once, says what to do, with nothing created. The pcluster CLI is the stand-in (it answers `version` as
pcluster does).

Emulated: moto's Service Quotas knows only VPC quotas (GetServiceQuota answers NoSuchResourceException
for every EC2 quota, GetAWSDefaultServiceQuota is not implemented), so the quota answers are seeded in
AWS's documented GetServiceQuota shape through botocore's Stubber on that one client; every other
question goes to the moto server, whose EC2 instance type offerings are AWS's per-zone data."""

from __future__ import annotations

import functools
import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from run_factories import make_planned_run

from pcflow.aws.clients import aws_client as new_client
from pcflow.merge import deep_merge
from pcflow.patterns import PREFLIGHT_CHECKS
from pcflow.pipeline import planned_cluster
from pcflow.preflight import CHECKS, Account, PreflightFailed, quota_family, run_preflight

pytestmark = pytest.mark.stack
aws_client = functools.cache(new_client)  # one client per service for the module (each costs a session)

#: aws-gpu at its maximum size: 2 x g5.12xlarge (48 vCPUs each) on spot, a c5.2xlarge head node (8).
QUOTAS = {"L-3819A6DF": 96.0, "L-1216C47A": 8.0}


def seeded_quotas(values: dict[str, float]) -> Any:
    """A Service Quotas client answering GetServiceQuota as AWS documents it, for the codes given."""
    client = new_client("service-quotas")
    stubber = Stubber(client)
    for code, value in values.items():
        quota = {"ServiceCode": "ec2", "QuotaCode": code, "QuotaName": code, "Value": value, "Unit": "None"}
        stubber.add_response("get_service_quota", {"Quota": quota}, {"ServiceCode": "ec2", "QuotaCode": code})
    stubber.activate()
    return client


@pytest.fixture
def account(local_stack, standin_cli):
    """`make(**overrides)`: the aws-gpu run as validate resolves it, against a ready account (its key
    pair imported, the stack's builder profile seeded, quotas seeded); removes the key pair after."""
    key_name = f"pcflow-{uuid.uuid4().hex[:8]}"
    ec2 = aws_client("ec2")
    ec2.create_key_pair(KeyName=key_name)

    def make(quotas: dict[str, float] = QUOTAS, pcluster: str | None = str(standin_cli), **overrides) -> Account:
        # aws-gpu ships no SSH sources: the admin's to set (a documentation range here)
        base = {"network": {"ssh_ingress_cidrs": ["203.0.113.0/24"]}, "cluster": {"config": {"key_name": key_name}}}
        run = make_planned_run("aws-gpu", **deep_merge(base, overrides))
        clients = {"service-quotas": seeded_quotas(quotas)}
        return Account(run, planned_cluster(run), lambda s: clients.get(s) or aws_client(s), pcluster_path=pcluster)

    yield make
    ec2.delete_key_pair(KeyName=key_name)


def inventory() -> dict[str, int]:
    """What a preflight must never create, counted on the moto server."""
    ec2, iam = aws_client("ec2"), aws_client("iam")
    return {
        "vpcs": len(ec2.describe_vpcs()["Vpcs"]),
        "instances": sum(len(r["Instances"]) for r in ec2.describe_instances()["Reservations"]),
        "key pairs": len(ec2.describe_key_pairs()["KeyPairs"]),
        "instance profiles": len(iam.list_instance_profiles()["InstanceProfiles"]),
    }


def fails_with(account: Account, check: str, *phrases: str) -> None:
    before = inventory()
    with pytest.raises(PreflightFailed) as failed:
        run_preflight(account)
    message = str(failed.value)
    assert message.startswith("account preflight failed, nothing was created:")
    (line,) = [line.strip() for line in message.splitlines()[1:]]  # this check, and only it, failed
    assert line.startswith(f"{check}: ")
    for phrase in phrases:
        assert phrase in line, line
    assert inventory() == before


def test_moto_cannot_answer_ec2_vcpu_quotas(local_stack):
    """Why the quota answers are seeded: this test fails the day moto learns them."""
    quotas = new_client("service-quotas", botocore_config={"retries": {"total_max_attempts": 1}})
    with pytest.raises(ClientError) as applied:
        quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-DB2E81BA")
    assert applied.value.response["Error"]["Code"] == "NoSuchResourceException"
    with pytest.raises(ClientError):
        quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode="L-DB2E81BA")


def test_a_ready_account_passes_every_check(account):
    ready = account()
    assert ready.zone == "us-east-1a"  # what the network stage will choose: the region's first zone
    assert run_preflight(ready) == list(CHECKS)


def test_missing_key_pair(account):
    fails_with(
        account(cluster={"config": {"key_name": "nobody-made-this"}}),
        "key_pair",
        "the key pair 'nobody-made-this' does not exist in us-east-1",
        "aws ec2 import-key-pair",
    )


def test_instance_type_not_offered_in_the_networks_zone(account):
    """p4d.24xlarge is offered in us-east-1a-d, the head node's and builder's types in 1f too (AWS's
    offerings data, as moto serves it)."""
    needs = {"L-7212CCBC": 192.0, "L-1216C47A": 8.0}
    fails_with(
        account(
            quotas=needs,
            instance_type="p4d.24xlarge",
            network={"availability_zone": "us-east-1f"},
            training={"tasks_per_node": 8, "gpus_per_node": 8},
        ),
        "instance_types_offered",
        "compute p4d.24xlarge: not offered in us-east-1f, the zone the run's network uses",
        "set network.availability_zone to one of us-east-1a, us-east-1b, us-east-1c, us-east-1d",
    )


def test_a_fallback_zone_that_does_not_offer_its_type(account):
    """A capacity fallback in another zone (no managed FSx beside it: ParallelCluster refuses that): p4d.24xlarge
    is not offered in us-east-1f, g5.12xlarge is."""

    def fallback(kind: str) -> list[dict]:
        return [{"instance_types": [kind], "capacity_type": "ondemand", "availability_zone": "us-east-1f"}]

    zoned = {"network": {"zone_subnet_cidrs": {"us-east-1f": "10.60.32.0/20"}}, "cluster": {"config": {"fsx": None}}}
    assert run_preflight(account(capacity={"fallback": fallback("g5.12xlarge")}, **zoned)) == list(CHECKS)
    fails_with(
        account(capacity={"fallback": fallback("p4d.24xlarge")}, **zoned),
        "instance_types_offered",
        "capacity fallback p4d.24xlarge in us-east-1f: not offered in the zone the option names",
    )


def test_vcpu_quota_below_the_cluster_at_its_maximum_size(account):
    fails_with(
        account(quotas={"L-3819A6DF": 48.0, "L-1216C47A": 8.0}),
        "vcpu_quota",
        "needs 96 vCPUs of 'All G and VT Spot Instance Requests' (L-3819A6DF) in us-east-1, the account's quota is 48",
        "--quota-code L-3819A6DF --desired-value 96",
        "lower cluster.config.max_count",
    )


def test_missing_builder_instance_profile(account):
    fails_with(
        account(ami={"instance_profile": "no-such-profile"}),
        "builder_instance_profile",
        "the AMI builder's instance profile 'no-such-profile' does not exist",
        "AmazonSSMManagedInstanceCore",
    )


def test_builder_instance_profile_without_a_role(account):
    iam = aws_client("iam")
    name = f"pcflow-empty-{uuid.uuid4().hex[:8]}"
    iam.create_instance_profile(InstanceProfileName=name)
    try:
        fails_with(account(ami={"instance_profile": name}), "builder_instance_profile", "has no role")
    finally:
        iam.delete_instance_profile(InstanceProfileName=name)


def test_pcluster_cli_missing(account, tmp_path):
    fails_with(
        account(pcluster=str(tmp_path / "pcluster")), "pcluster_cli", "no pcluster CLI at", "install-pcluster.sh"
    )


def test_node_missing(account, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # the stand-in CLI starts by absolute paths; node is not found
    fails_with(account(), "pcluster_cli", "Node.js is not on the PATH", "install Node.js >= 14")


def test_static_cluster_runs_only_the_checks_that_apply(local_stack):
    """The local profile: no key pair, quota or CLI to check; the builder's type and profile are."""
    run = make_planned_run("local")
    assert planned_cluster(run) is None
    checked = run_preflight(Account(run, None, aws_client))
    assert checked == list(CHECKS)


def test_instance_families_map_to_their_vcpu_quotas():
    expected = {
        "g5.12xlarge": "g",
        "vt1.3xlarge": "g",
        "p4d.24xlarge": "p",
        "c5.2xlarge": "standard",
        "im4gn.large": "standard",
        "inf2.xlarge": "inf",
        "trn1.32xlarge": "trn",
        "dl1.24xlarge": "dl",
        "hpc7g.16xlarge": "hpc",
        "x2idn.16xlarge": "x",
        "mac2.metal": None,
        "u-6tb1.metal": None,
    }
    assert {t: quota_family(t) for t in expected} == expected


def test_each_check_goes_by_its_function_s_name_the_one_a_profile_skips():
    """The names a profile's `preflight.skip` may list live in `patterns` (the run spec checks them without
    importing the checks); each names its check's function, so a renamed check cannot drift from them."""
    assert tuple(CHECKS) == PREFLIGHT_CHECKS
    assert [check.__name__ for check in CHECKS.values()] == list(PREFLIGHT_CHECKS)
