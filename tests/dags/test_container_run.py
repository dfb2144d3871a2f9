"""`pretrain` on the embedded default with the run's code in a container: the Debian image of
include/local/build-image.sh, its interpreter the payload's environment that the local profile mounts
into every container (cluster.containers.mounts). The simclr payload trains in it end to end through
Slurm's OCI support; a second run imports nothing. Two short runs, about 4 minutes on the 2-core machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dagrun import REPO, remove_stack, run_dag, tagged_resources

pytestmark = [pytest.mark.stack, pytest.mark.slow]
PARTITION = "20261129"


def container_conf(image: str) -> dict:
    python = str(REPO / ".venv-payload" / "bin" / "python")  # mounted read-only: the profile's admin mount
    training = {"container": {"image": image, "python": python}}
    return {"partition": PARTITION, "hyperparameters": {"epochs": 1}, "overrides": {"training": training}}


def test_pretrain_trains_in_its_container_and_imports_the_image_once(airflow, local_image):
    try:
        first = run_dag("pretrain", container_conf(local_image))
        assert first.state == "success", first.task_states
        out = first.returned
        image = out["prepare_image"]
        assert image["reference"] == local_image and image["digest"].startswith("sha256:")
        assert out["train"]["state"] == "COMPLETED"
        assert out["train"]["container"] == {
            "reference": local_image,
            "digest": image["digest"],
            "imported": image["imported"],
            "runtime": "oci",
        }
        assert out["metrics"]["objective"]["value"] > 0.1
        assert out["metrics"]["container"] == out["train"]["container"], "the run summary names its image"
        run_dir = Path(out["train"]["run_dir"])
        script = (run_dir / "job.sbatch").read_text()
        assert f"srun --kill-on-bad-exit=1 --container={run_dir}/bundle " in script
        bundle = json.loads((run_dir / "bundle" / "config.json").read_text())
        binds = [m["destination"] for m in bundle["mounts"] if m["type"] == "bind"]
        assert str(run_dir) in binds and out["ship_payload"]["dir"] in binds
        assert (run_dir / "bundle" / "rootfs").resolve() == Path(image["path"]) / "rootfs"
        assert tagged_resources("pcflow:run", first.run_key) == []

        second = run_dag("pretrain", container_conf(local_image))
        assert second.state == "success", second.task_states
        again = second.returned["prepare_image"]
        assert (again["digest"], again["path"], again["imported"]) == (image["digest"], image["path"], False)
    finally:
        assert remove_stack("local") == []  # what the runs keep on purpose (image, data bucket)
