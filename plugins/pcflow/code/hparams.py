"""A project's hyperparameters, declared: a JSON schema file in its code (`hparams.schema.json` at the
code's top, or the file `training.hparams_schema` names) listing their names, types and bounds.

The first task reads it from the code the run will train (the git commit the ref was resolved to, the
directory, the S3 bundle, the admin's payload) and checks every hyperparameter object the job would
receive (the profile's and the conf's, merged with each sweep trial and grid point) before anything is
spent: an unknown name, a wrong type or a value out of bounds is refused naming the setting it came from.
A code without the file is not checked (the job checks what it reads, as before).

The schema is the project author's, so it is held to bounds too: at most MAX_SCHEMA_BYTES, valid for its
JSON Schema draft (2020-12 when it names none), references resolved inside the file only (never fetched),
`pattern` matched by RE2 (linear time: a schema cannot stall the first task), no `patternProperties`.
`data_dir` is pcflow's (runspec.DATA_DIR): the check gives it a stand-in value, and a schema that refuses
it is refused as the schema's fault.
"""

from __future__ import annotations

import json
import posixpath
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcflow.code.schema_file import MAX_SCHEMA_BYTES, SchemaRefused, read_local, schema_path
from pcflow.code.sources import read_bundle_file, read_git_file
from pcflow.metric_definitions import compile_re2
from pcflow.paths import payload_source

if TYPE_CHECKING:
    from pcflow.resolved import PlannedRun

#: What the check gives DATA_DIR, which the train task sets to the run's staged partition.
DATA_DIR_STAND_IN = "/pcflow/the-runs-staged-partition"


@dataclass(frozen=True)
class Case:
    """One hyperparameter object as the job would receive it, and where each of its values came from
    (name -> the setting's dotted path; a name not listed came from `training.hyperparameters`)."""

    values: dict[str, Any]
    origin: dict[str, str] = field(default_factory=dict)
    whole: str = "training.hyperparameters"  # the setting an error about the object as a whole names


def parse_schema(data: bytes, where: str) -> dict[str, Any]:
    """The schema in `data` (the file `where` names), checked against its draft's meta-schema; refused
    (SchemaRefused) when it is too large, not JSON, not an object or not a valid schema."""
    if len(data) > MAX_SCHEMA_BYTES:
        raise SchemaRefused(f"{where} is {len(data)} bytes, over the cap of {MAX_SCHEMA_BYTES}")
    try:
        schema = json.loads(data)
    except ValueError as exc:
        raise SchemaRefused(f"{where} is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise SchemaRefused(f"{where} is not a JSON schema object (got {type(schema).__name__})")
    schema_validator(schema, where)
    return schema


def schema_validator(schema: dict[str, Any], where: str) -> Any:
    """A validator of `schema` (its `$schema` draft, else 2020-12) whose `pattern` runs on RE2 and whose
    references resolve inside the file only; refused (SchemaRefused) when the schema is not valid."""
    import jsonschema  # with the check, not with the DAG files that import this module for the form
    import referencing
    from jsonschema.validators import extend, validator_for

    if _uses(schema, "patternProperties"):
        raise SchemaRefused(f"{where}: patternProperties is not supported; list the hyperparameters by name")
    base = validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        base.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise SchemaRefused(f"{where} is not a valid JSON schema: {exc.message} (at {_pointer(exc.path)})") from None
    validator = extend(base, {"pattern": _re2_pattern})
    return validator(schema, registry=referencing.Registry())  # no retrieval: a remote $ref is refused


def _re2_pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    """JSON Schema's `pattern`, matched by RE2 (pcflow.metric_definitions: linear in the string)."""
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "string"):
        return
    try:
        matched = compile_re2(pattern).search(instance)
    except Exception as exc:  # re2.error: a pattern RE2 does not take (a backreference, a lookaround)
        raise SchemaRefused(f"its pattern {pattern!r} is not one RE2 takes: {exc}") from None
    if not matched:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _uses(node: Any, keyword: str) -> bool:
    """Whether `keyword` is a key anywhere in the schema."""
    if isinstance(node, dict):
        return keyword in node or any(_uses(value, keyword) for value in node.values())
    if isinstance(node, list):
        return any(_uses(value, keyword) for value in node)
    return False


def _pointer(path: Any) -> str:
    return "/" + "/".join(str(part) for part in path) if path else "the top"


def problems(schema: dict[str, Any], cases: list[Case], *, data_dir: str, where: str) -> list[tuple[str, str]]:
    """(setting, what is wrong) for each value the schema refuses in any case, each once; refused
    (SchemaRefused) when the schema cannot check them (an unresolvable reference, a pattern RE2 does not
    take) or refuses `data_dir`, which pcflow sets."""
    from referencing.exceptions import Unresolvable

    validator = schema_validator(schema, where)
    found: dict[tuple[str, str], None] = {}
    for case in cases:
        try:
            errors = list(validator.iter_errors({**case.values, data_dir: DATA_DIR_STAND_IN}))
        except (Unresolvable, RecursionError, SchemaRefused) as exc:
            raise SchemaRefused(f"{where} cannot be used: {exc}"[:500]) from None
        for error in errors:
            for name, problem in _named(error):
                if name == data_dir:
                    raise SchemaRefused(f"{where} refuses {name!r}, which pcflow sets itself: {problem}")
                setting = case.whole if name is None else case.origin.get(name, f"training.hyperparameters.{name}")
                found[(setting, problem)] = None
    return list(found)


def _named(error: Any) -> list[tuple[str | None, str]]:
    """(hyperparameter name, problem) for one validation error: the value's name where the error is inside
    one, the unexpected or missing names where it is about the object itself, else None (the whole)."""
    if error.path:
        return [(str(error.path[0]), error.message)]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = sorted(error.schema.get("properties") or {})
        problem = "not a hyperparameter of the code's schema (it lists: " + ", ".join(known) + ")"
        return [(name, problem) for name in error.instance if name not in known]
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in error.validator_value if name not in error.instance]
        return [(name, "required by the code's schema") for name in missing]
    return [(None, error.message)]


def code_schema(run: PlannedRun, s3: Callable[[], Any]) -> tuple[str, bytes | None]:
    """(what the file is called in a message, its bytes or None when the code has none), read from the code
    the run trains: a git commit's record in the bucket (no fetch) or the one file of the commit, the
    directory, the S3 bundle (bounded), the admin's payload. `s3`: the client, made only when needed."""
    training = run.training
    path, code = schema_path(training.hparams_schema), training.code
    if code is not None and (git := code.git):
        where = f"{path} in {git.url} at {git.commit}"
        found = recorded_schema(run, s3, path)
        if found is not MISSING:
            return where, found
        full = posixpath.normpath(posixpath.join(git.subdir or "", path))
        with tempfile.TemporaryDirectory(prefix="pcflow-hparams-") as work:
            data = read_git_file(git.url, git.commit, full, Path(work), max_bytes=MAX_SCHEMA_BYTES, conn_id=git.conn_id)
        return where, data
    if code is not None and code.dir:
        return f"{path} in {code.dir}", read_local(Path(code.dir), path)
    if code is not None and code.s3:
        data = read_bundle_file(
            s3(),
            code.s3,
            posixpath.normpath(path),
            max_bytes=training.bundle.max_bytes,
            max_file_bytes=MAX_SCHEMA_BYTES,
        )
        return f"{path} in {code.s3}", data
    if training.payload:
        return f"{path} in payload {training.payload!r}", read_local(payload_source(training.payload), path)
    return path, None


#: recorded_schema's answer when the record holds none for the path (the caller reads the code).
MISSING = object()


def recorded_schema(run: PlannedRun, s3: Callable[[], Any], path: str) -> Any:
    """The schema an earlier run of the same git commit recorded (pcflow.code.upload.record_commit): its
    bytes, None (the commit has no such file), or MISSING (no record, or none for this path)."""
    from pcflow.code.upload import commit_key, recorded_commit

    training = run.training
    git = training.code.git
    key = commit_key(git.url, git.commit, git.subdir, training.bundle.model_dump(mode="json"))
    record = recorded_commit(s3(), run.dataset.bucket, key) or {}
    found = record.get("hparams_schema")
    if not isinstance(found, dict) or found.get("path") != path or not isinstance(found.get("text"), str | None):
        return MISSING
    return None if found["text"] is None else found["text"].encode()


def schema_record(tree: Path, hparams_schema: str | None) -> dict[str, Any] | None:
    """What record_commit keeps of the schema of the tree the commit checked out to ({"path", "text"}), or
    None when it is not one to keep (over the cap, not UTF-8, a link): the first task then reads the code.
    `hparams_schema`: the run's `training.hparams_schema`."""
    path = schema_path(hparams_schema)
    try:
        data = read_local(tree, path)
        return {"path": path, "text": None if data is None else data.decode()}
    except (SchemaRefused, UnicodeDecodeError):
        return None
