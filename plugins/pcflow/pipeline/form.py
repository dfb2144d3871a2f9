"""The trigger form: the Params (JSON schema) a person fills in to start a training run.

Every field is optional except the profile; empty means "as the profile says". Which settings a field may
change is the profile's call (its `overridable` section), checked by the first task (`settings.py`).
"""

from __future__ import annotations

from typing import Any

import yaml
from airflow.sdk import Param

from pcflow.code.schema_file import SCHEMA_FILE, local_summary
from pcflow.datasource import DIGITS
from pcflow.errors import ConfigurationError
from pcflow.paths import default_profile, offered_profiles
from pcflow.patterns import INSTANCE_TYPE, PARTITION
from pcflow.profiles import expand_paths, load_profile

#: The form's fields that change a run setting, by the setting's dotted path. Whether a trigger user
#: may change it is the profile's call (its `overridable` section), like everything in `overrides`.
FORM_FIELDS = {
    "dataset_source": "dataset.source",
    "partition": "dataset.partition",
    "instance_type": "instance_type",
    "capacity_type": "capacity_type",
    "nodes": "training.nodes",
    "gpus_per_node": "training.gpus_per_node",
    "tasks_per_node": "training.tasks_per_node",
    "launcher": "training.launcher",
    "hyperparameters": "training.hyperparameters",
    "code_git_url": "training.code.git.url",
    "code_git_ref": "training.code.git.ref",
    "teardown_policy": "teardown.policy",
    "early_stopping_patience": "metrics.early_stopping.patience",
    "budget_usd": "budget.usd",
    "trials_at_once": "sweep.max_parallel",  # the sweep's form only (sweep_params)
}
#: The form's other fields: which profile, the sweep's trials and grid, and the advanced overrides.
OTHER_FIELDS = ("profile", "trials", "grid", "overrides")


def profile_param() -> Param:
    """Which profile: the deployment's default (`PCFLOW_DEFAULT_PROFILE`), chosen among those the admin
    offers (`PCFLOW_OFFERED_PROFILES`; unset: every profile found). A setting that leaves the default out
    or names a profile with no file raises here, so the DAG files do not import and the admin reads why
    among the UI's import errors. Without a default the field starts empty, and a run that leaves it so (a
    scheduled one too) is refused by the first task: no run falls back to a profile nobody chose."""
    choices = offered_profiles()
    chosen = default_profile()
    schema: dict[str, Any] = {"type": "string", "enum": choices}
    if chosen is None:
        schema = {"type": ["null", "string"], "enum": [None, *choices], "values_display": {"null": "choose one"}}
    return Param(
        chosen,
        **schema,
        title="Profile",
        description=f"Where the run happens and what it may change (the admin offers: {', '.join(choices)}).",
        section="Where",
    )


def training_params(*, partition: str | None = None, extra: dict[str, Param] | None = None) -> dict[str, Param]:
    """The trigger form: every field optional except the profile; empty means "as the profile says".
    A field the chosen profile does not list as overridable is refused by the first task when set.
    `extra` (a DAG's own fields) comes after the training fields, before cleanup and overrides."""
    return {
        "profile": profile_param(),
        **data_fields(partition),
        **resource_fields(),
        **training_fields(),
        **(extra or {}),
        **cost_and_cleanup_fields(),
    }


def optional(kind: str, **schema: Any) -> dict[str, Any]:
    """A JSON-schema type that also accepts null: an empty field means "as the profile says"."""
    return {"type": ["null", kind], **schema}


def optional_choice(*values: str) -> dict[str, Any]:
    """A select whose empty choice reads as what it means (the UI labels None by the key "null")."""
    return {"type": ["null", "string"], "enum": [None, *values], "values_display": {"null": "as the profile says"}}


def data_fields(partition: str | None) -> dict[str, Param]:
    """The form's Data section: the dataset source and the partition."""
    return {
        "dataset_source": Param(
            None,
            **optional("string", maxLength=1024),
            title="Dataset source",
            description="A directory under one of the profile's dataset roots, `s3://bucket/prefix`, or "
            f"`{DIGITS}`; empty: the profile's.",
            section="Data",
        ),
        "partition": Param(
            partition,
            **optional("string", pattern=PARTITION.pattern),
            title="Data partition",
            description="Folder of this run's data under the dataset prefix; scheduled runs use their date.",
            section="Data",
        ),
    }


def resource_fields() -> dict[str, Param]:
    """The form's Resources section: instance type, capacity, nodes and per-node counts."""
    return {
        "instance_type": Param(
            None,
            **optional("string", pattern=INSTANCE_TYPE.pattern),
            title="Instance type",
            description="EC2 type of the compute nodes, e.g. g5.12xlarge or p4d.24xlarge.",
            examples=["g5.12xlarge", "g5.48xlarge", "p4d.24xlarge", "p5.48xlarge"],
            section="Resources",
        ),
        "capacity_type": Param(
            None,
            **optional_choice("spot", "ondemand"),
            title="Capacity",
            description="Spot (cheaper, may be interrupted: jobs requeue and resume) or on-demand.",
            section="Resources",
        ),
        "nodes": Param(None, **optional("integer", minimum=1, maximum=512), title="Nodes", section="Resources"),
        "gpus_per_node": Param(
            None, **optional("integer", minimum=0, maximum=16), title="GPUs per node", section="Resources"
        ),
        "tasks_per_node": Param(
            None,
            **optional("integer", minimum=1, maximum=128),
            title="Processes per node",
            description="One per GPU for DDP; on CPU, the number of workers per node.",
            section="Resources",
        ),
    }


def training_fields() -> dict[str, Param]:
    """The form's Training section: launcher, hyperparameters (data, never shell text) and early stopping."""
    return {
        "launcher": Param(
            None,
            **optional_choice("srun", "torchrun", "vissl", "mpirun"),
            title="Launcher",
            section="Training",
        ),
        "code_git_url": Param(
            None,
            **optional("string", maxLength=1024),
            title="Code: git repository",
            description="Train this repository's code instead of the profile's (README, \"Your own code\"); "
            "under a URL the profile allows. Empty: the profile's code.",
            section="Training",
        ),
        "code_git_ref": Param(
            None,
            **optional("string", maxLength=200),
            title="Code: branch, tag or commit",
            description="Resolved to a commit when the run starts; every task then uses that commit. Empty: main.",
            section="Training",
        ),
        "hyperparameters": Param(
            {},
            type="object",
            title="Hyperparameters",
            description=hyperparameters_description(),
            section="Training",
        ),
        "early_stopping_patience": Param(
            None,
            **optional("integer", minimum=1, maximum=10000),
            title="Early stopping patience",
            description="Stop a trial (scancel, recorded as stopped early, not failed) whose objective has not "
            "improved for this many evaluations, or has become NaN/inf; empty: as the profile says (off).",
            section="Training",
        ),
    }


def hyperparameters_description() -> str:
    """The hyperparameters field's help: how they reach the job, and the names, types and bounds the default
    profile's code declares (pcflow.code.hparams), where that code is on this machine (a directory, the
    admin's payload). Read when the DAG file is parsed, from local files only: a git or S3 code's schema is
    read by the first task, which checks the run against it."""
    text = (
        "Merged over the profile's (epochs, batch_size, lr, temperature, ...). Written to a JSON file the job "
        f"reads; never passed through a shell. Where the run's code holds {SCHEMA_FILE} (a JSON schema), the "
        "first task refuses names, types and values it does not allow, before anything is spent."
    )
    profile = default_profile()
    try:
        training = expand_paths(load_profile(profile)).get("training") or {} if profile else {}
        listed = local_summary(training) if isinstance(training, dict) else None
    except (ConfigurationError, OSError, ValueError, yaml.YAMLError):  # the first task says what is wrong
        listed = None
    return f"{text} Profile {profile!r}'s code declares: {listed}." if listed else text


def cost_and_cleanup_fields() -> dict[str, Param]:
    """The form's Cost and Cleanup sections, and the advanced overrides: placed last, after a DAG's own fields."""
    return {
        "budget_usd": Param(
            None,
            **optional("number", exclusiveMinimum=0, maximum=1_000_000),
            title="Budget (USD)",
            description="The most this run may cost (compute nodes, head node, FSx). The first task refuses a run "
            "whose maximum (price per hour x time limit x trials) is above it; empty: the profile's budget.",
            section="Cost",
        ),
        "teardown_policy": Param(
            None,
            **optional_choice("always", "never"),
            title="Teardown",
            description="`always`: delete this run's resources when it ends, failed or not; `never`: keep them "
            "(the janitor removes them when their TTL expires).",
            section="Cleanup",
        ),
        "overrides": Param(
            {},
            type="object",
            title="Advanced overrides",
            description="Other settings by their path, deep-merged last, e.g. "
            '{"metrics": {"early_stopping": {"min_delta": 0.01}}}: only those the profile lists as overridable.',
            section="Advanced",
        ),
    }


MAX_TRIALS = 1000


def sweep_params() -> dict[str, Param]:
    """The sweep's own fields: a list of trials, each crossed with every point of a grid, and how many of them
    run at once."""
    return {
        "trials": Param(
            [{"lr": 0.001}, {"lr": 0.002}, {"lr": 0.004}],
            type="array",
            minItems=1,
            maxItems=MAX_TRIALS,
            items={"type": "object"},
            title="Trials",
            description='One hyperparameter object per trial, e.g. [{"lr": 0.001}, {"lr": 0.01}]; laid over the '
            "profile's hyperparameters.",
            section="Sweep",
        ),
        "grid": Param(
            {},
            type="object",
            additionalProperties={"type": "array", "minItems": 1},
            title="Grid",
            description='Values to try per hyperparameter, e.g. {"lr": [0.001, 0.01], "temperature": [0.1, 0.5]}: '
            "every trial above is crossed with every combination (grid values win), so trials [{}] runs the "
            f"plain grid. At most {MAX_TRIALS} trials in all.",
            section="Sweep",
        ),
        "trials_at_once": Param(
            None,
            **optional("integer", minimum=1, maximum=MAX_TRIALS),
            title="Trials at once",
            description="How many trials run side by side, each on nodes of its own (1: one after another); "
            "empty: the profile's sweep.max_parallel, within the bounds it allows.",
            section="Sweep",
        ),
    }
