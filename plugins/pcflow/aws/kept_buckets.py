"""The buckets pcflow keeps, and how many bytes each stores: what S3 bills for (pcflow.aws.kept prices it).

A bucket listing does not say its size. The cheap way AWS documents is CloudWatch's daily storage metric
(`AWS/S3` `BucketSizeBytes`, dimensions `BucketName` and `StorageType=StandardStorage`, one datapoint a
day, every version and unfinished upload counted); a bucket without a recent datapoint (new, or in an
emulator that publishes none) is measured by listing it, at most MAX_LIST_PAGES pages, and past that
bound its size is a lower bound ("at least"). A shared bucket (pcflow.aws.buckets) is one line per stack
that uses it, each with its share. Every read is bounded; a read refused (another owner's bucket) leaves
the bucket unpriced, saying why, instead of failing the listing.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pcflow.aws.buckets import bucket_tags, bucket_users
from pcflow.aws.clients import error_code
from pcflow.aws.teardown import Resource
from pcflow.naming import TAG_PREFIX, TAG_STACK

log = logging.getLogger(__name__)

MAX_BUCKETS = 200
MAX_STACKS_PER_BUCKET = 100
#: A listing reads at most this many pages of 1,000 objects; a bigger bucket is sized "at least".
MAX_LIST_PAGES = 5
PAGE_SIZE = 1000
#: S3 publishes BucketSizeBytes once a day, up to a day or two late: the newest datapoint this recent counts.
METRIC_DAYS = 3
STORAGE_TYPE = "StandardStorage"


@dataclass(frozen=True)
class StoredBytes:
    """A bucket's size, where it was read (`source`), and whether it is only a lower bound."""

    bytes: int
    source: str
    at_least: bool = False


def metric_bytes(cloudwatch: Any, bucket: str, now: dt.datetime) -> StoredBytes | None:
    """The newest daily `BucketSizeBytes` (S3 Standard) of the last METRIC_DAYS days; None without one."""
    midnight = now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    answer = cloudwatch.get_metric_statistics(
        Namespace="AWS/S3",
        MetricName="BucketSizeBytes",
        Dimensions=[{"Name": "BucketName", "Value": bucket}, {"Name": "StorageType", "Value": STORAGE_TYPE}],
        StartTime=midnight - dt.timedelta(days=METRIC_DAYS),  # periods from midnight UTC, as S3 stamps them
        EndTime=now,
        Period=86400,
        Statistics=["Average"],
        Unit="Bytes",
    )
    points = sorted(answer.get("Datapoints", []), key=lambda point: point["Timestamp"])
    if not points:
        return None
    day = points[-1]["Timestamp"].date().isoformat()
    return StoredBytes(int(points[-1]["Average"]), f"CloudWatch BucketSizeBytes of {day}")


def listed_bytes(s3: Any, bucket: str) -> StoredBytes:
    """The sum of the sizes a listing shows, at most MAX_LIST_PAGES pages (current versions only)."""
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": PAGE_SIZE})
    total = count = 0
    truncated = False
    for read, page in enumerate(pages, start=1):
        objects = page.get("Contents", [])
        total += sum(int(item.get("Size", 0)) for item in objects)
        count += len(objects)
        truncated = bool(page.get("IsTruncated"))
        if read >= MAX_LIST_PAGES:
            break
    if truncated:
        return StoredBytes(total, f"the first {count:,} object(s) listed, no CloudWatch datapoint", at_least=True)
    return StoredBytes(total, f"{count:,} object(s) listed (current versions), no CloudWatch datapoint")


def stored_bytes(s3: Any, cloudwatch: Any, bucket: str, now: dt.datetime) -> StoredBytes:
    """CloudWatch's daily figure when it has one, else the bounded listing."""
    from botocore.exceptions import ClientError

    try:
        measured = metric_bytes(cloudwatch, bucket, now)
    except ClientError as error:  # no CloudWatch read permission: the listing still answers
        log.warning("bucket %s: CloudWatch not read (%s); listing it", bucket, error_code(error))
        measured = None
    return measured or listed_bytes(s3, bucket)


def pcflow_buckets(s3: Any, region: str | None) -> dict[str, dict[str, str]]:
    """The region's buckets with a `pcflow:` tag, by name, with their tags (at most MAX_BUCKETS looked at);
    a bucket whose tags pcflow may not read is not pcflow's."""
    from botocore.exceptions import ClientError

    where = {"BucketRegion": region} if region else {}
    found = {}
    for bucket in s3.list_buckets(MaxBuckets=MAX_BUCKETS, **where).get("Buckets", [])[:MAX_BUCKETS]:
        try:
            tags = bucket_tags(s3, bucket["Name"])
        except ClientError as error:
            log.debug("bucket %s: tags not read (%s): not pcflow's", bucket["Name"], error_code(error))
            continue
        if any(key.startswith(TAG_PREFIX) for key in tags):
            found[bucket["Name"]] = tags
    return found


def kept_buckets(
    clients: Callable[[str], Any], region: str | None, stack: str | None = None, now: dt.datetime | None = None
) -> list[Resource]:
    """pcflow's buckets (of `stack`, or every stack's) as kept resources: one per stack using each (its
    `pcflow:stack`, or the stacks whose marker a shared bucket holds), each with the bucket's size in its
    detail (`Bytes`, `BytesSource`, `AtLeast`; `SizeError` when unread) and `SharedBy` for a shared one."""
    s3, now = clients("s3"), now or dt.datetime.now(dt.UTC)
    resources = []
    for name, tags in pcflow_buckets(s3, region).items():
        users = [tags[TAG_STACK]] if TAG_STACK in tags else bucket_users(s3, name, MAX_STACKS_PER_BUCKET)
        if stack is not None and stack not in users:
            continue
        detail = {**_size_detail(s3, clients, name, now), **({} if TAG_STACK in tags else {"SharedBy": users})}
        for user in [stack] if stack is not None else users or [None]:
            resources.append(Resource("bucket", name, _with_stack(tags, user), "", detail))
    return resources


def _size_detail(s3: Any, clients: Callable[[str], Any], name: str, now: dt.datetime) -> Mapping[str, Any]:
    from botocore.exceptions import ClientError

    try:
        size = stored_bytes(s3, clients("cloudwatch"), name, now)
    except ClientError as error:
        return {"SizeError": f"size not read: {error_code(error)}"}
    return {"Bytes": size.bytes, "BytesSource": size.source, "AtLeast": size.at_least}


def _with_stack(tags: Mapping[str, str], stack: str | None) -> dict[str, str]:
    """A shared bucket's tags as one user stack sees it: that stack's line."""
    return {**tags, TAG_STACK: stack} if stack else dict(tags)
