"""Put a loaded partition where the cluster's jobs read it.

On ParallelCluster, FSx for Lustre is linked to the dataset's S3 prefix and loads files lazily, so
the data is already at `<mount>/<partition>/`. A static cluster has no such link: pcflow copies the
objects the partition's manifest lists (and only those: a half-loaded partition is never read) into
the cluster's shared directory over SFTP, skipping files already there with the same size.
"""

from __future__ import annotations

import posixpath
from typing import Any

from pcflow.dataset.manifest import read_manifest
from pcflow.slurm.hook import SlurmHook


def data_dir_on_cluster(run: dict[str, Any], cluster: dict[str, Any], dataset: dict[str, Any]) -> str:
    """The partition's directory as the compute nodes see it."""
    partition = dataset["partition"]
    if cluster["provider"] == "parallelcluster":
        mount = (cluster.get("mounts") or ["/fsx"])[0]
        return posixpath.join(mount, partition)
    if not cluster.get("shared_root"):
        raise ValueError("the static cluster has no shared_root: set the SSH connection's `shared_root` extra")
    return posixpath.join(cluster["shared_root"], "pcflow", "datasets", dataset["bucket"], dataset["root"].rstrip("/"))


def copy_partition(s3: Any, hook: SlurmHook, *, bucket: str, root: str, dest: str, log: Any) -> dict[str, int]:
    """Copy the manifest's objects under `dest`; returns counts of copied and skipped files."""
    manifest = read_manifest(s3, bucket, root)
    if manifest is None:
        raise ValueError(f"s3://{bucket}/{root} has no manifest: the dataset stage has not completed a load there")
    objects = manifest["objects"]
    hook.makedirs(dest, *sorted({posixpath.join(dest, posixpath.dirname(o["key"])) for o in objects}))
    copied = skipped = 0
    for entry in objects:
        target = posixpath.join(dest, entry["key"])
        if hook.file_size(target) == entry["size"]:
            skipped += 1
            continue
        hook.write_file(target, s3.get_object(Bucket=bucket, Key=root + entry["key"])["Body"].read())
        copied += 1
    log.info("staged s3://%s/%s into %s: %d copied, %d already there", bucket, root, dest, copied, skipped)
    return {"copied": copied, "skipped": skipped, "files": len(objects)}
