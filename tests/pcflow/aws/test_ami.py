"""AMI bake against the moto server. Emulated: moto's SSM `send_command` does not run the script
(it reports Success with empty output), and the SSM agent is the local stack's stand-in (a builder
launched with an instance profile is Online); the failing-script test rewrites GetCommandInvocation's
answer in botocore's after-call hook to what SSM returns for a failed script. The bootstrap itself runs,
as aws:runShellScript runs it, in test_ami_bootstrap.py."""

from __future__ import annotations

import uuid

import pytest

from pcflow.aws.ami import (
    AmiSpec,
    BootstrapFailed,
    bake_image,
    delete_image,
    find_base_image,
    prepare_bake,
    recipe_hash,
)
from pcflow.aws.network import ensure_network
from pcflow.aws.network_spec import NetworkSpec

pytestmark = pytest.mark.stack

VERSION = "3.16.1"
SCRIPT = "#!/bin/bash\nset -euo pipefail\ndnf install -y htop\n"


@pytest.fixture(scope="module")
def base_image(aws):
    """A ParallelCluster-named base image (moto's catalogue has none), registered once."""
    name = f"aws-parallelcluster-{VERSION}-alinux2023-hvm-x86_64-{uuid.uuid4().hex[:8]}"
    image_id = aws.ec2.register_image(
        Name=name,
        RootDeviceName="/dev/xvda",
        BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 8}}],
    )["ImageId"]
    yield image_id
    delete_image(aws.ec2, image_id)  # deregistering alone would leave (and bill for) its snapshot


@pytest.fixture(scope="module")
def profile(aws):
    name = f"pcflow-builder-{uuid.uuid4().hex[:8]}"
    aws.iam.create_instance_profile(InstanceProfileName=name)
    yield name
    aws.iam.delete_instance_profile(InstanceProfileName=name)


@pytest.fixture
def spec(aws, stack, base_image, profile):
    ids = ensure_network(aws.ec2, NetworkSpec(stack=stack, region="us-east-1"), waiter_delay=0)

    def make(**overrides) -> AmiSpec:
        values = {
            "stack": stack,
            "region": "us-east-1",
            "pcluster_version": VERSION,
            "bootstrap_script": SCRIPT,
            "instance_profile": profile,
            "subnet_id": ids.head_subnet_id,
            "instance_type": "t3.micro",
            "base_image_id": base_image,
            **overrides,
        }
        return AmiSpec(**values)

    return make


def test_recipe_hash_changes_with_each_input():
    base = recipe_hash("ami-1", SCRIPT, VERSION, {"cuda": "12.4"})
    assert base == recipe_hash("ami-1", SCRIPT, VERSION, {"cuda": "12.4"})
    variants = [
        recipe_hash("ami-2", SCRIPT, VERSION, {"cuda": "12.4"}),
        recipe_hash("ami-1", SCRIPT + "\n", VERSION, {"cuda": "12.4"}),
        recipe_hash("ami-1", SCRIPT, "3.16.0", {"cuda": "12.4"}),
        recipe_hash("ami-1", SCRIPT, VERSION, {"cuda": "12.5"}),
    ]
    assert len({base, *variants}) == 5


def test_bake_then_reuse_and_builder_is_terminated(aws, stack, spec, counts):
    first = bake_image(aws.ec2, aws.ssm, spec(), waiter_delay=0)
    assert first["reused"] is False
    image = aws.ec2.describe_images(ImageIds=[first["image_id"]])["Images"][0]
    tags = {t["Key"]: t["Value"] for t in image["Tags"]}
    assert tags["pcflow:recipe-hash"] == first["recipe_hash"] and tags["pcflow:component"] == "ami"
    assert counts()["instance"] == 0 and counts()["image"] == 1
    builder = aws.ec2.describe_instances(Filters=[{"Name": "tag:pcflow:stack", "Values": [stack]}])["Reservations"][0][
        "Instances"
    ][0]
    assert builder["MetadataOptions"]["HttpTokens"] == "required"
    assert builder["State"]["Name"] == "terminated"
    second = bake_image(aws.ec2, aws.ssm, spec(), waiter_delay=0)
    assert second == {**first, "reused": True}
    assert counts()["image"] == 1
    snapshots = delete_image(aws.ec2, first["image_id"])
    assert snapshots and counts()["image"] == 0 and counts()["snapshot"] == 0
    assert delete_image(aws.ec2, first["image_id"]) == []  # already gone = done


@pytest.mark.parametrize(
    ("operation", "builders"),
    [
        # The failing try never saw the builder's id, yet found it by its tags and terminated it.
        ("ec2.RunInstances", 2),
        ("ssm.SendCommand", 2),  # the failed try terminated its builder; the retry needs a new one
        ("ec2.CreateImage", 1),  # the image exists: the retry adopts it and launches nothing
    ],
)
def test_crash_after_create_then_retry_makes_no_duplicate(aws, stack, spec, counts, operation, builders):  # noqa: PLR0917
    class Crash(Exception):
        pass

    def crash(**_):
        raise Crash(operation)

    client = aws.ssm if operation.startswith("ssm") else aws.ec2
    event = f"after-call.{operation}"
    client.meta.events.register(event, crash)
    try:
        with pytest.raises(Crash):
            bake_image(aws.ec2, aws.ssm, spec(), waiter_delay=0)
    finally:
        client.meta.events.unregister(event, crash)
    result = bake_image(aws.ec2, aws.ssm, spec(), waiter_delay=0)
    after = counts()
    assert after["image"] == 1 and after["instance"] == 0
    launched = aws.ec2.describe_instances(
        Filters=[
            {"Name": "tag:pcflow:recipe-hash", "Values": [result["recipe_hash"]]},
            {"Name": "tag:pcflow:stack", "Values": [stack]},
        ]
    )["Reservations"]
    assert sum(len(r["Instances"]) for r in launched) == builders


def test_failing_bootstrap_fails_with_output_and_terminates_builder(aws, spec, counts):
    def failed(parsed, **_):
        parsed.update(Status="Failed", StatusDetails="Failed", ResponseCode=2)
        parsed.update(StandardOutputContent="installing htop", StandardErrorContent="No match for argument: htop")

    aws.ssm.meta.events.register("after-call.ssm.GetCommandInvocation", failed)
    try:
        with pytest.raises(BootstrapFailed, match="No match for argument: htop") as caught:
            bake_image(aws.ec2, aws.ssm, spec(), waiter_delay=0)
    finally:
        aws.ssm.meta.events.unregister("after-call.ssm.GetCommandInvocation", failed)
    assert "exit code 2" in str(caught.value) and "installing htop" in str(caught.value)
    assert counts()["instance"] == 0 and counts()["image"] == 0


def test_bad_inputs_are_refused_and_nothing_is_launched(aws, spec, counts):
    with pytest.raises(ValueError, match=r"instance type 'p9\.mega' does not exist"):
        bake_image(aws.ec2, aws.ssm, spec(instance_type="p9.mega"), waiter_delay=0)
    with pytest.raises(ValueError, match=r"base image ami-00000000deadbeef0 does not exist"):
        bake_image(aws.ec2, aws.ssm, spec(base_image_id="ami-00000000deadbeef0"), waiter_delay=0)
    with pytest.raises(ValueError, match=r"no ParallelCluster 9\.9\.9 image"):
        bake_image(aws.ec2, aws.ssm, spec(base_image_id=None, pcluster_version="9.9.9"), waiter_delay=0)
    with pytest.raises(ValueError, match="not a ParallelCluster OS"):
        spec(os="windows")
    with pytest.raises(ValueError, match="unknown AWS region"):
        spec(region="mars-east-1")
    assert counts()["instance"] == 0 and counts()["image"] == 0


def test_base_image_is_found_by_version(aws, spec):
    """Its own version: the local stack's stand-in base image has VERSION's name too, and moto dates images
    to the second, so beside an image registered in the same second "the newest" could be either."""
    wanted = spec(base_image_id=None, pcluster_version="3.99.0")
    image_id = aws.ec2.register_image(
        Name=f"aws-parallelcluster-3.99.0-{wanted.os}-hvm-x86_64-{uuid.uuid4().hex[:8]}",
        RootDeviceName="/dev/xvda",
        BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 8}}],
    )["ImageId"]
    try:
        found = find_base_image(
            aws.ec2, region=wanted.region, pcluster_version=wanted.pcluster_version, os=wanted.os, owners=("self",)
        )
    finally:
        delete_image(aws.ec2, image_id)
    assert found == image_id


def test_reusing_the_image_stamps_its_expiry_and_its_snapshots_again(aws, spec):
    """The stack's image lives its TTL past the last run that used it (then the janitor reaps it)."""
    import datetime as dt

    from pcflow.naming import parse_expires

    first = bake_image(aws.ec2, aws.ssm, spec(ttl=dt.timedelta(hours=1)), waiter_delay=0)
    again = bake_image(aws.ec2, aws.ssm, spec(ttl=dt.timedelta(hours=48)), waiter_delay=0)
    assert again == {**first, "reused": True}
    image = aws.ec2.describe_images(ImageIds=[first["image_id"]])["Images"][0]
    snapshot_ids = [m["Ebs"]["SnapshotId"] for m in image["BlockDeviceMappings"] if "Ebs" in m]
    snapshots = aws.ec2.describe_snapshots(SnapshotIds=snapshot_ids)["Snapshots"]
    stamped = {t["Value"] for item in [image, *snapshots] for t in item["Tags"] if t["Key"] == "pcflow:expires"}
    (expires,) = stamped
    assert parse_expires(expires) > dt.datetime.now(dt.UTC) + dt.timedelta(hours=47)
    delete_image(aws.ec2, first["image_id"])


def test_each_try_launches_its_builder_with_its_own_token(aws, spec):
    """EC2 answers a repeated ClientToken with the first instance for at least 24 hours after it ended (moto
    does not keep tokens): a retry after a failed bootstrap must not be handed its terminated builder, while
    a repeat within one try must be answered with the instance it launched."""
    tokens = {
        attempt: prepare_bake(aws.ec2, aws.ssm, spec(), waiter_delay=0, attempt=attempt)[0].client_token
        for attempt in ("manual__1/1", "manual__1/2", "manual__2/1")
    }
    assert len(set(tokens.values())) == 3
    again = prepare_bake(aws.ec2, aws.ssm, spec(), waiter_delay=0, attempt="manual__1/1")[0]
    assert again.client_token == tokens["manual__1/1"] and len(again.client_token) <= 64
