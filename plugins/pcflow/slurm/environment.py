"""The job's Python environment (`training.python`, `<env>/bin/python`) verified on the cluster before a
job runs in it, never trusted because it exists.

Where an environment is built (the image bake on aws-gpu, `include/ami/bootstrap.sh`;
`include/payloads/install-payload-env.sh` on this machine) its integrity record is written beside its
files: `<env>/.pcflow-record/` holds every file's sha256, its symbolic links, and a marker with the hash
of both (include/ami/tree-record.sh). Before each run's job the check (`pcflow.slurm.trees.check_tree`)
verifies the marker and that no user but root or pcflow's own can change the environment: every entry
owned by one of them and writable by neither group nor others, nor any directory above it. It hashes
every file, and compares the file set and links with the record, when this record has not been
verified in full on this cluster yet, or when anything in the environment changed status since (its
ctime, which no user can set back): the last full verification is kept per cluster in
`<shared root>/pcflow/verified-environments/`, a directory only pcflow's user can enter. Why not a
full check every run: docs/security.md ("Staged code and environments").

A missing or mismatching record refuses the run (not retried), saying how to rebuild the environment.
"""

from __future__ import annotations

import hashlib
import posixpath
import time
from typing import TYPE_CHECKING, Any

from pcflow.errors import ConfigurationError
from pcflow.patterns import ABS_PATH
from pcflow.slurm.trees import TreeCheck, check_tree

if TYPE_CHECKING:
    from pcflow.slurm.hook import SlurmHook

STATE_DIR = "verified-environments"
#: A full check hashes the whole environment (a CUDA build of PyTorch: several GiB) on the head node.
CHECK_TIMEOUT_S = 1800
REBUILD = (
    "Rebuild it where it is built: on this machine `rm -rf {env} && make payload-env` (or "
    "include/payloads/install-payload-env.sh {env}); on aws-gpu bake a new image (include/ami/bootstrap.sh "
    "writes the record; a new recipe, e.g. a changed bootstrap script, bakes one). An environment built by "
    "other means gets its record from `bash include/ami/tree-record.sh write <env>`, run by root or pcflow's "
    "user once it is complete."
)


class EnvironmentRefused(ConfigurationError):
    """The job's environment is missing, has no integrity record, or does not match it."""


def environment_dir(python: str) -> str:
    """`<env>` of `<env>/bin/<interpreter>`: the only form whose environment can be checked."""
    if (
        not isinstance(python, str)
        or not ABS_PATH.fullmatch(python)
        or posixpath.basename(posixpath.dirname(python)) != "bin"
    ):
        raise EnvironmentRefused(
            f"training.python {python!r} is not an environment's interpreter (`/<env>/bin/python`): a job runs "
            "the payload only in an environment pcflow can verify. " + REBUILD.format(env="<env>")
        )
    return posixpath.dirname(posixpath.dirname(python))


def state_path(shared_root: str, env: str) -> str:
    """Where this cluster keeps the record an environment was last verified in full with."""
    return posixpath.join(shared_root, "pcflow", STATE_DIR, hashlib.sha256(env.encode()).hexdigest()[:20])


def verify_environment(hook: SlurmHook, python: str, *, shared_root: str, log: Any) -> dict[str, Any]:
    """Check the environment of `python` on the cluster; refuses the run when it does not match its record."""
    env = environment_dir(python)
    state = state_path(shared_root, env)
    begun = time.monotonic()
    checked = check_tree(hook, env, state=state, timeout=CHECK_TIMEOUT_S)
    if not checked.ok or checked.record is None:
        raise EnvironmentRefused(refusal(python, checked))
    if checked.full:
        remember(hook, state, checked)
    seconds = round(time.monotonic() - begun, 2)
    how = "every file hashed" if checked.full else "record, owners and modes; nothing changed since its full check"
    log.info("environment %s matches its record %s (%s, %.2f s)", env, checked.record[:16], how, seconds)
    return {"dir": env, "record": checked.record, "full_check": checked.full, "check_s": seconds}


def refusal(python: str, checked: TreeCheck) -> str:
    """Why the environment is refused and how the admin rebuilds it, from the check's findings."""
    env = checked.directory
    if checked.absent:
        what = "it does not exist on the cluster"
    elif checked.findings and checked.findings[0].startswith("no-record"):
        what = "it has no integrity record (.pcflow-record/): nothing says what it should hold"
    elif checked.findings:
        what = f"it does not match its record: {checked.summary()}"
    else:
        what = "its check printed no record (the check did not run to its end)"
    return (
        f"training.python {python}: the environment {env} is not verified, so no job runs in it: {what}. "
        + REBUILD.format(env=env)
    )


def remember(hook: SlurmHook, state: str, checked: TreeCheck) -> None:
    """Keep the record verified in full, dated when the check began: a change made during it counts as newer."""
    hook.make_private_dirs(posixpath.dirname(state))
    hook.write_file(state, checked.record or "")
    if checked.started:
        hook.run(["touch", "-d", f"@{checked.started}", "--", state])
