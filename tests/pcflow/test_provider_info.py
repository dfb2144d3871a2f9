"""pcflow as an Airflow provider: Airflow finds it through its `apache_airflow_provider` entry point
(`make venv` installs the distribution), with the `slurm` connection type and its form, the hooks, the
triggers and the extra links, exactly as `airflow providers ...` and the UI's connection form read them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import airflow
import jsonschema
import pytest
from airflow.providers_manager import ProvidersManager

import pcflow
from pcflow.provider_info import EXTRA_LINKS, HOOK_MODULES, TRIGGER_MODULES, get_provider_info

FORM_FIELDS = {"host_key", "shared_root", "slurm_bin"}


@pytest.fixture(scope="module")
def manager() -> ProvidersManager:
    manager = ProvidersManager()
    if "pcflow" not in manager.providers:
        pytest.fail("the pcflow distribution is not installed in this environment: run `make venv`")
    return manager


def test_the_provider_info_is_valid_for_airflow():
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)
    assert get_provider_info()["versions"] == [pcflow.__version__]


def test_airflow_registers_the_hook_triggers_and_links(manager):
    assert manager.providers["pcflow"].version == pcflow.__version__
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    hook = ProvidersManagerTaskRuntime().hooks["slurm"]  # what a task's BaseHook.get_hook reads
    assert (hook.hook_class_name, hook.connection_id_attribute_name, hook.package_name, hook.hook_name) == (
        "pcflow.slurm.hook.SlurmHook",
        "ssh_conn_id",
        "pcflow",
        "Slurm (SSH)",
    )
    assert set(EXTRA_LINKS) <= set(manager.extra_links_class_names)
    ours = {t.trigger_class_name for t in manager.trigger if t.package_name == "pcflow"}
    assert ours == set(TRIGGER_MODULES)
    for module in HOOK_MODULES + TRIGGER_MODULES:
        __import__(module)


def test_the_connection_form_shows_the_slurm_extras(manager):
    """What the UI's connection form is built from (the API server's /ui/connections/hook_meta)."""
    from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService

    slurm = next(meta for meta in HookMetaService.hook_meta_data() if meta.connection_type == "slurm")
    assert slurm.hook_name == "Slurm (SSH)"
    assert set(slurm.extra_fields) == FORM_FIELDS
    assert slurm.extra_fields["shared_root"]["schema"]["title"] == "Shared root"
    assert slurm.standard_fields.url_schema.hidden
    assert slurm.standard_fields.host.title == "Head node"
    assert {f"extra__slurm__{name}" for name in FORM_FIELDS} <= set(manager.connection_form_widgets)
    assert manager.field_behaviours["slurm"]["hidden_fields"] == ["schema"]


def test_airflow_providers_list_shows_pcflow(tmp_path):
    """The CLI, in a process of its own (about 2 s)."""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "list", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    ).stdout
    listed = {p["package_name"]: p["version"] for p in json.loads(out[out.index("[") :])}
    assert listed["pcflow"] == pcflow.__version__
