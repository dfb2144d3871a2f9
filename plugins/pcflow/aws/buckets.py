"""Buckets pcflow did not make, and buckets stacks share.

Adopting: a bucket that already exists belongs to whoever made it, so pcflow changes none of its
settings. It reads them instead: what pcflow cannot work without is refused with the command that
fixes it (versioning, because a manifest names the object versions it lists; Block Public Access,
because datasets, configs and reports go there); what only costs more or differs in style is reported
(default encryption, object ownership, pcflow's lifecycle rules).

Sharing: the dataset bucket is used by every stack whose profile names it. It carries no
`pcflow:stack` tag (`naming.shared_tags`), so no stack's teardown selects it, and each stack that uses
it leaves a marker object under `USERS_PREFIX` (one key per stack: concurrent runs never race on a
read-modify-write of a tag set). Removing a stack removes its marker; the bucket may go only when no
marker is left and pcflow created it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pcflow.aws.clients import error_code
from pcflow.errors import ResourceConflict
from pcflow.naming import TAG_COMPONENT, TAG_CREATED_BY, validate_stack_name

log = logging.getLogger(__name__)

USERS_PREFIX = "pcflow/stacks/"
PUBLIC_ACCESS_KEYS = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")


@dataclass(frozen=True)
class Difference:
    """One setting of an adopted bucket that is not what pcflow would have set."""

    setting: str
    found: str
    needed: bool  # pcflow refuses the bucket (True) or only reports the difference (False)
    why: str

    def describe(self) -> str:
        """The difference as one line of the refusal or the report: setting, what was found, and why it matters."""
        return f"{self.setting}: {self.found} ({self.why})"


class BucketSettingsDiffer(ResourceConflict):
    """An existing bucket lacks a setting pcflow needs; pcflow does not change another owner's bucket."""


def _get(call: Callable[[], dict[str, Any]], missing: str) -> dict[str, Any] | None:
    """The answer of a GetBucket* call, None when the bucket has no such configuration."""
    from botocore.exceptions import ClientError

    try:
        return call()
    except ClientError as error:
        if error_code(error) == missing:
            return None
        raise


def creation_unfinished(s3: Any, name: str) -> bool:
    """pcflow tags a bucket it creates first and blocks public access last: a tagged bucket without
    Block Public Access is one whose creation a crash interrupted, and it may be finished."""
    block = _get(lambda: s3.get_public_access_block(Bucket=name), "NoSuchPublicAccessBlockConfiguration")
    return block is None and TAG_COMPONENT in bucket_tags(s3, name)


def adoption_differences(
    s3: Any,
    name: str,
    *,
    versioning: bool,
    lifecycle_rules: Sequence[Mapping[str, Any]] = (),
    kms_key_id: str | None = None,
) -> list[Difference]:
    """What an existing bucket has that pcflow would have set otherwise; nothing is changed."""
    found: list[Difference] = []
    block = _get(lambda: s3.get_public_access_block(Bucket=name), "NoSuchPublicAccessBlockConfiguration") or {}
    settings = block.get("PublicAccessBlockConfiguration", {})
    open_keys = [k for k in PUBLIC_ACCESS_KEYS if not settings.get(k)]
    if open_keys:
        found.append(
            Difference(
                "Block Public Access",
                f"off: {', '.join(open_keys)}",
                True,
                "pcflow writes datasets, cluster configs and reports here: turn all four on "
                f"(aws s3api put-public-access-block --bucket {name} --public-access-block-configuration "
                "BlockPublicAcls=true,IgnorePublicAcls=true,BlockPublicPolicy=true,RestrictPublicBuckets=true)",
            )
        )
    status = s3.get_bucket_versioning(Bucket=name).get("Status") or "never enabled"
    if versioning and status != "Enabled":
        found.append(
            Difference(
                "versioning",
                status,
                True,
                "a dataset manifest names the object versions it lists: enable it "
                f"(aws s3api put-bucket-versioning --bucket {name} --versioning-configuration Status=Enabled)",
            )
        )
    found += _reported_differences(s3, name, lifecycle_rules, kms_key_id)
    return found


def _reported_differences(
    s3: Any, name: str, lifecycle_rules: Sequence[Mapping[str, Any]], kms_key_id: str | None
) -> list[Difference]:
    found = []
    encryption = _get(lambda: s3.get_bucket_encryption(Bucket=name), "ServerSideEncryptionConfigurationNotFoundError")
    rules = (encryption or {}).get("ServerSideEncryptionConfiguration", {}).get("Rules", [])
    default = rules[0].get("ApplyServerSideEncryptionByDefault", {}) if rules else {}
    if kms_key_id and default.get("KMSMasterKeyID") != kms_key_id:
        algorithm = default.get("SSEAlgorithm", "S3 default (SSE-S3)")
        found.append(Difference("default encryption", algorithm, False, f"pcflow would use KMS key {kms_key_id}"))
    controls = _get(lambda: s3.get_bucket_ownership_controls(Bucket=name), "OwnershipControlsNotFoundError") or {}
    ownership = [r.get("ObjectOwnership") for r in controls.get("OwnershipControls", {}).get("Rules", [])]
    if ownership != ["BucketOwnerEnforced"]:
        why = "pcflow would set BucketOwnerEnforced (ACLs disabled)"
        found.append(Difference("object ownership", ", ".join(ownership) or "not set", False, why))
    lifecycle = _get(lambda: s3.get_bucket_lifecycle_configuration(Bucket=name), "NoSuchLifecycleConfiguration") or {}
    present = {rule.get("ID") for rule in lifecycle.get("Rules", [])}
    missing = [rule["ID"] for rule in lifecycle_rules if rule["ID"] not in present]
    if missing:
        why = "replaced versions and incomplete uploads are kept: costs more, loses nothing"
        found.append(Difference("lifecycle rules", f"without {', '.join(missing)}", False, why))
    return found


def check_adoptable(s3: Any, name: str, differences: Sequence[Difference]) -> list[str]:
    """Refuse a bucket missing what pcflow needs; log the rest. Returns the differences as text."""
    needed = [d for d in differences if d.needed]
    if needed:
        raise BucketSettingsDiffer(
            f"bucket {name} exists and pcflow does not change the settings of a bucket it did not create; "
            "it needs: " + "; ".join(d.describe() for d in needed)
        )
    for difference in differences:
        log.warning("bucket %s adopted as it is: %s", name, difference.describe())
    return [d.describe() for d in differences]


# --- a bucket shared by stacks ------------------------------------------------------------------


def bucket_users(s3: Any, name: str, limit: int | None = None) -> list[str]:
    """The stacks that use `name` (their markers under USERS_PREFIX), the first `limit` if given."""
    bound = {"PaginationConfig": {"MaxItems": limit}} if limit else {}
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=name, Prefix=USERS_PREFIX, **bound)
    return sorted(obj["Key"].removeprefix(USERS_PREFIX) for page in pages for obj in page.get("Contents", []))


def register_bucket_user(s3: Any, name: str, stack: str) -> None:
    """Record that `stack` uses the bucket; written once (a versioned bucket would keep every rewrite)."""
    from botocore.exceptions import ClientError

    key = USERS_PREFIX + validate_stack_name(stack)
    try:
        s3.head_object(Bucket=name, Key=key)
        return
    except ClientError as error:
        if error_code(error) not in ("404", "NoSuchKey", "NotFound"):
            raise
    body = json.dumps({"stack": stack, "why": "this stack uses the bucket; it goes when its last user is removed"})
    s3.put_object(Bucket=name, Key=key, Body=body.encode(), ContentType="application/json")


def release_bucket(s3: Any, name: str, stack: str) -> bool:
    """`stack` stops using the bucket (its marker goes). True when the bucket may now be deleted: no other
    stack uses it, and pcflow created it (a bucket an admin made is never pcflow's to delete)."""
    s3.delete_object(Bucket=name, Key=USERS_PREFIX + validate_stack_name(stack))
    others = bucket_users(s3, name)
    if others:
        log.info("bucket %s kept: still used by stack(s) %s", name, ", ".join(others))
        return False
    return TAG_CREATED_BY in bucket_tags(s3, name)


def bucket_tags(s3: Any, name: str) -> dict[str, str]:
    """A bucket's tags; a bucket without any is `{}`, not an error (S3 answers NoSuchTagSet)."""
    from botocore.exceptions import ClientError

    try:
        return {t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket=name).get("TagSet", [])}
    except ClientError as error:
        if error_code(error) == "NoSuchTagSet":
            return {}
        raise
