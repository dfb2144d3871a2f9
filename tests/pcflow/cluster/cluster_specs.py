"""The smallest ParallelCluster specs the unit tests render: one base, and that base with what the node
setup needs (its bucket, the job account, the node policy), so each test states only what it varies."""

from __future__ import annotations

BASE = {
    "name": "pcflow-unit",
    "region": "us-east-1",
    "key_name": "k",
    "head_subnet_id": "subnet-0123abcd",
    "ssh_allowed_ips": "203.0.113.0/24",
}
NODE_POLICY = "arn:aws:iam::123456789012:policy/pcflow-cluster-node"
WITH_NODE_SETUP = {
    **BASE,
    "s3_bucket": "my-pcflow-datasets",
    "job_user": "pcflow-job",
    "node_policy": NODE_POLICY,
}
