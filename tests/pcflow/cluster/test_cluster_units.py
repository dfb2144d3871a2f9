"""Pure logic: spec validation (bad input), safe rendering, config hash, host-key and sinfo parsing."""

from __future__ import annotations

import pytest
import yaml
from cluster_specs import BASE

from pcflow.cluster.config import TAG_CONFIG_HASH, render_config
from pcflow.cluster.info import ClusterInfo
from pcflow.cluster.parallelcluster import default_cluster_name, host_key_from_console
from pcflow.cluster.spec import ClusterSpec, ClusterSpecError
from pcflow.cluster.static import ClusterUnhealthy, check_health, gpus_in_gres, parse_sinfo


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": "x" * 61}, "at most 60"),
        ({"name": "a" * 41, "slurm_accounting": True}, "at most 40 with Slurm accounting"),
        ({"name": "1cluster"}, "start with a letter"),
        ({"name": "my_cluster"}, "letters, digits and hyphens"),
        ({"name": "bad;rm -rf"}, "letters, digits and hyphens"),
        ({"max_count": 2, "job_nodes": 4}, "max_count 2 is below the job's 4 node(s)"),
        ({"instance_typ": "g5.xlarge"}, "instance_typ"),
        ({"fsx": {"deployment_type": "SCRATCH_2"}}, "fsx needs s3_bucket"),
        ({"fsx": {"deployment_type": "SCRATCH_1"}, "s3_bucket": "b"}, "fsx.deployment_type"),
        ({"fsx": {"storage_capacity_gib": 1300}, "s3_bucket": "b"}, "not a size FSx for Lustre offers"),
        ({"head_subnet_id": "vpc-123"}, "head_subnet_id"),
        ({"compute_subnet_ids": "subnet-0123abcd"}, "must be a list"),
        ({"region": "us-eats-1"}, "unknown AWS region"),
        ({"custom_ami": "ami-XYZ"}, "custom_ami"),
        # ParallelCluster's default AllowedIps is 0.0.0.0/0: never left to it (aws/ssh_ingress.py)
        ({"ssh_allowed_ips": None}, "ssh_allowed_ips is not set: ParallelCluster would open"),
        ({"ssh_allowed_ips": "0.0.0.0/0"}, "set allow_ssh_from_anywhere=True if you really mean it"),
        ({"ssh_allowed_ips": "2001:db8::/32"}, "neither an IPv4 CIDR nor a prefix list id"),
        ({"ssh_allowed_ips": "203.0.113.7/24"}, "neither an IPv4 CIDR"),
        ({"ssh_allowed_ips": "203.0.113.0/24\nKeyName: x"}, "neither an IPv4 CIDR"),
    ],
)
def test_bad_spec_is_refused_with_a_clear_message(overrides, message):
    with pytest.raises(ClusterSpecError) as info:
        ClusterSpec.parse({**BASE, **overrides})
    assert message in str(info.value)


def test_render_keeps_user_values_as_values():
    """A tag value full of YAML syntax stays one string; nothing is spliced into the document."""
    nasty = "a: b\n- c: {d}"
    spec = ClusterSpec.parse({**BASE, "tags": {"team": "x: y = @z"}, "key_name": nasty})
    doc = yaml.safe_load(render_config(spec).text)
    assert doc["HeadNode"]["Ssh"]["KeyName"] == nasty
    assert {"Key": "team", "Value": "x: y = @z"} in doc["Tags"]
    assert set(doc) == {"Region", "Image", "Imds", "HeadNode", "Scheduling", "Tags"}


@pytest.mark.security  # the nodes' S3Access is read-only (issue 24)
def test_render_fsx_variants_and_queue():
    scratch = ClusterSpec.parse(
        {
            **BASE,
            "s3_bucket": "data",
            "s3_prefix": "/sets/x/",
            "fsx": {"export_prefix": "out"},
            "capacity_type": "SPOT",
            "placement_group": True,
            "max_count": 4,
        }
    )
    doc = render_config(scratch, efa=True).document
    queue = doc["Scheduling"]["SlurmQueues"][0]
    assert queue["CapacityType"] == "SPOT"
    assert queue["Networking"] == {"SubnetIds": ["subnet-0123abcd"], "PlacementGroup": {"Enabled": True}}
    assert queue["ComputeResources"][0] == {
        "Name": "gpu",
        "InstanceType": "g5.xlarge",
        "MinCount": 0,
        "MaxCount": 4,
        "Efa": {"Enabled": True},
    }
    lustre = doc["SharedStorage"][0]["FsxLustreSettings"]
    assert lustre["ImportPath"] == "s3://data/sets/x" and lustre["ExportPath"] == "s3://data/out"
    assert doc["HeadNode"]["Imds"] == {"Secured": True} and doc["Imds"] == {"ImdsSupport": "v2.0"}
    # The nodes read the dataset's prefix and write nothing of the bucket (issue 24: jobs wrote anywhere).
    read_only = [{"BucketName": "data", "KeyName": "sets/x/*", "EnableWriteAccess": False}]
    assert doc["HeadNode"]["Iam"]["S3Access"] == read_only and queue["Iam"]["S3Access"] == read_only
    persistent = ClusterSpec.parse({**BASE, "s3_bucket": "data", "fsx": {"deployment_type": "PERSISTENT_2"}})
    lustre2 = render_config(persistent).document["SharedStorage"][0]["FsxLustreSettings"]
    assert "ImportPath" not in lustre2
    assert lustre2["DataRepositoryAssociations"][0]["DataRepositoryPath"] == "s3://data"


def test_config_hash_ignores_tags_but_not_settings():
    spec = ClusterSpec.parse(BASE)
    first = render_config(spec, tags={"pcflow:expires": "2026-01-01T00:00:00Z"})
    second = render_config(spec, tags={"pcflow:expires": "2027-01-01T00:00:00Z"})
    other = render_config(ClusterSpec.parse({**BASE, "max_count": 3}))
    assert first.config_hash == second.config_hash != other.config_hash
    assert {"Key": TAG_CONFIG_HASH, "Value": first.config_hash} in first.document["Tags"]


def test_extra_config_is_deep_merged():
    spec = ClusterSpec.parse(
        {**BASE, "extra_config": {"Scheduling": {"SlurmSettings": {"QueueUpdateStrategy": "DRAIN"}}}}
    )
    settings = render_config(spec).document["Scheduling"]["SlurmSettings"]
    assert settings == {"ScaledownIdletime": 10, "QueueUpdateStrategy": "DRAIN"}


def test_default_cluster_name_fits_pcluster_limits():
    name = default_cluster_name("a-very-long-stack-name12", "some", "more", "parts")
    assert len(name) <= 40
    ClusterSpec.parse({**BASE, "name": name, "slurm_accounting": True})


CONSOLE = """[   10.1] cloud-init[900]: Cloud-init v. 23.1 running 'modules:final'
-----BEGIN SSH HOST KEY KEYS-----
ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAI root@ip-10-0-0-5
ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOChhNVz root@ip-10-0-0-5
-----END SSH HOST KEY KEYS-----
"""


def test_host_key_from_console_output_prefers_ed25519():
    assert host_key_from_console(CONSOLE) == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOChhNVz"
    assert host_key_from_console("Linux version 2.6.16-xenU\n") is None


SINFO = """node1|gpu|up|idle|gpu:a10g:4(S:0)
node2|gpu|up|drained|gpu:a10g:4(S:0)
node3|gpu|up|idle~|gpu:a10g:4
node4|gpu|up|down*|gpu:a10g:4
node1|cpu|up|mixed|(null)
"""


def test_parse_sinfo_counts_usable_nodes_and_gpus():
    gpu, cpu = parse_sinfo(SINFO)
    assert (gpu.name, gpu.nodes, gpu.usable_nodes, gpu.gpus_per_node) == ("gpu", 4, 2, 4)
    assert gpu.node_states == {"idle": 1, "drained": 1, "idle~": 1, "down*": 1}
    assert (cpu.usable_nodes, cpu.gpus_per_node) == (1, 0)
    assert gpus_in_gres("gpu:8,shard:2") == 8 and gpus_in_gres("(null)") == 0


def test_health_verdicts():
    partitions = parse_sinfo(SINFO)
    assert [p.name for p in check_health(partitions, gpus_required=True)] == ["gpu"]
    with pytest.raises(ClusterUnhealthy, match="GPUs are required"):
        check_health(partitions, partition="cpu", gpus_required=True)
    with pytest.raises(ClusterUnhealthy, match="usable node"):
        check_health(parse_sinfo("n|p|up|drained|(null)\nm|p|up|down|(null)\n"))
    with pytest.raises(ClusterUnhealthy, match="no partition is up"):
        check_health(parse_sinfo("n|p|down|idle|(null)\n"))
    with pytest.raises(ClusterUnhealthy, match="does not exist"):
        check_health(partitions, partition="nope")


def test_cluster_info_round_trips_through_xcom():
    info = ClusterInfo(
        "static",
        "c",
        "127.0.0.1",
        "ssh-ed25519 AAAA",
        "slurm_default",
        "/shared",
        ("/shared",),
        tuple(parse_sinfo(SINFO)),
    )
    assert ClusterInfo.from_xcom(info.to_xcom()) == info


def test_extra_config_merges_queues_by_name_and_keeps_those_pcflow_renders():
    extra = {"Scheduling": {"SlurmQueues": [{"Name": "gpu", "JobExclusiveAllocation": True}, {"Name": "cpu"}]}}
    spec = ClusterSpec.parse({**BASE, "extra_config": extra})
    first, added = render_config(spec).document["Scheduling"]["SlurmQueues"]
    assert first["Name"] == "gpu" and first["JobExclusiveAllocation"] is True
    assert first["ComputeResources"][0]["InstanceType"] == "g5.xlarge"  # what pcflow rendered stays
    assert added == {"Name": "cpu"}
