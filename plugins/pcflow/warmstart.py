"""Warm start: a run may start from a model an earlier run of its stack kept (`training.warm_start`).

The setting names `latest` (the stack's newest model: what the nightly continues from), a run key, or the
s3:// URI of a model or checkpoint a run of this stack wrote (`s3://<the run's bucket>/runs/<run key>/model/...`).
The first task resolves it against the record the writing run left in Airflow's metadata database, the
model's asset event (`pcflow.lineage`: its `run_key`, the URIs and the sha256 the cluster computed before the
copy), read through the task's inlet events of the model alias (`MODEL`, an inlet of the first task). A run
key or URI with no such record, a URI outside the stack's layout, or a record without a sha256 is refused
before anything is spent; so are bytes that no longer have the recorded sha256 (`pcflow.artifacts`, which
downloads them bounded and checks them). The object's own metadata is never trusted: whoever can write the
bucket can replace it with the bytes.

The `warm_start` task later puts the verified model, read-only, into the run's directory on the cluster
(`<run dir>/warm_start/model.pt`, checked again there with `sha256sum`), and the train task tells the job
its path in `$PCFLOW_WARM_START` (include/payloads/README.md). The resolved record,
`{source, uri, sha256, run}`, is what the run summary, report and the model's event carry as `warm_start`.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pcflow.lineage import MODEL, stack_asset
from pcflow.patterns import LATEST, RUN_KEY

#: The run setting, as refusals name it.
SETTING = "training.warm_start"
#: How many of the newest model events (all stacks' events through the alias) the first task reads.
MAX_EVENTS = 500
#: The warm-start model's directory and file inside the run's directory on the cluster.
WARM_START_DIR = "warm_start"
WARM_START_FILE = "model.pt"
#: Where a run of the stack keeps its models in its bucket (a sweep's trials under `trials/<i>/`).
LAYOUT = re.compile(
    r"^runs/(?P<run>[a-z0-9][a-z0-9-]{0,47})/(trials/\d{1,6}/)?model/(model\.pt|checkpoints/[A-Za-z0-9_.-]{1,200})$"
)
#: What provenance records of a warm start (summary, report, the model's event).
FIELDS = ("source", "uri", "sha256", "run")
#: A run that names no model, or `latest` in a stack without one yet: nothing to load.
NOTHING = dict.fromkeys(FIELDS)


class Unrecorded(ValueError):
    """The setting names no model this stack recorded (the first task words it as a refusal of the setting)."""


@dataclass(frozen=True)
class Recorded:
    """One model a run of the stack kept, as its asset event recorded it."""

    run: str
    files: dict[str, str]  # URI -> sha256 hex, as the writing run recorded them
    model: str | None  # the URI of its model.pt (a sweep: the best trial's)


def stack_models(events: Iterable[Any], stack: str) -> list[Recorded]:
    """The stack's recorded models among model events (in the order given: newest first), each with the
    URIs and sha256 of what its run kept. Another stack's events and events naming no run are skipped."""
    name = stack_asset(MODEL.name, stack).name
    found = []
    for event in events:
        extra = getattr(event, "extra", None)
        if getattr(getattr(event, "asset", None), "name", None) != name or not isinstance(extra, Mapping):
            continue
        run = extra.get("run_key")
        if not isinstance(run, str) or not RUN_KEY.fullmatch(run):
            continue
        kept = extra.get("model") if isinstance(extra.get("model"), Mapping) else extra.get("best")
        kept = kept if isinstance(kept, Mapping) else {}
        files = {
            kept.get(uri): kept.get(f"{uri}_sha256")
            for uri in ("model", "checkpoint")
            if isinstance(kept.get(uri), str) and isinstance(kept.get(f"{uri}_sha256"), str)
        }
        model = kept.get("model") if isinstance(kept.get("model"), str) else None
        found.append(Recorded(run, files, model))
    return found


def model_events(inlet_events: Any) -> list[Any]:
    """The newest model events (at most MAX_EVENTS, newest first) through the model alias, which must be an
    inlet of the calling task (Airflow's `inlet_events` reads events of its task's inlets only)."""
    if inlet_events is None:
        return []
    return list(inlet_events[MODEL].ascending(False).limit(MAX_EVENTS))


def resolve(setting: str | None, models: list[Recorded], *, bucket: str) -> dict[str, Any]:
    """What `setting` names, as the stack's records say: `{source, uri, sha256, run}` (all None when there is
    nothing to load: no setting, or `latest` in a stack that kept no model yet). Raises Unrecorded."""
    if not setting:
        return dict(NOTHING)
    if setting == LATEST:
        usable = (m for m in models if m.model in m.files and in_layout(m.model, bucket, m.run))
        newest = next(usable, None)
        return found(setting, newest, newest.model) if newest else {**NOTHING, "source": setting}
    if RUN_KEY.fullmatch(setting):
        record = next((m for m in models if m.run == setting), None)
        if record is None:
            raise Unrecorded(f"run {setting!r} kept no model in this stack ({unseen()})")
        if not record.model or record.model not in record.files:
            raise Unrecorded(f"run {setting!r} recorded no sha256 for a model; it cannot be loaded safely")
        if not in_layout(record.model, bucket, setting):
            raise Unrecorded(f"run {setting!r} recorded its model at {record.model}, {outside(bucket)}")
        return found(setting, record, record.model)
    return resolve_uri(setting, models, bucket=bucket)


def candidates(setting: str | None, models: list[Recorded], *, bucket: str) -> list[dict[str, Any]]:
    """What the first task tries to load, in order: for `latest`, every recorded model of the stack, newest
    first (a model whose object is gone, expired or deleted, gives way to the one before it); for a run key
    or URI, the one it names (`resolve`). Empty when there is nothing to load. Raises Unrecorded."""
    if setting == LATEST:
        usable = [m for m in models if m.model in m.files and in_layout(m.model, bucket, m.run)]
        return [found(setting, m, m.model) for m in usable]
    resolved = resolve(setting, models, bucket=bucket)
    return [resolved] if resolved["uri"] else []


def in_layout(uri: str, bucket: str, run: str | None = None) -> re.Match | None:
    """Whether `uri` is where a run of the stack keeps a model (its bucket, `runs/<run key>/model/`; the run
    `run`'s when given): the match, naming the run, else None. A key with `.`, `..` or `//` is never one."""
    got, _, key = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or got != bucket or key != posixpath.normpath(key):
        return None
    match = LAYOUT.fullmatch(key)
    return match if match and (run is None or match["run"] == run) else None


def outside(bucket: str) -> str:
    """The refusal's words for a URI outside the layout."""
    return f"not a model this stack's runs write (s3://{bucket}/runs/<run key>/model/model.pt or its checkpoints/)"


def resolve_uri(uri: str, models: list[Recorded], *, bucket: str) -> dict[str, Any]:
    """A model's or checkpoint's URI: in the stack's bucket and layout, and recorded with its sha256 by its run."""
    match = in_layout(uri, bucket)
    if match is None:
        raise Unrecorded(f"{uri} is {outside(bucket)}")
    records = [m for m in models if m.run == match["run"]]
    if not records:
        raise Unrecorded(f"run {match['run']!r} kept no model in this stack ({unseen()})")
    record = next((m for m in records if uri in m.files), None)
    if record is None:
        raise Unrecorded(f"{uri}: its run {match['run']!r} recorded no sha256 for it; it cannot be loaded safely")
    return found(uri, record, uri)


def found(source: str, record: Recorded, uri: str) -> dict[str, Any]:
    """The provenance of a resolved warm start."""
    return {"source": source, "uri": uri, "sha256": record.files[uri], "run": record.run}


def unseen() -> str:
    """Why a run key may go unseen: only the newest MAX_EVENTS model events are read."""
    return f"no model event of it among the newest {MAX_EVENTS}; a run key is the one its run's summary names"


def verify(s3: Any, resolved: Mapping[str, Any], directory: str) -> Any:
    """The model's bytes downloaded into `directory` (bounded) and checked against the recorded sha256
    (`pcflow.artifacts.load_artifact`: ArtifactRefused, not retried, when they differ); returns the path."""
    from pathlib import Path

    from pcflow.artifacts import load_artifact

    return load_artifact(s3, resolved["uri"], resolved["sha256"], Path(directory) / WARM_START_FILE)


#: On the cluster: the verified bytes on stdin into a temporary file beside `$1`, checked against `$2` with
#: sha256sum, made read-only and renamed into place; removed on any failure.
INSTALL_SCRIPT = (
    'set -e; t="$1.tmp-$$"; trap \'rm -f -- "$t"\' EXIT; umask 027; cat > "$t"; '
    'printf "%s  %s\\n" "$2" "$t" | sha256sum -c --quiet -; chmod 440 -- "$t"; mv -f -- "$t" "$1"'
)
#: Whether `$1` already is the verified model (a retry of the task): exit 0 if so.
INSTALLED_SCRIPT = '[ -f "$1" ] && printf "%s  %s\\n" "$2" "$1" | sha256sum -c --quiet - 2>/dev/null'


def install(hook: Any, local_path: Any, resolved: Mapping[str, Any], run_dir: str) -> str:
    """The verified model, read-only, at `<run_dir>/warm_start/model.pt` on the cluster (in the job account's
    group where there is one: the job reads it, never writes it), checked there against the recorded sha256
    again; one already there with that hash is kept. Returns its path."""
    import shutil

    directory = posixpath.join(run_dir, WARM_START_DIR)
    hook.make_run_dirs(run_dir)
    hook.make_run_dirs(directory)  # 2750 in the job's group (or the SSH user's alone): entered, never written
    dest = posixpath.join(directory, WARM_START_FILE)
    if hook.run(["sh", "-c", INSTALLED_SCRIPT, "sh", dest, resolved["sha256"]], check=False).exit_code == 0:
        return dest
    with (
        open(local_path, "rb") as source,
        hook.command_input(["sh", "-c", INSTALL_SCRIPT, "sh", dest, resolved["sha256"]]) as stdin,
    ):
        shutil.copyfileobj(source, stdin, 1 << 20)
    return dest


def provenance(shipped: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the summary, report and the model's event say of a warm start (the warm_start task's XCom):
    `{source, uri, sha256, run}`; None when the run named none."""
    if not isinstance(shipped, Mapping) or not shipped.get("source"):
        return None
    return {field: shipped.get(field) for field in FIELDS}
