"""The pcflow distribution: the wheel (the one the image's pip builds: tests/deploy/conftest.py) carries
the package with its templates and data and Airflow's entry point, installs alone (pcflow imported from
it, nothing from the checkout) and renders what it renders; its dependency ranges hold the versions the
tests run; the image installs it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

import pcflow

REPO = Path(__file__).resolve().parents[2]


def package_files() -> set[str]:
    """Every file git tracks under plugins/pcflow/, as the wheel names it."""
    listed = subprocess.run(
        ["git", "ls-files", "plugins/pcflow"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return {path.removeprefix("plugins/") for path in listed}


def test_the_wheel_holds_the_package_its_data_and_the_entry_point(image_wheel):
    names = set(zipfile.ZipFile(image_wheel).namelist())
    files = package_files()
    data = {f for f in files if not f.endswith(".py")}
    assert {"pcflow/slurm/templates/srun.sbatch.j2", "pcflow/prices.json", "pcflow/readings/sampler.py"} <= files
    assert data and files <= names
    assert not [n for n in names if "__pycache__" in n or n.startswith(("plugins/", "include/", "tests/"))]
    dist_info = f"pcflow-{pcflow.__version__}.dist-info"
    entry_points = zipfile.ZipFile(image_wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "[apache_airflow_provider]\nprovider_info = pcflow.provider_info:get_provider_info" in entry_points


def test_the_installed_wheel_alone_renders_and_reads_its_data(image, tmp_path):
    """Installed where the image has it (its dependencies from this environment), with neither plugins/
    nor include/ on the path: every template and data file is found in the package."""
    script = """
import sys
import pcflow
assert pcflow.__file__.startswith(sys.argv[1]), pcflow.__file__
from pcflow.cluster.config import render_config
from pcflow.cluster.spec import ClusterSpec
from pcflow.prices import bundled_prices
from pcflow.metrics.report import render_report
from pcflow.readings.utilisation import sampler_source
from pcflow.slurm.render import render_batch_script
from pcflow.slurm.spec import JobSpec, RunDir
run_dir = RunDir.for_job("/fsx", "k", "t")
for launcher in ("srun", "torchrun", "vissl", "mpirun"):
    spec = JobSpec(program=["t.py"], launcher=launcher)
    assert "#SBATCH" in render_batch_script(spec, run_dir, job_name="k.t", run_key="k")
cluster = {"name": "pcflow-k", "region": "us-east-1", "key_name": "k", "head_subnet_id": "subnet-0123abcd",
           "ssh_allowed_ips": "203.0.113.0/24"}
assert render_config(ClusterSpec.parse(cluster)).document["HeadNode"]
assert "<html" in render_report({"run_key": "k", "metrics": {}, "cost": {}, "utilisation": {}})
assert bundled_prices()["as_of"] and sampler_source().startswith(b"#!")
print("ok")
"""
    argv = [
        sys.executable,
        "-I",
        "-c",
        f"import sys; sys.path.insert(0, sys.argv[1]); exec({script!r})",
        str(image.site),
    ]
    # -I: neither PYTHONPATH nor the working directory; plugins/ and include/ are nowhere on the path.
    env = {"PATH": "/usr/bin:/bin", "PCFLOW_INCLUDE_DIR": str(tmp_path / "none")}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_the_dependency_ranges_hold_the_pinned_versions():
    """pyproject's ranges (what another environment needs) admit requirements.txt's pins (what the tests ran)."""
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", (REPO / "requirements.txt").read_text(), re.M))
    pins = {name.lower(): version for name, version in pins.items()}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        assert requirement.name in pins, f"{requirement.name}: in pyproject.toml but not pinned in requirements.txt"
        assert requirement.specifier.contains(pins[requirement.name]), (line, pins[requirement.name])


def test_the_image_installs_the_wheel_after_its_pinned_requirements():
    dockerfile = (REPO / "Dockerfile").read_text()
    requirements = dockerfile.index("-r /opt/pcflow/requirements.txt")
    wheel = dockerfile.index("pip install --no-cache-dir --no-deps /opt/pcflow/src")
    assert requirements < wheel and "pip check" in dockerfile[wheel:]
    assert re.search(r"^COPY .*plugins/pcflow /opt/pcflow/src/plugins/pcflow$", dockerfile, re.M)
