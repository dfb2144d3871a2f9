"""DAG files parse light, as the dag-processor re-parses them every few minutes: no boto3, paramiko,
asyncssh, provider hooks or pydantic run-spec models (operators import those when they run), and what
a task needs later is still found when only its own DAG file was parsed (as on a worker)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from dagrun import REPO

_spec = importlib.util.spec_from_file_location("dag_parse", REPO / "benchmarks" / "dag_parse.py")
dag_parse = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dag_parse)

PROBE = """
import json, runpy, sys
sys.path.insert(0, "plugins")
import airflow.sdk
before = set(sys.modules)
loaded = {}
for path in sys.argv[2:]:
    seen = set(sys.modules)
    runpy.run_path(path)
    new = set(sys.modules) - seen
    loaded[path] = [h for h in json.loads(sys.argv[1]) if any(m == h or m.startswith(h + ".") for m in new)]
print(json.dumps(loaded))
"""


def test_parsing_the_dag_files_loads_no_heavy_package():
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "dags").glob("*.py"))
    argv = [sys.executable, "-c", PROBE, json.dumps(dag_parse.HEAVY), *files]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert loaded == {f: [] for f in files}


@pytest.mark.parametrize("dag_file", ["dags/janitor.py", "dags/pretrain.py"])
def test_a_worker_that_parsed_only_its_dag_file_finds_the_cluster_teardown_handlers(dag_file):
    """The janitor's reap and the pipeline's teardown ask for `pcluster`, which the cluster stage registers
    when the DAG file imports it (pcflow.aws knows the set only by name)."""
    code = (
        f"import runpy, sys; sys.path.insert(0, 'plugins'); runpy.run_path({dag_file!r});"
        "from pcflow.aws.teardown import build_handlers;"
        "print(sorted({type(h).__name__ for h in build_handlers(lambda service: None, ['pcluster', 'ec2'])}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert "ParallelClusterStackHandler" in out.stdout and "VpcHandler" in out.stdout


TRAINING_DAG_FILES = {"pretrain.py", "pretrain_nightly.py", "pretrain_sweep.py"}


@pytest.mark.parametrize(
    ("offered", "complaint"),
    [
        ("aws-gpu", "PCFLOW_DEFAULT_PROFILE: 'local' is not among the profiles PCFLOW_OFFERED_PROFILES offers"),
        ("local, ghost", "PCFLOW_OFFERED_PROFILES: no profile file for 'ghost' in "),
    ],
)
def test_an_offer_without_the_default_or_with_a_missing_profile_stops_the_training_dags(
    monkeypatch, offered, complaint
):
    """The admin's mistake is an import error of each training DAG (the UI shows them), naming the
    setting: no run starts, none on a profile nobody offered. The janitor, which has no form, still runs."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("PCFLOW_DEFAULT_PROFILE", "local")
    monkeypatch.setenv("PCFLOW_OFFERED_PROFILES", offered)
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert {Path(path).name for path in bag.import_errors} == TRAINING_DAG_FILES
    assert all(complaint in error for error in bag.import_errors.values()), bag.import_errors
    assert sorted(bag.dag_ids) == ["janitor"]


def test_airflow_refuses_a_run_of_a_profile_the_form_does_not_offer(monkeypatch):
    """Airflow checks every new run's conf against the form (trigger form, REST API, CLI, backfill); the
    first task asks again for the profiles its worker offers (tests/pcflow/pipeline/test_conf_boundary.py)."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.definitions.param import ParamValidationError

    monkeypatch.setenv("PCFLOW_DEFAULT_PROFILE", "local")
    monkeypatch.setenv("PCFLOW_OFFERED_PROFILES", "local")
    params = DagBag(dag_folder=str(REPO / "dags")).dags["pretrain"].params
    params.validate()
    with pytest.raises(ParamValidationError, match="aws-gpu-rehearsal"):
        params["profile"] = "aws-gpu-rehearsal"  # what a run's conf does to the form's values
        params.validate()
