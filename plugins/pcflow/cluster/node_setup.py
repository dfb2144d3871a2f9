"""The node setup every ParallelCluster node runs (`node-setup.sh`, package data): the jobs' own account,
the same uid on every node, and the instance metadata service out of its reach (docs/security.md, "What a
job can reach on a ParallelCluster node").

ParallelCluster runs a custom action script from an `s3://` URI, with the node role's read access to it
(it grants none itself: the object goes into the nodes' S3Access). pcflow keeps the script in the stack's
bucket under the hash of its bytes, so the rendered config names exactly one content: a changed script is
a new key, hence a new config hash. The cluster stage puts the object there (`ensure_uploaded`) before the
dry run, which looks it up, and before the cluster is made.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

SCRIPT = "node-setup.sh"
#: Where the scripts live in the stack's bucket: outside every dataset prefix (FSx imports those) and
#: every run's prefix (teardown deletes those); nothing on a node can write there.
KEY_PREFIX = "pcflow/node-setup"
#: The job account's uid and gid where the profile sets none (cluster.config.job_uid): above the OS
#: images' first user (1000) and ParallelCluster's own accounts (400s), below nobody (65534).
DEFAULT_JOB_UID = 2950
#: ParallelCluster's default user of each OS (pcluster.constants.OS_MAPPING): the SSH user pcflow submits
#: with, which reads what jobs write through the job account's group.
DEFAULT_USERS = {
    "alinux2023": "ec2-user",
    "ubuntu2204": "ubuntu",
    "ubuntu2404": "ubuntu",
    "rhel8": "ec2-user",
    "rocky8": "rocky",
    "rhel9": "ec2-user",
    "rocky9": "rocky",
}
#: The most of an object under the script's key that is read to compare it (the script is a few KiB).
MAX_SCRIPT_BYTES = 64 * 1024


@cache
def script_bytes() -> bytes:
    """The node setup script as the wheel ships it (package data), the bytes the nodes will run."""
    return resources.files("pcflow.cluster").joinpath(SCRIPT).read_bytes()


def script_key(script: bytes) -> str:
    """Its key by content: a changed script gets a new key, so a new config hash, never an edited object."""
    return f"{KEY_PREFIX}/{hashlib.sha256(script).hexdigest()}.sh"


@dataclass(frozen=True)
class NodeSetup:
    """The script as one cluster runs it: where it lies, its bytes, and the arguments the config passes."""

    bucket: str
    script: bytes
    job_user: str
    job_uid: int
    control_user: str
    job_accounts: int = 1

    @property
    def key(self) -> str:
        return script_key(self.script)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def custom_action(self) -> dict[str, Any]:
        """ParallelCluster's `CustomActions.OnNodeConfigured` (head node and every queue); the pool's size only
        when there is more than the one account."""
        count = [str(self.job_accounts)] if self.job_accounts > 1 else []
        return {"Script": self.uri, "Args": [self.job_user, str(self.job_uid), self.control_user, *count]}

    @property
    def s3_access(self) -> dict[str, Any]:
        """The nodes' read access to the script, and to nothing else of its prefix."""
        return {"BucketName": self.bucket, "KeyName": self.key, "EnableWriteAccess": False}


def node_setup_for(spec: Any, script: bytes | None = None) -> NodeSetup | None:
    """The node setup of a cluster spec whose jobs run as their own account; None without one."""
    if spec.job_user is None:
        return None
    return NodeSetup(
        bucket=spec.s3_bucket,
        script=script_bytes() if script is None else script,
        job_user=spec.job_user,
        job_uid=spec.job_uid,
        control_user=DEFAULT_USERS[spec.os],
        job_accounts=spec.job_accounts,
    )


def ensure_uploaded(s3: Any, setup: NodeSetup) -> bool:
    """The script's object holds its bytes: looked up first and left alone when it does, put otherwise (also
    over an object of other bytes under its key, which only someone with write access to the bucket could
    have left). Returns whether it was put."""
    try:
        found = s3.get_object(Bucket=setup.bucket, Key=setup.key)["Body"].read(MAX_SCRIPT_BYTES + 1)
    except s3.exceptions.NoSuchKey:
        found = None
    if found == setup.script:
        return False
    s3.put_object(Bucket=setup.bucket, Key=setup.key, Body=setup.script, ContentType="text/x-shellscript")
    return True
