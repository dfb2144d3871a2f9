"""FSx for Lustre: make a newly loaded S3 prefix visible on a file system that is already linked.

A file system linked to the bucket at cluster creation imports the prefix's metadata then; one that
already exists only sees objects created since its last import once a data repository task
(IMPORT_METADATA_FROM_REPOSITORY) has run. The task itself (deterministic token, adoption, the
deferrable wait) is aws/storage.py's; this module decides whether and what to import.
"""

from __future__ import annotations

from typing import Any

from pcflow.aws.storage import start_data_repository_task


def linked_repository_paths(fsx: Any, file_system_id: str) -> list[str]:
    """S3 paths the file system is linked to: its data repository associations, or the legacy ImportPath."""
    from botocore.exceptions import ClientError

    missing = f"FSx file system {file_system_id!r} not found in this region: check fsx_file_system_id"
    try:
        found = fsx.describe_file_systems(FileSystemIds=[file_system_id])["FileSystems"]
    except ClientError as err:
        if err.response["Error"]["Code"] == "FileSystemNotFound":
            raise ValueError(missing) from err
        raise
    if not found:  # AWS answers FileSystemNotFound; some emulators an empty list
        raise ValueError(missing)
    fs = found[0]
    paths = []
    legacy = fs.get("LustreConfiguration", {}).get("DataRepositoryConfiguration", {}).get("ImportPath")
    if legacy:
        paths.append(legacy)
    else:
        kwargs: dict[str, Any] = {"Filters": [{"Name": "file-system-id", "Values": [file_system_id]}]}
        while True:  # botocore has no paginator for this operation
            page = fsx.describe_data_repository_associations(**kwargs)
            paths += [a["DataRepositoryPath"] for a in page.get("Associations", [])]
            if not page.get("NextToken"):
                break
            kwargs["NextToken"] = page["NextToken"]
    return paths


def covers(repository_path: str, s3_uri: str) -> bool:
    """Whether an S3 path linked to a file system includes `s3_uri` (prefix match on whole segments)."""
    base = repository_path.rstrip("/") + "/"
    return (s3_uri.rstrip("/") + "/").startswith(base)


def start_import(fsx: Any, *, file_system_id: str, s3_uri: str, content_hash: str, tags: dict[str, str]) -> str:
    """Start (or, on a retry, adopt) the import of `s3_uri` at this content; returns the task id."""
    return start_data_repository_task(
        fsx,
        file_system_id=file_system_id,
        task_type="import",
        task_key=f"import {s3_uri} {content_hash}",
        paths=[s3_uri],
        tags=tags,
    )
