"""A log of every AWS call a process makes, one JSON line per call, for checking IAM policies against
what is really called (the rehearsal does: include/local/iam_calls.py evaluates each line).

It is a botocore client plugin: with `BOTOCORE_EXPERIMENTAL__PLUGINS=pcflow_calls=pcflow.aws.calllog`
botocore (and aiobotocore, the triggers' clients) calls `initialize_client_plugin` for every client a
process creates, whoever creates it (pcflow's client factory, the Amazon provider's hooks and triggers,
s3transfer, the pcluster CLI), so no call path is left out and no code is patched. The environment
carries the setting to child processes (the pcluster CLI, a killed run's successor); `recording` sets
it. A client appends while `PCFLOW_AWS_CALL_LOG` names a file, so the variable switches it off again.

Each line says who made the call (`PCFLOW_AWS_CALLER`: `airflow` unless a process or `acting_as` says
otherwise), the service and operation, the region, the request's parameters (bytes and streams as their
type's name) and the tags the answer showed for each resource id (an IAM condition on a resource's tags
is judged with them). Only the standard library and botocore: the pcluster CLI's environment loads it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOG_ENV = "PCFLOW_AWS_CALL_LOG"
CALLER_ENV = "PCFLOW_AWS_CALLER"
PLUGINS_ENV = "BOTOCORE_EXPERIMENTAL__PLUGINS"
PLUGIN = "pcflow_calls=pcflow.aws.calllog"
DEFAULT_CALLER = "airflow"
_PARAMS = "pcflow_call_params"
#: This process' override of the caller (`acting_as`), and how many `paused` blocks are open.
_state: dict[str, Any] = {"caller": None, "paused": 0}


def initialize_client_plugin(client: Any) -> None:
    """botocore's plugin entry point: keep the parameters before the call, write the line after it."""
    client.meta.events.register("before-parameter-build", _keep_params)
    client.meta.events.register("after-call", _write_call)


def _keep_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    context[_PARAMS] = json.loads(json.dumps(params, default=_type_name))


def _type_name(value: Any) -> str:
    return f"<{type(value).__name__}>"


def _write_call(model: Any, parsed: Any, context: dict[str, Any], **_: Any) -> None:
    path = os.environ.get(LOG_ENV)
    if not path or _state["paused"]:
        return
    service = model.service_model
    record = {
        "caller": _state["caller"] or os.environ.get(CALLER_ENV) or DEFAULT_CALLER,
        "service": service.service_name,
        "operation": model.name,
        "region": context.get("client_region"),
        "params": context.get(_PARAMS, {}),
        "error": ((parsed or {}).get("Error") or {}).get("Code") if isinstance(parsed, dict) else None,
        "tags": {**created_with_tags(context.get(_PARAMS, {}), parsed), **tags_seen(parsed)},
        "owners": owners_seen(parsed),
    }
    line = json.dumps(record, default=_type_name) + "\n"
    fd = os.open(
        path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
    )  # one write per line: processes interleave whole lines
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def created_with_tags(params: dict[str, Any], parsed: Any) -> dict[str, dict[str, str]]:
    """{new id: tags} for a creation tagged in the request (TagSpecifications) whose answer gives only
    the id (AllocateAddress' AllocationId, CreateSecurityGroup's GroupId)."""
    specifications = params.get("TagSpecifications")
    if not specifications or not isinstance(parsed, dict):
        return {}
    tags = {t["Key"]: str(t.get("Value", "")) for spec in specifications for t in spec.get("Tags", [])}
    return {v: tags for k, v in parsed.items() if k.endswith("Id") and isinstance(v, str)}


#: Lists and members whose objects' own id is not `<singular name>Id`.
OWN_ID = {"SecurityGroup": "GroupId", "Addresse": "AllocationId", "DataRepositoryTask": "TaskId"}


def tags_seen(value: Any, under: str = "", found: dict[str, dict[str, str]] | None = None) -> dict[str, dict[str, str]]:
    """{resource id: tags} for every object in an answer that carries tags (`Tags`, or EC2's `TagSet`:
    `{"Key", "Value"}` pairs). An object's own id is named after the member holding it (`Vpc`/`Vpcs`:
    `VpcId`; a subnet's `VpcId` is its VPC's), its ARN (`ResourceARN`) too. The resources a CloudFormation
    stack's outputs name carry the stack's tags (CloudFormation propagates them)."""
    found = {} if found is None else found
    if isinstance(value, dict):
        pairs = tag_pairs(value.get("Tags", value.get("TagSet")))
        if pairs is not None:
            singular = under[:-1] if under.endswith("s") else under
            own = [value.get(OWN_ID.get(singular, f"{singular}Id")), value.get("ResourceARN")]
            own += [i for o in value.get("Outputs") or () for i in str(o.get("OutputValue", "")).split(",")]
            for ident in (i for i in own if isinstance(i, str) and i):
                found.setdefault(ident, {}).update(pairs)
        for key, item in value.items():
            tags_seen(item, key, found)
    elif isinstance(value, list):
        for item in value:
            tags_seen(item, under, found)
    return found


def tag_pairs(tags: Any) -> dict[str, str] | None:
    """`[{"Key", "Value"}]` as a dict, None when the value is not a tag list (so any other list is walked on)."""
    if isinstance(tags, list) and all(isinstance(t, dict) and "Key" in t for t in tags):
        return {t["Key"]: str(t.get("Value", "")) for t in tags}
    return None


def owners_seen(value: Any, owner: str | None = None, found: dict[str, str] | None = None) -> dict[str, str]:
    """{association or attachment id: the id of the resource it belongs to} (a route table's subnet
    associations, an address' association, an interface's attachment): the calls that undo them name
    only that id, IAM judges them on the resource. An image's snapshots too: its creation tags both."""
    found = {} if found is None else found
    if isinstance(value, dict):
        own = next((value[k] for k in OWNER_IDS if isinstance(value.get(k), str)), owner)
        for key, item in value.items():
            if isinstance(item, str) and own and key.endswith(("AssociationId", "AttachmentId", "SnapshotId")):
                found.setdefault(item, own)
            else:
                owners_seen(item, own, found)
    elif isinstance(value, list):
        for item in value:
            owners_seen(item, owner, found)
    return found


OWNER_IDS = ("RouteTableId", "AllocationId", "NetworkInterfaceId", "ImageId")


@contextlib.contextmanager
def acting_as(caller: str) -> Iterator[None]:
    """The calls made within are `caller`'s (a stand-in doing what another principal does on AWS)."""
    before, _state["caller"] = _state["caller"], caller
    try:
        yield
    finally:
        _state["caller"] = before


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Calls made within are not logged (a tool's own lookups beside the run it records)."""
    _state["paused"] += 1
    try:
        yield
    finally:
        _state["paused"] -= 1


@contextlib.contextmanager
def recording(path: Path) -> Iterator[Path]:
    """Log the calls of this process and of the processes it starts to `path`, within the block.

    Child processes find this module on PYTHONPATH (this checkout's plugins/), also the pcluster CLI's
    own environment, which does not have pcflow installed."""
    plugins = str(Path(__file__).resolve().parents[2])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    changes = {
        LOG_ENV: str(path),
        PLUGINS_ENV: ",".join(p for p in (os.environ.get(PLUGINS_ENV), PLUGIN) if p and p != "DISABLED"),
        "PYTHONPATH": os.pathsep.join(p for p in (plugins, os.environ.get("PYTHONPATH")) if p),
    }
    before = {key: os.environ.get(key) for key in changes}
    os.environ.update(changes)
    try:
        yield path
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
