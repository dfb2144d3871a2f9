"""`make example EXAMPLE=resnet`: train a project of examples/ from its own git repository on the local stack.

The folder becomes a bare git repository under the stack's directory (`<stack>/examples/<name>.git`, one
commit on `main` with a fixed author and date, so an unchanged folder is the same commit), and the
`pretrain` DAG trains it on the local profile as any user's repository: the first task resolves `main`
to that commit, the code is bundled, uploaded once and staged by its content hash, the environment built
from the project's requirements once, and the summary says what each of those cost. The project's own
`pcflow-runs.json` holds what it asks of a profile (program, requirements, dataset mode, objective,
hyperparameters).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dagrun import REPO, DagRunResult
from demo import left_tagged, prepare, run_outcome, run_with_progress

EXAMPLES = REPO / "examples"
RUNS_FILE = "pcflow-runs.json"
#: The commit's author and committer, and its date: what makes an unchanged folder the same commit.
IDENTITY = {
    "GIT_AUTHOR_NAME": "pcflow examples",
    "GIT_AUTHOR_EMAIL": "examples@pcflow.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "pcflow examples",
    "GIT_COMMITTER_EMAIL": "examples@pcflow.invalid",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
}
#: The tasks of the code path after the ref's resolution: bundle + upload + stage, the environment.
CODE_PATH_TASKS = ("ship_payload", "prepare_environment", "check_environment")
#: A container's interpreter on the local stack: the payload environment the local profile mounts read-only
#: into every container (`cluster.containers.mounts`); it holds what the examples' requirements pin.
PAYLOAD_PYTHON = REPO / ".venv-payload" / "bin" / "python"


def git(*args: str, git_dir: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """git with no user or system configuration (no signing, hooks or templates of this machine's)."""
    clean = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", **IDENTITY, **(env or {})}
    argv = ["git", f"--git-dir={git_dir}", *args]
    return subprocess.run(argv, env=clean, cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def publish(folder: Path, repo: Path, branch: str = "main") -> str:
    """`folder`'s files (less what its .gitignore names) as the tip of `branch` in the bare repository
    `repo` (made when missing); returns the commit. An unchanged folder leaves the tip as it is; a
    changed one gets a commit on top of it, so earlier commits stay resolvable."""
    if not (repo / "HEAD").exists():
        repo.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "--quiet", "--bare", "--initial-branch", branch, str(repo)], check=True)
    with tempfile.TemporaryDirectory(prefix="pcflow-example-index-") as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(f"--work-tree={folder}", "add", "--all", ".", git_dir=repo, env=index, cwd=folder)
        tree = git("write-tree", git_dir=repo, env=index)
    ref = f"refs/heads/{branch}"
    tip = git("rev-parse", "--verify", "--quiet", ref, git_dir=repo) if has_ref(repo, ref) else ""
    if tip and git("rev-parse", f"{tip}^{{tree}}", git_dir=repo) == tree:
        return tip
    parents = ["-p", tip] if tip else []
    message = f"{folder.name} as of pcflow's examples/{folder.name}"
    commit = git("commit-tree", tree, *parents, "-m", message, git_dir=repo)
    git("update-ref", ref, commit, *([tip] if tip else []), git_dir=repo)
    return commit


def repository_of(name: str) -> Path:
    """Where example `name`'s bare repository lives: under the stack's directory, a root the local
    profile lets git code come from (`{stack}/examples`)."""
    return Path(os.environ.get("PCFLOW_STACK_DIR", REPO / ".stack")) / "examples" / f"{name}.git"


def has_ref(repo: Path, ref: str) -> bool:
    """Whether the bare repository has `ref` yet (the first publish has none)."""
    done = subprocess.run(["git", f"--git-dir={repo}", "show-ref", "--verify", "--quiet", ref], check=False)
    return done.returncode == 0


def conf_for(name: str, repo: Path, profile: str = "local", container: str | None = None) -> dict[str, Any]:
    """The DAG run's conf: the project's own settings for `profile`, its code from `repo`'s main; with
    `container` (an image reference), run in that image with the local profile's mounted payload
    environment as its interpreter. The image is then the environment: the project's `requirements`
    are not built (a run in a container builds none), so its pins must be what the image holds."""
    runs = json.loads((EXAMPLES / name / RUNS_FILE).read_text())
    if profile not in runs:
        raise SystemExit(f"examples/{name}/{RUNS_FILE} has no settings for profile {profile!r}: {sorted(runs)}")
    overrides = json.loads(json.dumps(runs[profile]))
    training = overrides.setdefault("training", {})
    # The conf's `training.code` replaces the profile's payload (runspec.one_code_source): no `payload: null`.
    training["code"] = {"git": {"url": repo.resolve().as_uri(), "ref": "main"}}
    if container:
        training.pop("requirements", None)
        training["container"] = {"image": container, "python": str(PAYLOAD_PYTHON)}
    return {"profile": profile, "overrides": overrides}


def resolve_seconds(repo: Path, ref: str = "main") -> float:
    """How long resolving `ref` takes: the `git ls-remote` the first task runs (pcflow.code.sources), timed
    here because `validate`'s own duration is mostly its AWS checks (network, cost, the cluster's preflight)."""
    started = time.perf_counter()
    git("ls-remote", "--", repo.resolve().as_uri(), ref, git_dir=repo)
    return round(time.perf_counter() - started, 2)


def task_seconds(dag_id: str, run_id: str) -> dict[str, float]:
    """How long each task instance of the run took (its last try), from the metadata database."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(TaskInstance).filter(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        return {ti.task_id: round(ti.duration or 0.0, 2) for ti in rows}


def summarize_code(result: DagRunResult, seconds: dict[str, float], wall: float, resolve_s: float) -> dict[str, Any]:
    """What the code path did (from the tasks' returned values and durations, and the ref's resolution
    `resolve_s`), and how the run ended."""
    out = result.returned
    code = out.get("ship_payload") or {}
    env = out.get("prepare_environment") or {}
    image = out.get("prepare_image") or {}
    objective = (out.get("metrics") or {}).get("objective")
    overhead = {"resolve": resolve_s, **{task: seconds[task] for task in CODE_PATH_TASKS if task in seconds}}
    return {
        **run_outcome(result, wall),
        "code": {k: code.get(k) for k in ("digest", "source", "url", "commit", "dirty", "bytes", "files", "reused")},
        "uploaded_bytes": code.get("uploaded_bytes"),
        "environment": {k: env.get(k) for k in ("id", "built", "build_s")} if env else None,
        "image": {k: image.get(k) for k in ("reference", "digest", "imported")} if image.get("reference") else None,
        "image_imported": bool(image.get("imported")),
        "code_path_s": {**overhead, "total": round(sum(overhead.values()), 2)},
        "validate_s": seconds.get("validate"),  # all of the first task's checks, the resolution among them
        "objective": objective,
        "left_tagged_with_run_key": left_tagged(result),
    }


def verdict(name: str, summary: dict[str, Any]) -> tuple[bool, str]:
    """A one-line account of the run, and whether it succeeded and left nothing tagged."""
    code, env, objective = summary["code"], summary["environment"] or {}, summary["objective"] or {}
    ok = summary["state"] == "success" and not summary["left_tagged_with_run_key"]
    built = "built" if env.get("built") else ("reused" if env.get("id") else "none")
    line = (
        f"pcflow example {name}: {'OK' if ok else 'FAILED'} - run {summary['state']}, "
        f"code {str(code.get('digest'))[:12]} at commit {str(code.get('commit'))[:12]}, "
        f"{summary['uploaded_bytes']} bytes uploaded, environment {built}, "
        f"image {'imported' if summary['image_imported'] else 'not imported'}, "
        f"code path {summary['code_path_s']['total']} s, {objective.get('name')} {objective.get('value')}, "
        f"{len(summary['left_tagged_with_run_key'])} resources left, {summary['seconds']} s"
    )
    return ok, line


def main(argv: list[str]) -> int:
    """Publish the example, train it through `pretrain` (in the image `argv[2]` names, if any), print the
    summary; 0 when it succeeded clean."""
    name = argv[1] if len(argv) > 1 else "resnet"
    container = argv[2] if len(argv) > 2 and argv[2] else None
    folder = EXAMPLES / name
    if not (folder / RUNS_FILE).is_file():
        known = sorted(p.name for p in EXAMPLES.iterdir() if (p / RUNS_FILE).is_file())
        raise SystemExit(f"no example {name!r} (examples/<name>/{RUNS_FILE}); known: {', '.join(known)}")
    repo = repository_of(name)
    commit = publish(folder, repo)
    print(f"pcflow example: examples/{name} is {repo.as_uri()} main = {commit}", flush=True)
    prepare()
    conf = conf_for(name, repo, container=container)

    def summarize(result: DagRunResult, wall: float) -> dict[str, Any]:
        """The summary of this run, with its tasks' durations."""
        return summarize_code(result, task_seconds(result.dag_id, result.run_id), wall, resolve_seconds(repo))

    summary = run_with_progress(f"example-{name}", "pretrain", conf, summarize)
    print(json.dumps(summary, indent=2, default=str))
    ok, line = verdict(name, summary)
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
