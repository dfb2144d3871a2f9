"""What a Slurm job asks for, validated before anything reaches the cluster, and where its files live.

Values that end up in `#SBATCH` lines are read by sbatch, not by a shell, so quoting cannot protect
them: they must match strict patterns instead. Values the shell reads are quoted by the renderer.
Hyperparameters never touch shell text: they travel as `hparams.json`.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pcflow.paths import remote_within
from pcflow.patterns import ABS_PATH, ENTRY_POINT, SIMPLE_NAME, TIME_LIMIT

Launcher = Literal["srun", "torchrun", "vissl", "mpirun"]

# sbatch options a user may add beyond the modelled ones; anything else is refused by name.
ALLOWED_SBATCH_OPTIONS = frozenset(
    {
        "account",
        "qos",
        "constraint",
        "reservation",
        "mem",
        "mem-per-cpu",
        "mem-per-gpu",
        "gres",
        "gpus",
        "gpus-per-task",
        "gpu-bind",
        "cpu-bind",
        "hint",
        "distribution",
        "nice",
        "signal",
        "begin",
        "deadline",
        "mail-type",
        "mail-user",
        "licenses",
        "network",
        "switches",
        "wckey",
        "export",
        "nodelist",
        "exclude",
        "threads-per-core",
        "tmp",
        "overcommit",
        "oversubscribe",
        "contiguous",
    }
)
# A value sbatch reads from a directive: no whitespace, quotes, `#`, `$`, `;` or backslashes.
SBATCH_VALUE = re.compile(r"^[A-Za-z0-9_.,:=@%/+*\-\[\]]{1,256}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_ENV_PREFIXES = ("SLURM_", "PCFLOW_")
#: How `python` runs a `pkg.module:function` program: the shipped code first on the path, the function
#: called with sys.argv its arguments, its int return (or None: 0) the exit status. Arguments, not shell.
RUN_ENTRY_POINT = (
    "import importlib,sys;sys.path.insert(0,sys.argv[1]);m,_,f=sys.argv[2].partition(':');"
    "sys.argv=sys.argv[2:];r=getattr(importlib.import_module(m),f)();sys.exit(r if isinstance(r,int) else 0)"
)


SbatchValue = Annotated[str, Field(pattern=SBATCH_VALUE.pattern)]


class Resources(BaseModel):
    """The allocation: per-node tasks and GPUs, as ParallelCluster queues are sized."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: int = Field(1, ge=1, le=4096)
    tasks_per_node: int = Field(1, ge=1, le=512, description="processes per node (one per GPU for DDP)")
    gpus_per_node: int = Field(0, ge=0, le=64)
    cpus_per_task: int = Field(1, ge=1, le=1024)
    partition: Annotated[str, Field(pattern=SIMPLE_NAME.pattern)] | None = None
    time_limit: Annotated[str, Field(pattern=TIME_LIMIT.pattern)] | None = Field(
        None, description="Slurm time format: minutes, HH:MM:SS or D-HH:MM:SS"
    )
    exclusive: bool = False
    requeue: bool = True
    extra_sbatch: dict[str, SbatchValue | None] = Field(default_factory=dict)

    @field_validator("extra_sbatch")
    @classmethod
    def _allowed_options(cls, options: dict[str, str | None]) -> dict[str, str | None]:
        refused = sorted(set(options) - ALLOWED_SBATCH_OPTIONS)
        if refused:
            raise ValueError(
                f"sbatch option(s) not allowed: {', '.join(refused)}. Allowed extras: "
                f"{', '.join(sorted(ALLOWED_SBATCH_OPTIONS))}; nodes, tasks, GPUs, CPUs, partition, time limit, "
                "exclusive and requeue have their own fields."
            )
        return options


class ArraySpec(BaseModel):
    """A Slurm job array: `size` elements (trials) from one sbatch, at most `max_parallel` at a time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int = Field(ge=1, le=10000)
    max_parallel: int | None = Field(None, ge=1, le=10000)

    @property
    def directive(self) -> str:
        throttle = f"%{self.max_parallel}" if self.max_parallel else ""
        return f"0-{self.size - 1}{throttle}"


class ContainerMount(BaseModel):
    """A directory a container sees at the path it has outside (pcflow.slurm.images.Mount)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    path: Annotated[str, Field(pattern=ABS_PATH.pattern)]
    writable: bool = False


class ContainerLaunch(BaseModel):
    """The run's image as the prepare_image task left it on the cluster: how each task runs in it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    runtime: Literal["oci", "pyxis"]
    path: Annotated[str, Field(pattern=ABS_PATH.pattern)]  # the unpacked image (oci) or its squashfs (pyxis)
    shared_root: Annotated[str, Field(pattern=ABS_PATH.pattern)]
    reference: str
    digest: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
    imported: bool = False
    env: list[str] = Field(default_factory=list, max_length=256)
    mounts: list[ContainerMount] = Field(default_factory=list, max_length=64)

    def provenance(self) -> dict[str, Any]:
        """What the run records of its image: reference, digest, whether this run imported it."""
        return {"reference": self.reference, "digest": self.digest, "imported": self.imported, "runtime": self.runtime}


class JobSpec(BaseModel):
    """One job: a launcher, a program (argument list) and its resources, environment, hyperparameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    launcher: Launcher = "srun"
    program: list[str] = Field(min_length=1, description="program and arguments, one element each")
    python: str = Field("python3", description="interpreter on the cluster (for torchrun/vissl), e.g. a venv's")
    resources: Resources = Field(default_factory=Resources)
    env: dict[str, str] = Field(default_factory=dict)
    #: The cluster's network settings (EFA's libfabric, pcflow.cluster.fabric): exported by the batch script
    #: where `env` (sbatch's environment) does not set them.
    fabric_env: dict[str, str] = Field(default_factory=dict)
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    rdzv_port: int = Field(29500, ge=1024, le=64535, description="base port; the job id modulo 1000 is added")
    array: ArraySpec | None = None
    payload_dir: Annotated[str, Field(pattern=ABS_PATH.pattern)] | None = Field(
        None, description="the shipped payload on the cluster: `program` is a script in it, run with `python`"
    )
    hyperparameter_args: bool = Field(
        False, description="the hyperparameters also as `--key value` arguments after the program's own"
    )
    container: ContainerLaunch | None = Field(None, description="the imported image each task runs in")
    warm_start: Annotated[str, Field(pattern=ABS_PATH.pattern)] | None = Field(
        None, description="the model the job starts from on the cluster ($PCFLOW_WARM_START), read-only"
    )

    @field_validator("program")
    @classmethod
    def _program(cls, program: list[str]) -> list[str]:
        for arg in program:
            if "\0" in arg or len(arg) > 4096:
                raise ValueError("program arguments must be strings without NUL bytes, at most 4096 characters")
        return program

    @field_validator("python")
    @classmethod
    def _python(cls, python: str) -> str:
        if not (ABS_PATH.fullmatch(python) or SIMPLE_NAME.fullmatch(python)):
            raise ValueError(f"python must be a command name or an absolute path, got {python!r}")
        return python

    @field_validator("env", "fabric_env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"environment variable name {name!r} is not a valid shell identifier")
            if name.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(f"environment variable {name!r} is reserved for Slurm/pcflow")
            if "\0" in value:
                raise ValueError(f"environment variable {name!r} contains a NUL byte")
        return env

    @field_validator("hyperparameters")
    @classmethod
    def _json(cls, hyperparameters: dict[str, Any]) -> dict[str, Any]:
        try:
            json.dumps(hyperparameters, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"hyperparameters must be JSON (no NaN/inf, no objects): {exc}") from exc
        return hyperparameters

    @model_validator(mode="after")
    def _program_in_payload(self) -> JobSpec:
        script = self.program[0]
        if self.payload_dir is not None and (script.startswith("/") or ".." in script.split("/") or not script):
            raise ValueError(f"with a payload, program[0] is a path inside it (e.g. train.py), got {script!r}")
        return self

    @model_validator(mode="after")
    def _launcher_fits(self) -> JobSpec:
        if self.launcher in ("torchrun", "vissl") and self.resources.gpus_per_node not in (
            0,
            self.resources.tasks_per_node,
        ):
            raise ValueError(
                f"{self.launcher}: tasks_per_node ({self.resources.tasks_per_node}) should equal gpus_per_node "
                f"({self.resources.gpus_per_node}): one worker per GPU"
            )
        return self

    @property
    def total_tasks(self) -> int:
        return self.resources.nodes * self.resources.tasks_per_node

    @property
    def script(self) -> list[str]:
        """The program with its script resolved in the shipped payload (what `python` runs); a
        `pkg.module:function` is imported from the payload and called (RUN_ENTRY_POINT)."""
        if self.payload_dir is None:
            return list(self.program)
        if ENTRY_POINT.fullmatch(self.program[0]):
            return ["-c", RUN_ENTRY_POINT, self.payload_dir, *self.program]
        return [posixpath.join(self.payload_dir, self.program[0]), *self.program[1:]]

    @property
    def command(self) -> list[str]:
        """What each worker runs, interpreter included, whatever the launcher (torchrun with --no-python)."""
        return [self.python, *self.script] if self.payload_dir is not None else list(self.program)


#: In a run's directory: its view of the staged data partition (pcflow.dataset.stage_in.link_partition).
RUN_DATA = "data"


def under_runs(shared_root: str, *names: str) -> str:
    """`<shared root>/pcflow/runs/<names...>`: a run's directory (its key) or a job's (key, task). Refuses a
    shared root that is not a plain absolute path and a run key or task that is not a plain name, so the
    path cannot leave the runs directory."""
    if not ABS_PATH.fullmatch(shared_root or ""):
        raise ValueError(
            f"shared root must be an absolute path of letters, digits and _.@+-/ (got {shared_root!r}); set "
            "the SSH connection's `shared_root` extra or the operator's shared_root"
        )
    for part in names:
        if not SIMPLE_NAME.fullmatch(part) or part in (".", ".."):
            raise ValueError(f"run key and task must be simple names, got {part!r}")
    runs = posixpath.join(shared_root, "pcflow", "runs")
    return remote_within(posixpath.join(runs, *names), runs)


@dataclass(frozen=True)
class RunDir:
    """`<shared root>/pcflow/runs/<run key>/<task>/`: everything one job reads and writes."""

    root: str

    @classmethod
    def for_job(cls, shared_root: str, run_key: str, task: str) -> RunDir:
        """`<shared root>/pcflow/runs/<run key>/<task>` (`under_runs`)."""
        return cls(under_runs(shared_root, run_key, task))

    def _path(self, name: str) -> str:
        return posixpath.join(self.root, name)

    @property
    def parent(self) -> str:
        """The run's directory, `<shared root>/pcflow/runs/<run key>`, where its tasks have theirs."""
        return posixpath.dirname(self.root)

    @property
    def script(self) -> str:
        return self._path("job.sbatch")

    @property
    def hparams(self) -> str:
        return self._path("hparams.json")

    @property
    def log(self) -> str:
        return self._path("job.log")

    @property
    def metrics(self) -> str:
        return self._path("metrics.jsonl")

    @property
    def utilisation(self) -> str:
        """Samples of CPU/GPU/memory use, one JSON line per node and interval (pcflow/readings/sampler.py)."""
        return self._path("utilisation.jsonl")

    @property
    def sampler(self) -> str:
        """The utilisation sampler, uploaded at submit; one per job (array elements share it)."""
        return self._path("sampler.py")

    @property
    def marker(self) -> str:
        return self._path("exit.json")

    @property
    def submitted(self) -> str:
        return self._path("submitted")

    @property
    def checkpoints(self) -> str:
        return self._path("checkpoints")

    @property
    def bundle(self) -> str:
        """The job's OCI bundle (config.json, rootfs link) when it runs in a container (pcflow.slurm.images)."""
        return self._path("bundle")

    def element(self, index: int | str) -> RunDir:
        """The directory of one element of a job array."""
        return RunDir(self._path(str(index)))
