"""`pretrain` on the embedded default with a user's project in a container: examples/resnet from its own
git repository (as `make example EXAMPLE=resnet CONTAINER=local` runs it), in the Debian image of
include/local/build-image.sh, its interpreter the payload's environment that the local profile mounts
into every container (cluster.containers.mounts). The project trains in it end to end through Slurm's
OCI support; a second run imports nothing. Two short runs, about 2 minutes on the 2-core machine."""

from __future__ import annotations

import json
from pathlib import Path

import example
import pytest
from dagrun import remove_stack, run_dag, tagged_resources

pytestmark = [pytest.mark.stack, pytest.mark.slow]


def container_conf(image: str) -> dict:
    """The example's conf (its own settings, its code from its repository) with `image` as its container."""
    repo = example.repository_of("resnet")
    example.publish(example.EXAMPLES / "resnet", repo)
    return example.conf_for("resnet", repo, container=image)


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
        assert out["ship_payload"]["source"] == "git" and out["prepare_environment"]["built"] is False
        assert out["metrics"]["objective"]["name"] == "accuracy" and out["metrics"]["objective"]["value"] > 0.5
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
