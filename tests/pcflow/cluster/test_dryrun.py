"""The REAL pcluster CLI (3.16.1, own venv) validates rendered configs with `--dryrun true` against the
moto server over HTTPS. Suppressed, because moto lacks what they call (and only those): the validators
the rehearsal profile suppresses (include/profiles/aws-gpu-rehearsal.yaml says which and why)."""

from __future__ import annotations

import hashlib

import pytest
import yaml
from taskcontext import make_context

from pcflow.aws.clients import aws_client as clients
from pcflow.capacity import CapacitySettings
from pcflow.cluster.operators import ValidateClusterConfigOperator
from pcflow.cluster.pcluster import PclusterError
from pcflow.cluster.providers import make_provider, validate_cluster
from pcflow.cluster.spec import ClusterSpecError
from pcflow.pipeline.settings import cluster_capacity
from pcflow.runspec import load_profile

pytestmark = pytest.mark.stack
BOUNDARY = "arn:aws:iam::123456789012:policy/pcflow-cluster-boundary"
NODE_POLICY = "arn:aws:iam::123456789012:policy/pcflow-cluster-node"  # the stack seeds it too
MOTO_SUPPRESSED_VALIDATORS = tuple(load_profile("aws-gpu-rehearsal")["cluster"]["suppress_validators"])


def provider(cli, **kw):
    return make_provider(
        "parallelcluster", pcluster_path=str(cli), suppress_validators=MOTO_SUPPRESSED_VALIDATORS, **kw
    )


@pytest.mark.parametrize("fsx", [None, {"deployment_type": "SCRATCH_2"}, {"deployment_type": "PERSISTENT_2"}])
def test_rendered_templates_pass_the_real_dry_run(pcluster_cli, site, fsx):
    """With the permissions boundary aws-gpu.yaml names (the stack seeds it; pcluster checks it exists)."""
    spec = site.spec(fsx=fsx, placement_group=True, permissions_boundary=BOUNDARY)
    result = validate_cluster(provider(pcluster_cli), spec, stack=site.stack)
    assert result["cluster_name"] == f"pcflow-{site.unique}"
    types = {m["type"] for m in result["validation_messages"]}
    assert "CustomAmiTagValidator" in types  # a real validator ran and looked at the stand-in AMI
    assert not [m for m in result["validation_messages"] if m["level"] == "ERROR"]
    assert yaml.safe_load(result["config"])["Image"]["CustomAmi"] == site.ami_id
    assert yaml.safe_load(result["config"])["Iam"] == {"PermissionsBoundary": BOUNDARY}
    head = yaml.safe_load(result["config"])["HeadNode"]  # SSH: the profile's CIDR and pcflow's head group
    assert head["Ssh"]["AllowedIps"] == spec["ssh_allowed_ips"] == "203.0.113.0/24"
    assert head["Networking"]["AdditionalSecurityGroups"] == [site.security_group_id]
    stacks = clients("cloudformation").list_stacks()["StackSummaries"]
    assert all(s["StackName"] != result["cluster_name"] for s in stacks)  # nothing was created


def test_config_the_schema_rejects_fails_with_pclusters_message(pcluster_cli, site):
    spec = site.spec(extra_config={"HeadNode": {"NoSuchSetting": 1}})
    with pytest.raises(PclusterError) as info:
        validate_cluster(provider(pcluster_cli), spec, stack=site.stack)
    assert "NoSuchSetting" in str(info.value)


def test_wrong_subnet_and_missing_bucket_fail_in_seconds(pcluster_cli, site):
    with pytest.raises(PclusterError, match="subnet-0123456789abcdef0"):
        validate_cluster(provider(pcluster_cli), site.spec(head_subnet_id="subnet-0123456789abcdef0"), stack=site.stack)
    with pytest.raises(PclusterError, match=r"S3BucketUriValidator|bucket"):
        validate_cluster(
            provider(pcluster_cli),
            site.spec(s3_bucket=f"missing-{site.unique}", fsx={"deployment_type": "SCRATCH_2"}),
            stack=site.stack,
        )


def test_cpu_instance_type_for_gpu_queue_is_refused_before_pcluster(site, tmp_path):
    """EC2 DescribeInstanceTypes (moto) says c5.xlarge has no GPUs; the CLI path is bogus on purpose:
    the refusal happens before it would be needed."""
    bogus = make_provider("parallelcluster", pcluster_path=str(tmp_path / "absent"))
    with pytest.raises(ClusterSpecError, match="has no GPUs"):
        validate_cluster(bogus, site.spec(instance_type="c5.xlarge"), stack=site.stack)
    with pytest.raises(ClusterSpecError, match="does not exist in this region"):
        validate_cluster(bogus, site.spec(instance_type="p3.8xlarge"), stack=site.stack)


def test_validate_operator_keeps_the_rendered_config_in_s3_and_xcom(pcluster_cli, site):
    op = ValidateClusterConfigOperator(
        task_id="validate_cluster",
        provider="parallelcluster",
        cluster=site.spec(),
        stack=site.stack,
        pcluster_path=str(pcluster_cli),
        suppress_validators=MOTO_SUPPRESSED_VALIDATORS,
        run_scoped=True,
        config_bucket=site.bucket,
    )
    result = op.execute(make_context("validate_cluster"))
    bucket, key = result["config_s3_uri"].removeprefix("s3://").split("/", 1)
    stored = clients("s3").get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    assert stored == result["config"]
    tags = {t["Key"]: t["Value"] for t in yaml.safe_load(stored)["Tags"]}
    assert tags["pcflow:stack"] == site.stack and tags["pcflow:component"] == "cluster" and "pcflow:run" in tags
    clients("s3").delete_object(Bucket=bucket, Key=key)


def test_the_node_setup_passes_the_real_dry_run_which_looks_its_script_up(pcluster_cli, site):
    """A job account: the config's custom actions (head node and queue), the node policy and the nodes'
    S3Access pass ParallelCluster's schema and validators. The cluster stage kept the script in the bucket
    first, under the key the config names: the dry run's UrlValidator (a HeadObject) found it, where the
    same config before the upload is warned about."""
    from pcflow.cluster.config import render_config
    from pcflow.cluster.spec import ClusterSpec

    spec = site.spec(job_user="pcflow-job", node_policy=NODE_POLICY, permissions_boundary=BOUNDARY)
    cli = provider(pcluster_cli)
    rendered = render_config(ClusterSpec.parse(spec))
    setup = rendered.node_setup
    before = cli.hook.create_cluster(
        spec["name"], rendered.text, dryrun=True, suppress_validators=cli.suppress_validators
    )
    assert [m for m in before.get("validationMessages", []) if setup.key in m["message"]], before
    result = validate_cluster(cli, spec, stack=site.stack)
    assert not [m for m in result["validation_messages"] if m["level"] == "ERROR"], result["validation_messages"]
    assert not [m for m in result["validation_messages"] if setup.key in m["message"]], result["validation_messages"]
    stored = clients("s3").get_object(Bucket=site.bucket, Key=setup.key)["Body"].read()
    assert stored == setup.script and hashlib.sha256(stored).hexdigest() in setup.key
    config = yaml.safe_load(result["config"])
    for node in (config["HeadNode"], *config["Scheduling"]["SlurmQueues"]):
        assert node["CustomActions"]["OnNodeConfigured"]["Script"] == setup.uri
        assert node["Iam"]["AdditionalIamPolicies"] == [{"Policy": NODE_POLICY}]


def test_flexible_types_fallback_queues_efa_and_health_checks_pass_the_real_dry_run(pcluster_cli, site):
    """aws-gpu's capacity section (issue 27.3/27.5) as the pipeline hands it to the cluster: a spot queue of
    g5.12xlarge and g6.12xlarge (flexible instance types, price-capacity-optimized), an on-demand fallback queue,
    EFA and a placement group on both (EC2 says both types have EFA), GPU health checks. ParallelCluster's own
    validators judge it (InstancesAcceleratorsValidator, InstancesEFAValidator, EfaPlacementGroupValidator,
    InstancesAllocationStrategyValidator...); only the rehearsal's moto-suppressed ones are skipped."""
    capacity = CapacitySettings.model_validate(load_profile("aws-gpu")["capacity"])
    spec = site.spec(instance_type="g5.12xlarge", capacity_type="SPOT", **cluster_capacity(capacity))
    result = validate_cluster(provider(pcluster_cli), spec, stack=site.stack)
    assert not [m for m in result["validation_messages"] if m["level"] == "ERROR"], result["validation_messages"]
    spot, ondemand = yaml.safe_load(result["config"])["Scheduling"]["SlurmQueues"]
    assert (spot["Name"], spot["CapacityType"], spot["AllocationStrategy"]) == (
        "gpu",
        "SPOT",
        "price-capacity-optimized",
    )
    assert spot["ComputeResources"][0]["Instances"] == [
        {"InstanceType": "g5.12xlarge"},
        {"InstanceType": "g6.12xlarge"},
    ]
    assert (ondemand["Name"], ondemand["CapacityType"]) == ("gpu-2", "ONDEMAND")
    for queue in (spot, ondemand):
        assert queue["ComputeResources"][0]["Efa"] == {"Enabled": True}
        assert queue["Networking"]["PlacementGroup"] == {"Enabled": True}
        assert queue["HealthChecks"] == {"Gpu": {"Enabled": True}}
