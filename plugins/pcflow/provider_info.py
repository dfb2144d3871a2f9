"""What Airflow's ProvidersManager learns about pcflow through the `apache_airflow_provider` entry
point: the `slurm` connection type and its form, the hooks, the triggers, the extra links.

Declarative, as Airflow 3.2+ asks (`conn-fields` and `ui-field-behaviour` here rather than the
deprecated `get_connection_form_widgets` on the hook): the connection form is built without
importing the hook. The form stores each field in the connection's extras under its own name, the
same keys as a connection written as JSON, so both kinds of connection read the same.
"""

from __future__ import annotations

from typing import Any

from pcflow import __version__

INTEGRATION = "pcflow"
SLURM_CONN_TYPE = "slurm"


def _text_field(label: str, description: str) -> dict[str, Any]:
    return {"label": label, "description": description, "schema": {"type": ["string", "null"]}}


#: The `slurm` connection's own extras, as form fields (SlurmHook reads them; SSHHook reads host_key).
SLURM_CONN_FIELDS = {
    "host_key": _text_field(
        "Host key",
        "The head node's public host key, '<type> <base64>' (ssh-keyscan -t ed25519 HOST, checked out of "
        "band). Pinned: a server with another key is refused. Empty when a cluster pcflow creates fills it in.",
    ),
    "shared_root": _text_field(
        "Shared root",
        "A directory every node of the cluster sees (e.g. /fsx on ParallelCluster): pcflow's run directories "
        "are made under it.",
    ),
    "slurm_bin": _text_field(
        "Slurm bin directory",
        "Where sbatch, squeue and sacct live when a non-login shell's PATH lacks them (e.g. /opt/slurm/bin).",
    ),
}

SLURM_FIELD_BEHAVIOUR = {
    "hidden-fields": ["schema"],
    "relabeling": {"host": "Head node", "login": "Username"},
    "placeholders": {
        "host": "the head node's address; empty when the cluster stage fills it in",
        "port": "22",
        "extra": '{"key_file": "/path/to/key"} or {"private_key": "..."}: the SSH provider\'s extras',
        "host_key": "ssh-ed25519 AAAA...",
        "shared_root": "/fsx",
        "slurm_bin": "/opt/slurm/bin",
    },
}

#: Modules whose hooks and triggers `airflow providers hooks|triggers` lists.
HOOK_MODULES = ["pcflow.slurm.hook", "pcflow.cluster.pcluster", "pcflow.aws.waits"]
TRIGGER_MODULES = ["pcflow.slurm.trigger", "pcflow.metrics.early_stop", "pcflow.cluster.triggers", "pcflow.aws.waits"]
EXTRA_LINKS = ["pcflow.metrics.links.MetricsReportLink", "pcflow.metrics.links.MetricsDashboardLink"]


def get_provider_info() -> dict[str, Any]:
    """What the `apache_airflow_provider` entry point hands Airflow's ProvidersManager: declarative, so Airflow
    builds the `slurm` connection form without importing the hook."""
    return {
        "package-name": "pcflow",
        "name": "pcflow",
        "description": "Distributed deep-learning training on AWS ParallelCluster (Slurm over SSH) from Airflow 3.",
        "versions": [__version__],
        "integrations": [{"integration-name": INTEGRATION, "tags": ["service"]}],
        "hooks": [{"integration-name": INTEGRATION, "python-modules": HOOK_MODULES}],
        "triggers": [{"integration-name": INTEGRATION, "python-modules": TRIGGER_MODULES}],
        "connection-types": [
            {
                "connection-type": SLURM_CONN_TYPE,
                "hook-class-name": "pcflow.slurm.hook.SlurmHook",
                "hook-name": "Slurm (SSH)",
                "conn-fields": SLURM_CONN_FIELDS,
                "ui-field-behaviour": SLURM_FIELD_BEHAVIOUR,
            }
        ],
        "extra-links": EXTRA_LINKS,
    }
