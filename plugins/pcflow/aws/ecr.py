"""An ECR image, pinned: the digest its tag names now, and a short-lived pull token, both from the Airflow
AWS connection's credentials (the registry's own account and region, read from its host name).

The token goes straight into the enroot credentials file the import reads (pcflow.slurm.images); it is
returned, never logged, and masked in case a caller's error message would carry it.
"""

from __future__ import annotations

import base64
from typing import Any

from pcflow.errors import refused


def ecr_image(ref: Any, aws_conn_id: str, *, host_match: Any) -> tuple[str, str]:
    """(digest, enroot credentials line) of `ref` (a registry ImageRef on an ECR host). A tag or
    repository ECR does not know is refused (a retry would find the same)."""
    from pcflow.aws.clients import aws_client

    account, region = host_match["account"], host_match["region"]
    ecr = aws_client("ecr", aws_conn_id=aws_conn_id, region_name=region)
    digest = ref.digest or _digest_of_tag(ecr, account, ref)
    token = ecr.get_authorization_token(registryIds=[account])["authorizationData"][0]["authorizationToken"]
    password = base64.b64decode(token).decode().partition(":")[2]
    try:
        from airflow.sdk.log import mask_secret

        mask_secret(password)
    except ImportError:  # outside Airflow (a test of this module): nothing to mask in
        pass
    return digest, password


def _digest_of_tag(ecr: Any, account: str, ref: Any) -> str:
    """The digest ECR's manifest of the tag has (BatchGetImage: what a pull reads first)."""
    try:
        found = ecr.batch_get_image(registryId=account, repositoryName=ref.repository, imageIds=[{"imageTag": ref.tag}])
    except ecr.exceptions.RepositoryNotFoundException:
        raise refused("training.container", f"ECR has no repository {ref.repository!r} in {account}", _who()) from None
    images = found.get("images") or []
    if not images:
        raise refused("training.container", f"ECR has no image {ref.repository}:{ref.tag} in {account}", _who())
    return images[0]["imageId"]["imageDigest"]


def _who() -> str:
    return "a trigger user may change this where the profile allows it, else the deployment admin"
