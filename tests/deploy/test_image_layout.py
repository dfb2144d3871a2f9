"""The DAGs load in the image as docker-compose.yaml runs it: the wheel installed where the Dockerfile
installs it (deploy.image), dags/, plugins/ and include/ where compose mounts them, the service's
environment as compose resolves it (deploy.compose) on top of the image's ENV, the image's working
directory, and pcflow imported from the wheel alone: nothing of the checkout is on the path, so a file
pcflow finds beside its own source in a checkout must be found here from the image's layout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from airflow_services import Container

from deploy.compose import Project, Service, fill_env_file
from deploy.image import REPO

#: The parse a DAG processor (and a worker, before each task) does: the DAG folder Airflow's settings
#: name, every file in it imported; what it found, and where pcflow came from.
PARSE = """
import json
import pcflow
from airflow.dag_processing.dagbag import DagBag
bag = DagBag()
print(json.dumps({"pcflow": pcflow.__file__, "folder": str(bag.dag_folder), "errors": bag.import_errors,
                  "files": sorted({dag.fileloc for dag in bag.dags.values()})}))
"""
TRAINING_DAG_FILES = {"pretrain.py", "pretrain_nightly.py", "pretrain_sweep.py"}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    """docker-compose.yaml resolved with a `.env` filled in as README.md says (compose's own profiles)."""
    return Project.resolve(fill_env_file(tmp_path_factory.mktemp("compose") / ".env"))


def run_in(image, service: Service, root: Path, script: str, *, unset: tuple[str, ...] = ()) -> Any:
    """`script` run by the image's Python in `service`'s container, mapped onto `root`; its last line's JSON."""
    container = Container(service, f"{service.name}-1", root, endpoints={})
    env = {k: v for k, v in container.environment(image.environment()).items() if k not in unset}
    # -P: the working directory is not put on sys.path (the image's `airflow` script does not put it there).
    argv = [sys.executable, "-P", "-c", script]
    cwd = container.path(image.dockerfile.workdir)
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("service", ["airflow-dag-processor", "airflow-worker"])
def test_every_dag_imports_in_the_image_as_compose_runs_it(image, project, tmp_path, service):
    parsed = run_in(image, project.services[service], tmp_path, PARSE)
    assert parsed["pcflow"].startswith(str(image.site) + "/"), parsed["pcflow"]
    assert parsed["errors"] == {}
    assert Path(parsed["folder"]).resolve() == REPO / "dags"
    assert {Path(f).name for f in parsed["files"]} == {p.name for p in (REPO / "dags").glob("*.py")}


@pytest.mark.parametrize(
    ("drop", "complaint"),
    [
        ("mount", "PCFLOW_INCLUDE_DIR: {home}/include is not a directory; mount the checkout's include/ there"),
        ("setting", "PCFLOW_INCLUDE_DIR is not set and pcflow is installed in {site}, not in a checkout"),
    ],
)
def test_a_deployment_without_include_is_told_which_setting_to_fix(image, project, tmp_path, drop, complaint):
    """An orchestrator that mounts only dags/, or names no include directory: each training DAG's import
    error says what to set, never a path guessed beside site-packages. The janitor has no form: it loads."""
    spec = dict(project.services["airflow-dag-processor"].spec)
    if drop == "mount":
        spec["volumes"] = [m for m in spec["volumes"] if m["source"] != str(REPO / "include")]
    unset = ("PCFLOW_INCLUDE_DIR",) if drop == "setting" else ()
    parsed = run_in(image, Service("airflow-dag-processor", spec), tmp_path, PARSE, unset=unset)
    expected = complaint.format(home=tmp_path / "homes" / "airflow-dag-processor-1", site=image.site)
    assert {Path(f).name for f in parsed["errors"]} == TRAINING_DAG_FILES
    assert all(expected in error for error in parsed["errors"].values()), parsed["errors"]
    assert [Path(f).name for f in parsed["files"]] == ["janitor.py"]


PCLUSTER = """
import json, sys
from pcflow.cluster.pcluster import ParallelClusterHook, PclusterNotInstalled
try:
    found = str(ParallelClusterHook(pcluster_path=None).pcluster_path)
except PclusterNotInstalled as exc:
    found = exc.pcluster_message
print(json.dumps(found))
"""


def test_the_workers_run_the_pcluster_cli_the_image_installs(image, project, tmp_path):
    """The worker's `pcluster` is the one the Dockerfile's pcluster layer installs (its ENV names it); a
    process of the image without that setting is told to set it, not sent to a `.venv-pcluster` beside
    site-packages. (The CLI itself is not laid out here: its answer is "no pcluster CLI at <that path>".)"""
    installer = next(s for s in image.dockerfile.steps if s.keyword == "RUN" and "install-pcluster.sh" in s.args)
    cli = image.dockerfile.env["PCFLOW_PCLUSTER"]
    assert cli == installer.args.split()[-1] + "/bin/pcluster"
    worker = project.services["airflow-worker"]
    assert run_in(image, worker, tmp_path, PCLUSTER).startswith(f"no pcluster CLI at {cli}:")
    unset = run_in(image, worker, tmp_path, PCLUSTER, unset=("PCFLOW_PCLUSTER",))
    assert unset.startswith("PCFLOW_PCLUSTER is not set and pcflow is installed, not in a checkout"), unset


#: What a worker ships for the default profile's run: its payload's directory and the image's requirements.
PAYLOAD = """
import json
from pcflow.paths import default_profile, payload_source
from pcflow.runspec import RunSpecError, resolve_run_spec
try:
    spec = resolve_run_spec(default_profile())
    found = {"payload": str(payload_source(spec.training.payload)), "environment": spec.ami.environment}
except RunSpecError as exc:
    found = {"refused": str(exc)}
print(json.dumps(found))
"""


def test_the_workers_ship_the_payload_the_default_profile_trains_from_the_examples_mount(image, project, tmp_path):
    """The profile's `training.payload: simclr` is examples/simclr, which compose mounts and names
    (PCFLOW_EXAMPLES_DIR): the worker packs it from there, and the bake installs its requirements. Without
    the mount the run is refused, naming where a payload may be."""
    worker = project.services["airflow-worker"]
    found = run_in(image, worker, tmp_path / "mounted", PAYLOAD)
    assert found == {
        "payload": str(REPO / "examples" / "simclr"),
        "environment": str(REPO / "examples" / "simclr" / "requirements.txt"),
    }
    spec = dict(worker.spec)
    spec["volumes"] = [m for m in spec["volumes"] if m["source"] != str(REPO / "examples")]
    found = run_in(image, Service("airflow-worker", spec), tmp_path / "unmounted", PAYLOAD)
    home = tmp_path / "unmounted" / "homes" / "airflow-worker-1"
    assert f"no directory 'simclr' in {REPO / 'include' / 'payloads'} and {home / 'examples'}" in found["refused"]
