"""The local stack's AWS: moto's server, plus STAND-INS for what moto 5.2.5 lacks and the rehearsal of
`aws-gpu` needs. Each follows the AWS API reference (request and response shapes, errors, lifecycles)
and lives only in this server, which only the local stack starts: no deployment can reach it.

- FSx for Lustre data repository associations and tasks (moto answers 500 for them), and file systems
  whose contents are a local directory, `--fsx-dir`: the local stack's nodes see it at /fsx, as a
  ParallelCluster's nodes see their file system. Linking (an ImportPath, or an association with
  BatchImportMetaDataOnCreate) and import tasks copy the linked S3 objects there (their current
  versions, as FSx imports them); export tasks write what changed there back to S3. The stand-in
  file systems share that one directory; it is emptied when a file system is created while none exists.
- `AWS::FSx::FileSystem` in CloudFormation templates (moto's CloudFormation does not know it), so a
  cluster's stack holds its file system and deleting the stack deletes it.
- EC2 console output: moto prints one sample text for every instance. `POST
  /moto-api/static/ec2/console-output` with `{"instance_id": ..., "output": ...}` sets what an
  instance's boot printed (the pcluster stand-in: its head node's SSH host keys, as cloud-init prints
  them).
- RegisterImage keeps the request's Architecture, VirtualizationType and RootDeviceName (moto drops
  them, and ParallelCluster's dry run refuses an image of no architecture for any instance type).
- CreateImage applies TagSpecifications of ResourceType `snapshot` to the image's snapshots, as EC2
  documents (moto raises NotImplementedError), so the bake tags them in the create call as on AWS.
- SSM DescribeInstanceInformation (moto lacks it): every running instance of the region that was
  launched with an instance profile is a managed node whose agent is `Online` (on AWS the agent
  registers once the profile lets it reach SSM), so the AMI bake's wait for the agent runs here too.
- S3's daily storage metric in CloudWatch (`AWS/S3` `BucketSizeBytes`, StorageType StandardStorage):
  moto reports the Python objects' memory size (64 bytes a key) for every bucket; as S3 documents, it is
  the bytes of every version and unfinished upload part in S3 Standard, one datapoint a day stamped at
  midnight UTC, and none yet for a bucket created since (S3 publishes a bucket's first the next day).
- AWS's Price List API (moto has no `pricing`): GetProducts from a dated sample of EC2 product documents
  (price_list_standin.py, price_list_sample.json), so the cost estimate asks it on both profiles.
- `POST /moto-api/static/fsx/task-outcomes` with `{"results": [{"Lifecycle": "FAILED", "Message": ...,
  "Seconds": 2}]}`: how the next data repository tasks end, one result each, and how long each stays
  EXECUTING first (a test's failed export, or one still running when its task looks; by default a task
  takes as long as its files do).

Usage: moto_standins.py --fsx-dir DIR <moto_server's own arguments>
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import price_list_standin
from moto.cloudformation.parsing import get_model_list, get_model_map
from moto.cloudwatch.models import MetricDatum
from moto.core import DEFAULT_ACCOUNT_ID
from moto.core.common_models import CloudFormationModel
from moto.core.exceptions import JsonRESTError
from moto.ec2.models import amis as ec2_amis_models
from moto.ec2.models import ec2_backends
from moto.ec2.models.nat_gateways import NatGatewayBackend
from moto.ec2.responses import amis as ec2_amis
from moto.ec2.responses import general as ec2_general
from moto.ec2.utils import Base64EncodedString
from moto.fsx.exceptions import FileSystemNotFound
from moto.fsx.models import FSxBackend, fsx_backends
from moto.fsx.responses import FSxResponse
from moto.moto_api._internal import urls as moto_api_urls
from moto.moto_server.werkzeug_app import DomainDispatcherApplication
from moto.s3.models import FakeKey, S3Backend, s3_backends
from moto.ssm.responses import SimpleSystemManagerResponse
from moto.utilities.utils import get_partition

ACTIVE = ("PENDING", "EXECUTING")


class Settings:
    """Where the stand-in file systems keep their files."""

    fsx_dir = Path("fsx")


def s3_objects(bucket: str, prefix: str) -> list[Any]:
    """The current version of each object under the prefix (this server's S3, read in process)."""
    keys = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_bucket(bucket).keys
    return [key for name, key in list(keys.items()) if name.startswith(prefix) and isinstance(key, FakeKey)]


def split_s3(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


def standin(backend: FSxBackend) -> dict[str, Any]:
    """The stand-in's records in a moto backend (a moto reset drops them with the backend)."""
    if not hasattr(backend, "pcflow_standin"):
        backend.pcflow_standin = {"links": {}, "tasks": {}, "tokens": {}, "outcomes": [], "synced": {}}
    return backend.pcflow_standin


# -- the file system's directory -----------------------------------------------------------------


def links_of(backend: FSxBackend, fs_id: str) -> list[dict[str, str]]:
    """(file system path, S3 path, export path) of each link: the legacy ImportPath, or associations."""
    fs = backend.file_systems[fs_id]
    repository = (fs.lustre_configuration or {}).get("DataRepositoryConfiguration") or {}
    if repository.get("ImportPath"):
        export = repository.get("ExportPath") or repository["ImportPath"]
        return [{"fs_path": "/", "s3": repository["ImportPath"], "export": export}]
    return [
        {"fs_path": a["FileSystemPath"], "s3": a["DataRepositoryPath"], "export": a["DataRepositoryPath"]}
        for a in standin(backend)["links"].values()
        if a["FileSystemId"] == fs_id
    ]


def local_path(link: dict[str, str], key: str) -> Path:
    """Where the object `key` of the link's S3 path lies in the file system's directory."""
    _, prefix = split_s3(link["s3"])
    relative = key[len(prefix) :].lstrip("/") if prefix else key
    target = (Settings.fsx_dir / link["fs_path"].strip("/") / relative).resolve()
    if Settings.fsx_dir.resolve() not in target.parents:
        raise ValueError(f"s3 key {key!r} lands outside the file system")
    return target


def import_objects(backend: FSxBackend, fs_id: str, paths: list[str] | None = None) -> int:
    """Copy each linked object (under `paths`, when given) into the directory; returns the count."""
    copied = 0
    synced = standin(backend)["synced"].setdefault(fs_id, {})
    for link in links_of(backend, fs_id):
        bucket, prefix = split_s3(link["s3"])
        wanted = [split_s3(p)[1] for p in paths or [link["s3"]]]
        for key in s3_objects(bucket, prefix):
            if not any(key.name.startswith(w) for w in wanted) or key.name.rstrip("/") == prefix:
                continue
            target = local_path(link, key.name)
            if key.name.endswith("/"):  # a directory, with its own metadata (FSx stores directories so)
                target.mkdir(parents=True, exist_ok=True)
                apply_posix_metadata(target, key.metadata)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(key.value)
            apply_posix_metadata(target, key.metadata)
            stat = target.stat()
            synced[str(target)] = (stat.st_size, stat.st_mtime_ns)
            copied += 1
    return copied


def apply_posix_metadata(path: Path, metadata: Any) -> None:
    """Mode, owner and group from an object's `x-amz-meta-file-permissions`, `-file-owner` and `-file-group`,
    as FSx for Lustre imports them ("POSIX metadata support for data repositories"); without them FSx
    leaves root's ownership and its default modes, as this does."""
    meta = {str(k).lower().removeprefix("x-amz-meta-"): v for k, v in dict(metadata or {}).items()}
    if "file-permissions" in meta:
        path.chmod(int(meta["file-permissions"], 8) & 0o7777)
    if ("file-owner" in meta or "file-group" in meta) and os.geteuid() == 0:  # as FSx, which runs as root
        os.chown(path, int(meta.get("file-owner", -1)), int(meta.get("file-group", -1)))


def export_changes(backend: FSxBackend, fs_id: str) -> int:
    """Write the files that are new or changed since they were imported (or last exported) to S3."""
    s3, written = s3_backends[DEFAULT_ACCOUNT_ID]["aws"], 0
    synced = standin(backend)["synced"].setdefault(fs_id, {})
    for link in links_of(backend, fs_id):
        root = (Settings.fsx_dir / link["fs_path"].strip("/")).resolve()
        bucket, prefix = split_s3(link["export"])
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            stat = path.stat()
            if synced.get(str(path)) == (stat.st_size, stat.st_mtime_ns):
                continue
            key = "/".join(filter(None, [prefix, path.relative_to(root).as_posix()]))
            s3.put_object(bucket, key, path.read_bytes())
            synced[str(path)] = (stat.st_size, stat.st_mtime_ns)
            written += 1
    return written


def empty_fsx_dir() -> None:
    Settings.fsx_dir.mkdir(parents=True, exist_ok=True)
    for entry in Settings.fsx_dir.iterdir():
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


# -- file systems: the response shape, the link at creation, CloudFormation ---------------------

_create_file_system = FSxBackend.create_file_system
_delete_file_system = FSxBackend.delete_file_system


def lustre_response_shape(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """CreateFileSystem takes ImportPath & co. at the top of LustreConfiguration; DescribeFileSystems
    answers them under DataRepositoryConfiguration (moto echoes the request's shape)."""
    if not config:
        return config
    repository_keys = ("ImportPath", "ExportPath", "ImportedFileChunkSize", "AutoImportPolicy")
    shaped = {k: v for k, v in config.items() if k not in repository_keys}
    repository = {k: config[k] for k in repository_keys if k in config}
    if repository:
        shaped["DataRepositoryConfiguration"] = {"Lifecycle": "AVAILABLE", **repository}
    shaped.setdefault("MountName", uuid.uuid4().hex[:8])
    return shaped


def create_file_system(self: FSxBackend, **kwargs: Any) -> Any:
    if not self.file_systems:
        empty_fsx_dir()  # a new file system starts empty; the stand-ins share one directory
    kwargs["lustre_configuration"] = lustre_response_shape(kwargs.get("lustre_configuration"))
    fs = _create_file_system(self, **kwargs)
    if links_of(self, fs.file_system_id):
        import_objects(self, fs.file_system_id)  # FSx lists the linked prefix while it creates the file system
    return fs


def delete_file_system(self: FSxBackend, file_system_id: str, **kwargs: Any) -> Any:
    result = _delete_file_system(self, file_system_id=file_system_id, **kwargs)
    standin(self)["synced"].pop(file_system_id, None)
    if not self.file_systems:
        empty_fsx_dir()  # its data goes with it (what was not exported is lost, as on FSx)
    return result


class FsxFileSystemResource(CloudFormationModel):
    """AWS::FSx::FileSystem in a CloudFormation stack, made and deleted through the FSx backend."""

    __module__ = "moto.fsx.pcflow_standin"  # moto files its models by service, from the module's name

    @staticmethod
    def cloudformation_name_type() -> str:
        return ""

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::FSx::FileSystem"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr in ("DNSName", "LustreMountName")

    @classmethod
    def create_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
        props = cloudformation_json.get("Properties", {})
        backend = fsx_backends[account_id][region_name]
        fs = backend.create_file_system(
            client_request_token=None,
            file_system_type=props.get("FileSystemType", "LUSTRE"),
            storage_capacity=props.get("StorageCapacity"),
            storage_type=props.get("StorageType", "SSD"),
            subnet_ids=props.get("SubnetIds", []),
            security_group_ids=props.get("SecurityGroupIds", []),
            tags=props.get("Tags"),
            kms_key_id=None,
            windows_configuration=None,
            lustre_configuration=props.get("LustreConfiguration"),
            ontap_configuration=None,
            file_system_type_version=props.get("FileSystemTypeVersion"),
            open_zfs_configuration=None,
        )
        return cls(fs.file_system_id, account_id, region_name)

    @classmethod
    def delete_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name):
        cls(resource_name, account_id, region_name).delete(account_id, region_name)

    def __init__(self, file_system_id: str, account_id: str, region_name: str):
        self.file_system_id = file_system_id

    @property
    def physical_resource_id(self) -> str:
        return self.file_system_id

    def get_cfn_attribute(self, attribute_name: str) -> Any:
        return self.file_system_id

    def delete(self, account_id: str, region_name: str) -> None:
        backend = fsx_backends[account_id][region_name]
        if self.file_system_id in backend.file_systems:
            backend.delete_file_system(
                file_system_id=self.file_system_id,
                client_request_token=None,
                windows_configuration=None,
                lustre_configuration=None,
                open_zfs_configuration=None,
            )


# -- data repository associations and tasks (the FSx API reference's shapes) ---------------------


def _now() -> float:
    return time.time()


def _file_system(backend: FSxBackend, fs_id: str) -> Any:
    if fs_id not in backend.file_systems:
        raise FileSystemNotFound(fs_id)
    return backend.file_systems[fs_id]


def _filtered(items: list[dict], filters: list[dict], names: dict[str, str]) -> list[dict]:
    for f in filters or []:
        field = names.get(f["Name"])
        if field:
            items = [i for i in items if i.get(field) in f["Values"]]
    return items


def create_data_repository_association(self: FSxResponse) -> str:
    params = json.loads(self.body)
    backend = self.fsx_backend
    fs = _file_system(backend, params["FileSystemId"])
    links = standin(backend)["links"]
    association_id = f"dra-{uuid.uuid4().hex[:17]}"
    links[association_id] = {
        "AssociationId": association_id,
        "ResourceARN": f"{fs.resource_arn.rsplit(':', 1)[0]}:association/{fs.file_system_id}/{association_id}",
        "FileSystemId": fs.file_system_id,
        "Lifecycle": "AVAILABLE",
        "FileSystemPath": params.get("FileSystemPath", "/"),
        "DataRepositoryPath": params["DataRepositoryPath"],
        "BatchImportMetaDataOnCreate": bool(params.get("BatchImportMetaDataOnCreate", False)),
        "ImportedFileChunkSize": params.get("ImportedFileChunkSize", 1024),
        "Tags": params.get("Tags", []),
        "CreationTime": _now(),
    }
    if links[association_id]["BatchImportMetaDataOnCreate"]:
        import_objects(backend, fs.file_system_id, [params["DataRepositoryPath"]])
    return json.dumps({"Association": links[association_id]})


def describe_data_repository_associations(self: FSxResponse) -> str:
    params = json.loads(self.body)
    found = list(standin(self.fsx_backend)["links"].values())
    if params.get("AssociationIds"):
        found = [a for a in found if a["AssociationId"] in params["AssociationIds"]]
    found = _filtered(found, params.get("Filters"), {"file-system-id": "FileSystemId"})
    return json.dumps({"Associations": found})


def create_data_repository_task(self: FSxResponse) -> str:
    params = json.loads(self.body)
    backend = self.fsx_backend
    records = standin(backend)
    token = params.get("ClientRequestToken")
    if token and token in records["tokens"]:  # FSx: the same token returns the same task
        return json.dumps({"DataRepositoryTask": records["tasks"][records["tokens"][token]]})
    fs = _file_system(backend, params["FileSystemId"])
    if not links_of(backend, fs.file_system_id):
        raise JsonRESTError("BadRequest", f"File system {fs.file_system_id} is not linked to a data repository.")
    if any(t["FileSystemId"] == fs.file_system_id and t["Lifecycle"] in ACTIVE for t in records["tasks"].values()):
        raise JsonRESTError(
            "DataRepositoryTaskExecuting",
            "An existing data repository task is currently executing on the file system. Wait until the "
            "existing task has completed, then create the new task.",
        )
    task_id = f"task-{uuid.uuid4().hex[:17]}"
    task = {
        "TaskId": task_id,
        "Lifecycle": "PENDING",
        "Type": params["Type"],
        "CreationTime": _now(),
        "ResourceARN": f"{fs.resource_arn.rsplit(':', 1)[0]}:task/{task_id}",
        "Tags": params.get("Tags", []),
        "FileSystemId": fs.file_system_id,
        "Paths": params.get("Paths", []),
        "Report": params.get("Report", {"Enabled": False}),
    }
    records["tasks"][task_id] = task
    if token:
        records["tokens"][token] = task_id
    outcome = records["outcomes"].pop(0) if records["outcomes"] else None
    answer = json.dumps({"DataRepositoryTask": task})  # as created: PENDING
    threading.Thread(target=run_task, args=(backend, task, outcome), daemon=True).start()
    return answer


def run_task(backend: FSxBackend, task: dict[str, Any], outcome: dict[str, Any] | None) -> None:
    """PENDING, then EXECUTING while the files move, then SUCCEEDED or FAILED (with FSx's reason)."""
    task.update(Lifecycle="EXECUTING", StartTime=_now())
    time.sleep(float((outcome or {}).get("Seconds", 0)))
    try:
        if outcome and outcome.get("Lifecycle") == "FAILED":
            raise RuntimeError(outcome.get("Message") or "the task failed")
        if task["Type"] == "EXPORT_TO_REPOSITORY":
            count = export_changes(backend, task["FileSystemId"])
        else:
            count = import_objects(backend, task["FileSystemId"], task["Paths"] or None)
        status = {"TotalCount": count, "SucceededCount": count, "FailedCount": 0}
        task.update(Lifecycle="SUCCEEDED", Status={**status, "LastUpdatedTime": _now()})
    except Exception as exc:  # the task's failure, reported as FSx reports it
        task.update(Lifecycle="FAILED", FailureDetails={"Message": str(exc)[:1000]})
    task["EndTime"] = _now()


def describe_data_repository_tasks(self: FSxResponse) -> str:
    params = json.loads(self.body)
    tasks = standin(self.fsx_backend)["tasks"]
    wanted = params.get("TaskIds")
    missing = [t for t in wanted or [] if t not in tasks]
    if missing:
        raise JsonRESTError("DataRepositoryTaskNotFound", f"Data repository task {missing[0]} does not exist.")
    found = [tasks[t] for t in wanted] if wanted else list(tasks.values())
    names = {"file-system-id": "FileSystemId", "task-lifecycle": "Lifecycle"}
    return json.dumps({"DataRepositoryTasks": _filtered(found, params.get("Filters"), names)})


# -- moto-api routes: what the stand-ins are told ------------------------------------------------


def _body(request: Any) -> dict[str, Any]:
    return json.loads(request.get_data() or b"{}")


def set_console_output(request: Any, full_url: str, headers: Any) -> tuple[int, dict, str]:
    body = _body(request)
    backend = ec2_backends[body.get("account_id", DEFAULT_ACCOUNT_ID)][body.get("region", "us-east-1")]
    backend.get_instance(body["instance_id"]).pcflow_console_output = body["output"]
    return 201, {}, ""


def set_task_outcomes(request: Any, full_url: str, headers: Any) -> tuple[int, dict, str]:
    body = _body(request)
    backend = fsx_backends[body.get("account_id", DEFAULT_ACCOUNT_ID)][body.get("region", "us-east-1")]
    standin(backend)["outcomes"].extend(body.get("results", []))
    return 201, {}, ""


_get_console_output = ec2_general.General.get_console_output


def get_console_output(self: Any) -> Any:
    result = _get_console_output(self)
    instance = self.ec2_backend.get_instance(self._get_param("InstanceId"))
    text = getattr(instance, "pcflow_console_output", None)
    if text is not None:
        result.result["Output"] = Base64EncodedString.from_raw_string(text)
        result.result["Timestamp"] = dt.datetime.now(dt.UTC)
    return result


def describe_instance_information(self: SimpleSystemManagerResponse) -> str:
    """SSM's DescribeInstanceInformation with the `InstanceIds` filter (the one the bake uses)."""
    wanted: set[str] | None = None
    for item in self._get_param("Filters") or []:
        if item.get("Key") == "InstanceIds":
            wanted = set(item.get("Values", []))
    managed = []
    for instance in ec2_backends[self.current_account][self.region].all_instances():
        if instance.state != "running" or not instance.iam_instance_profile or (wanted and instance.id not in wanted):
            continue
        managed.append(
            {
                "InstanceId": instance.id,
                "PingStatus": "Online",
                "LastPingDateTime": time.time(),
                "AgentVersion": "3.3.0.0",
                "IsLatestVersion": True,
                "PlatformType": "Linux",
                "ResourceType": "EC2Instance",
                "IPAddress": instance.private_ip,
            }
        )
    return json.dumps({"InstanceInformationList": managed})


_register_image = ec2_amis.AmisResponse.register_image
REGISTERED_ATTRIBUTES = {
    "Architecture": "architecture",
    "VirtualizationType": "virtualization_type",
    "RootDeviceName": "root_device_name",
}


def register_image(self: Any) -> Any:
    result = _register_image(self)
    image = self.ec2_backend.amis[result.result["ImageId"]]
    for param, attribute in REGISTERED_ATTRIBUTES.items():
        if self._get_param(param):
            setattr(image, attribute, self._get_param(param))
    return result


_create_image = ec2_amis_models.AmiBackend.create_image


def create_image(self: Any, instance_id: str, name: str, description: str, tag_specifications: list) -> Any:
    """EC2's CreateImage: the snapshot tag specifications tag the image's snapshots."""
    snapshot_tags = [t for spec in tag_specifications if spec["ResourceType"] == "snapshot" for t in spec["Tags"]]
    image_specs = [spec for spec in tag_specifications if spec["ResourceType"] != "snapshot"]
    image = _create_image(self, instance_id, name, description, image_specs)
    if snapshot_tags:
        self.create_tags([image.ebs_snapshot.id], {t["Key"]: t["Value"] for t in snapshot_tags})
    return image


_moto_s3_metrics = S3Backend.get_cloudwatch_metrics


def standard_bytes(bucket: Any) -> int:
    """What S3 Standard holds for a bucket: every object version (not delete markers) and upload part."""
    versions = [v for _, listed in bucket.keys.iterlists() for v in listed if isinstance(v, FakeKey)]
    parts = [part for upload in bucket.multiparts.values() for part in upload.parts.values()]
    return sum(v.size for v in [*versions, *parts] if (v.storage_class or "STANDARD") == "STANDARD")


def s3_cloudwatch_metrics(account_id: str, region: str) -> list[MetricDatum]:
    """moto's S3 metrics with BucketSizeBytes as S3 publishes it (module docstring)."""
    midnight = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    metrics = [m for m in _moto_s3_metrics(account_id, region) if m.name != "BucketSizeBytes"]
    for name, bucket in s3_backends[account_id][get_partition(region)].buckets.items():
        if bucket.creation_date < midnight:
            dimensions = [{"Name": "StorageType", "Value": "StandardStorage"}, {"Name": "BucketName", "Value": name}]
            size = standard_bytes(bucket)
            stamp = midnight.replace(tzinfo=None)  # moto keeps metric timestamps naive, in UTC
            metrics.append(MetricDatum("AWS/S3", "BucketSizeBytes", size, dimensions, stamp, unit="Bytes"))
    return metrics


_delete_nat_gateway = NatGatewayBackend.delete_nat_gateway


def delete_nat_gateway(self: Any, nat_gateway_id: str) -> Any:
    """AWS deletes a NAT gateway's network interface with it (the interface is AWS's, requester-managed:
    the account cannot delete it); moto left it behind, detached and untagged."""
    nat = _delete_nat_gateway(self, nat_gateway_id)
    eni = getattr(nat, "_eni", None)
    if eni is not None and eni.id in self.enis:
        for address in list(self.addresses):
            if getattr(address, "eni", None) is eni:
                address.eni = None
                address.association_id = None
        self.enis.pop(eni.id, None)
    return nat


def install() -> None:
    """Add the stand-ins to moto (before its server builds its routes)."""
    FSxBackend.create_file_system = create_file_system
    FSxBackend.delete_file_system = delete_file_system
    for handler in (
        create_data_repository_association,
        describe_data_repository_associations,
        create_data_repository_task,
        describe_data_repository_tasks,
    ):
        setattr(FSxResponse, handler.__name__, handler)
    ec2_general.General.get_console_output = get_console_output
    NatGatewayBackend.delete_nat_gateway = delete_nat_gateway
    SimpleSystemManagerResponse.describe_instance_information = describe_instance_information
    ec2_amis.AmisResponse.register_image = register_image
    ec2_amis_models.AmiBackend.create_image = create_image
    S3Backend.get_cloudwatch_metrics = staticmethod(s3_cloudwatch_metrics)
    moto_api_urls.url_paths["{0}/moto-api/static/ec2/console-output"] = set_console_output
    moto_api_urls.url_paths["{0}/moto-api/static/fsx/task-outcomes"] = set_task_outcomes
    price_list_standin.install(DomainDispatcherApplication)
    get_model_list.cache_clear()
    get_model_map.cache_clear()
    assert FsxFileSystemResource in get_model_list()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fsx-dir", required=True, type=Path)
    ours, moto_args = parser.parse_known_args(argv)
    Settings.fsx_dir = ours.fsx_dir.resolve()
    Settings.fsx_dir.mkdir(parents=True, exist_ok=True)
    install()
    from moto.server import main as moto_main

    moto_main(moto_args)


if __name__ == "__main__":
    sys.exit(main())
