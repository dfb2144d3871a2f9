"""Fixtures of the cluster stage: a network + stand-in AMI + key pair + bucket on moto. (The real pcluster
CLI and the local stack's stand-in CLI are tests/conftest.py's `pcluster_cli` and `standin_cli`.)"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import pytest
from dagrun import delete_bucket

from pcflow.aws.ami import delete_image
from pcflow.aws.clients import aws_client

SSH_FROM = "203.0.113.0/24"  # where the Airflow workers connect from (a documentation range)


@dataclass(frozen=True)
class MotoSite:
    """What a cluster config references, made on the moto server with unique names."""

    unique: str
    stack: str
    subnet_id: str
    security_group_id: str  # stands for the network stage's head group (SSH from its CIDRs)
    key_name: str
    ami_id: str
    bucket: str

    def spec(self, **overrides) -> dict:
        values = {
            "name": f"pcflow-{self.unique}",
            "region": "us-east-1",
            "key_name": self.key_name,
            "head_subnet_id": self.subnet_id,
            "head_security_group_ids": [self.security_group_id],
            "ssh_allowed_ips": SSH_FROM,
            "custom_ami": self.ami_id,
            "instance_type": "g5.xlarge",
            "s3_bucket": self.bucket,
            "s3_prefix": "datasets/digits",
        }
        return {**values, **overrides}


@pytest.fixture
def site(local_stack) -> MotoSite:
    os.environ.setdefault("AIRFLOW_HOME", "/tmp/afhome-cluster")
    unique = uuid.uuid4().hex[:10]
    ec2, s3 = aws_client("ec2"), aws_client("s3")
    vpc = ec2.create_vpc(CidrBlock="10.77.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.77.0.0/20")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName=f"pcflow-head-{unique}", Description="head", VpcId=vpc)["GroupId"]
    ec2.create_key_pair(KeyName=f"pcflow-{unique}")
    # Stand-in for the baked ParallelCluster AMI (the real base AMI does not exist in moto).
    builder = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    ami = ec2.create_image(InstanceId=builder, Name=f"pcflow-standin-ami-{unique}")["ImageId"]
    ec2.terminate_instances(InstanceIds=[builder])
    s3.create_bucket(Bucket=f"pcflow-{unique}")
    yield MotoSite(unique, f"t{unique}", subnet, group, f"pcflow-{unique}", ami, f"pcflow-{unique}")
    delete_bucket(s3, f"pcflow-{unique}")
    delete_image(ec2, ami)  # with its snapshot: deregistering alone leaks it
    ec2.delete_key_pair(KeyName=f"pcflow-{unique}")
    ec2.delete_security_group(GroupId=group)
    ec2.delete_subnet(SubnetId=subnet)
    ec2.delete_vpc(VpcId=vpc)
