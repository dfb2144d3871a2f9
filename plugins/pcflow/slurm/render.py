"""Render a JobSpec into a batch script from the launcher's Jinja template (package data: `templates/`)."""

from __future__ import annotations

import json
import posixpath
import shlex
from functools import cache

import jinja2

from pcflow.errors import ConfigurationError
from pcflow.patterns import ABS_PATH, SIMPLE_NAME
from pcflow.slurm.spec import SBATCH_VALUE, JobSpec, RunDir

#: The batch templates' directory in the package (`<launcher>.sbatch.j2`, and `_base.sbatch.j2` they extend).
TEMPLATES = "templates"


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pcflow.slurm", TEMPLATES),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # shell, not HTML: quoting is explicit through the filters below
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    env.filters["qargs"] = lambda values: shlex.join(str(v) for v in values)
    return env


def sbatch_directives(spec: JobSpec, run_dir: RunDir, job_name: str) -> list[str]:
    """The `#SBATCH` options, each re-checked against the directive pattern before it is written."""
    res = spec.resources
    per_node_launcher = spec.launcher in ("torchrun", "vissl")
    directives = {
        "job-name": job_name,
        # An array element's log is <run dir>/<index>/job.log (%a: the element's index).
        "output": run_dir.element("%a").log if spec.array else run_dir.log,
        "open-mode": "append",
        "chdir": run_dir.root,
        "nodes": str(res.nodes),
        # torchrun/VISSL start one launcher per node that forks the per-GPU workers.
        "ntasks-per-node": "1" if per_node_launcher else str(res.tasks_per_node),
        "cpus-per-task": str(res.cpus_per_task * (res.tasks_per_node if per_node_launcher else 1)),
    }
    if spec.array:
        directives["array"] = spec.array.directive
    if res.gpus_per_node:
        directives["gpus-per-node"] = str(res.gpus_per_node)
    if res.partition:
        directives["partition"] = res.partition
    if res.time_limit:
        directives["time"] = res.time_limit
    lines = [f"--{key}={value}" for key, value in directives.items()]
    if res.exclusive:
        lines.append("--exclusive")
    lines.append("--requeue" if res.requeue else "--no-requeue")
    lines += [f"--{key}={value}" if value else f"--{key}" for key, value in sorted(res.extra_sbatch.items())]
    for line in lines:
        if not SBATCH_VALUE.fullmatch(line.lstrip("-")):
            raise ConfigurationError(
                f"refusing to write the sbatch directive {line!r}: it has characters sbatch would misread"
            )
    return lines


def render_batch_script(spec: JobSpec, run_dir: RunDir, *, job_name: str, run_key: str) -> str:
    """The job's batch script from its launcher's template; every shell value quoted by the template's filters,
    every `#SBATCH` line re-checked. A job name that is not a plain name is refused."""
    if not SIMPLE_NAME.fullmatch(job_name):
        raise ConfigurationError(f"job name must be letters, digits and _.- (got {job_name!r})")
    try:
        template = _environment().get_template(f"{spec.launcher}.sbatch.j2")
    except jinja2.TemplateNotFound as exc:
        raise FileNotFoundError(
            f"no batch template for launcher {spec.launcher!r} in pcflow.slurm's {TEMPLATES}/: "
            "the pcflow installation is incomplete (reinstall the package)"
        ) from exc
    return template.render(
        directives=sbatch_directives(spec, run_dir, job_name),
        run_dir=run_dir,
        run_key=run_key,
        launcher=spec.launcher,
        array=spec.array is not None,
        command=spec.command,
        payload_dir=spec.payload_dir,
        warm_start=spec.warm_start,
        fabric_env=spec.fabric_env,
        hyperparameter_args=spec.hyperparameter_args,
        python=spec.python,
        procs_per_node=spec.resources.tasks_per_node,
        rdzv_port=spec.rdzv_port,
        container_args=container_options(spec, run_dir),
    )


def container_options(spec: JobSpec, run_dir: RunDir) -> list[str]:
    """The srun options that run each task in the run's image (pcflow.slurm.images); none without one."""
    if spec.container is None:
        return []
    from pcflow.slurm.images import srun_options

    return srun_options(spec.container.model_dump(), run_dir.bundle, container_mounts(spec, run_dir), run_dir.root)


def container_mounts(spec: JobSpec, run_dir: RunDir) -> list:
    """The directories the job's container sees: its run's, its code, its data (the `data_dir` the train
    task sets), its warm-start model's and the admin's."""
    from pcflow.runspec import DATA_DIR
    from pcflow.slurm.images import job_mounts

    data = spec.hyperparameters.get(DATA_DIR)
    extra = [{"path": data}] if isinstance(data, str) and ABS_PATH.fullmatch(data) else []
    extra += [{"path": posixpath.dirname(spec.warm_start)}] if spec.warm_start else []  # read-only
    extra += [m.model_dump() for m in spec.container.mounts] if spec.container else []
    return job_mounts(run_dir.root, spec.payload_dir, extra)


def render_hparams(spec: JobSpec) -> str:
    """hparams.json's text: sorted keys, so the same hyperparameters give the same file; NaN/inf refused."""
    return json.dumps(spec.hyperparameters, indent=2, sort_keys=True, allow_nan=False) + "\n"
