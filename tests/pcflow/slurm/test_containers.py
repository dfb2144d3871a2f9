"""A run that names a container image, on the local stack for real: Slurm 22.05's own OCI support
(oci.conf, `srun --container`) runs the job's step in runc, rootless, as the run's job account, in the
Debian image include/local/build-image.sh built (an OCI layout, no registry). The image is unpacked once
per digest onto the shared root and reused by the next run; a cluster that cannot run the profile's
runtime is refused before anything is submitted."""

from __future__ import annotations

import json
import logging
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest
from run_factories import make_resolved_run
from stacktools import LocalStack
from taskcontext import make_context, run_to_end

from pcflow.dataset.stage_in import link_partition
from pcflow.errors import ConfigurationError
from pcflow.naming import run_key_from_context
from pcflow.patterns import DEFAULT_JOB_USER
from pcflow.pipeline.tasks import prepare_image
from pcflow.slurm.head_node import HeadNode
from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.operators import SlurmJobOperator
from pcflow.slurm.payload import build_archive, ship
from pcflow.slurm.spec import under_runs

pytestmark = pytest.mark.security  # docs/security.md names this module's refusals
REPO = Path(__file__).resolve().parents[3]
LAYOUT = REPO / ".stack-images" / "debian-python3"  # the session's `local_image` (tests/conftest.py)
HEAD_NODE = HeadNode(job_user=DEFAULT_JOB_USER)
FAST = {"poll_interval": 0.2, "confirm_interval": 2.0}

#: What the job reports from inside its container (the payload contract's variables and directories).
INSIDE = r"""
import json, os, sys
code, data, admin = sys.argv[1], sys.argv[2], sys.argv[3]
def writes(path):
    try:
        open(path, "w").close()
        return True
    except OSError:
        return False
facts = {
    "image": open("/etc/pcflow-image").read().strip(),
    "os": open("/etc/os-release").readline().strip(),
    "run_dir": os.environ["PCFLOW_RUN_DIR"],
    "hparams": json.load(open(os.environ["PCFLOW_HPARAMS"])),
    "code": sorted(os.listdir(code)),
    "data": sorted(os.listdir(data)),
    "admin": sorted(os.listdir(admin)),
    "admin_writable": writes(os.path.join(admin, "planted.py")),
    "code_writable": writes(os.path.join(code, "planted.py")),
    "image_writable": writes("/etc/planted"),
    "rank": os.environ["SLURM_PROCID"],
    "node": os.environ["SLURMD_NODENAME"],
    "runs": sorted(os.listdir(os.path.dirname(os.path.dirname(os.environ["PCFLOW_RUN_DIR"])))),
}
if os.environ["SLURM_PROCID"] == "0":
    with open(os.environ["PCFLOW_METRICS_FILE"], "a") as f:
        f.write(json.dumps({"step": 1, "loss": 0.25, "fewshot_accuracy": 0.5}) + "\n")
    open(os.path.join(os.environ["PCFLOW_RUN_DIR"], "model.pt"), "wb").write(b"weights")
print("FACTS " + json.dumps(facts, sort_keys=True))
"""


def run_document(image: str, **containers) -> dict:
    """The first task's document (XCom's JSON) for a local run naming `image`, `containers` laid over the
    profile's `cluster.containers`."""
    from pcflow.pipeline.resolved import dump

    training = {"container": image, "launcher": "srun"}
    return dump(make_resolved_run("local", training=training, cluster={"containers": containers}))


def forget_image(shared_root: Path, digest: str) -> None:
    """This digest's unpacked image removed (read-only: made writable first), as on a fresh cluster."""
    path = shared_root / "pcflow" / "images" / digest.split(":", 1)[1]
    if path.exists():
        subprocess.run(["chmod", "-R", "u+w", str(path)], check=True)
        shutil.rmtree(path)


@pytest.mark.stack
def test_a_job_runs_in_its_image_as_the_job_account_and_the_image_is_imported_once(
    local_stack: LocalStack, local_image: str, tmp_path: Path
):
    """About 20 s after the image exists: the preflight passes, the first prepare_image unpacks the
    layout, the second reuses it; the job's step runs in runc as the job account, sees the payload
    contract's variables and only its own directories (code and data read-only), writes its metrics."""
    cluster = {"ssh_conn_id": "slurm_default", "shared_root": str(local_stack.shared_root)}
    context = make_context("train")
    hook = SlurmHook(HEAD_NODE)
    try:
        code = ship(hook, build_archive("simclr"), shared_root=hook.shared_root, log=logging.getLogger("test"))["dir"]
        staged = local_stack.shared_root / "pcflow" / "datasets" / "container-test"
        hook.makedirs(str(staged))
        hook.write_file(str(staged / "shard-0.txt"), "digits\n", mode=0o644)
        run_dir = under_runs(hook.shared_root, run_key_from_context(context))
        hook.make_run_dirs(run_dir)  # the job reads its partition through its run's view, as training_inputs makes it
        data = Path(link_partition(hook, str(staged), run_dir))
    finally:
        hook.close()
    index = json.loads((LAYOUT / "index.json").read_text())
    digest = index["manifests"][0]["digest"]
    forget_image(local_stack.shared_root, digest)

    admin = str(REPO / "examples")  # an admin's mount outside the shared root: its mount point is made
    document = run_document(local_image, mounts=[admin])
    first = prepare_image.function(document, cluster, {"python": "unused: the image's"})
    second = prepare_image.function(document, cluster, {"python": "unused: the image's"})
    assert (first["digest"], first["imported"], second["imported"]) == (digest, True, False)
    assert first["path"] == second["path"] == str(local_stack.shared_root / "pcflow" / "images" / digest[7:])
    assert first["python"] == "python3" and any(e.startswith("PATH=") for e in first["env"])
    rootfs = Path(first["path"]) / "rootfs"
    assert oct((rootfs / "etc").stat().st_mode & 0o222) == "0o0"
    found = subprocess.run(["find", str(rootfs), "-perm", "/6000"], capture_output=True, text=True, check=True)
    assert found.stdout == ""  # Debian's su, mount, passwd...: no set-uid file a job could run on the node

    second["mounts"].append({"path": code})  # the run's code, as ship_payload's directory is mounted
    op = SlurmJobOperator(
        task_id="train",
        program=["python3", "-c", INSIDE, code, str(data), admin],
        python=second["python"],
        head_node=HEAD_NODE,
        hyperparameters={"lr": 0.1, "data_dir": str(data)},  # what training_inputs sets: mounted read-only
        allocation={"nodes": 2},  # one task on each of two nodes, each knowing its own rank
        container=second,
        outputs=("model.pt", "metrics.jsonl"),
        **FAST,
    )
    result = run_to_end(op, context)
    assert result["state"] == "COMPLETED", result
    run_dir = Path(result["run_dir"])
    log = (run_dir / "job.log").read_text()
    ranks = [json.loads(line[6:]) for line in log.splitlines() if line.startswith("FACTS ")]
    assert sorted((f["rank"], f["node"]) for f in ranks) == [("0", "node1"), ("1", "node2")], log
    facts = ranks[0]
    assert facts["image"].startswith("pcflow local image bookworm-python3"), log
    assert "bookworm" in facts["os"] and facts["run_dir"] == str(run_dir)
    assert facts["hparams"] == {"lr": 0.1, "data_dir": str(data)}
    assert "train.py" in facts["code"] and facts["data"] == ["shard-0.txt"]
    assert facts["code_writable"] is False and facts["image_writable"] is False
    assert "simclr" in facts["admin"] and facts["admin_writable"] is False
    assert facts["runs"] == [run_dir.parent.name]  # other runs' directories are not in its shared root
    # What the job wrote is the job account's on the host: the container's root is that account, no more.
    job_account = pwd.getpwnam(DEFAULT_JOB_USER)
    assert (run_dir / "metrics.jsonl").stat().st_uid == job_account.pw_uid
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["loss"] == 0.25
    assert result["container"] == {"reference": local_image, "digest": digest, "imported": False, "runtime": "oci"}
    bundle = json.loads((run_dir / "bundle" / "config.json").read_text())
    assert [m["destination"] for m in bundle["mounts"] if m["type"] == "bind" and m["source"] != "/sys"] == [
        str(run_dir),
        str(data),
        str(REPO / ".venv-payload"),  # the profile's own mount; the admin's `mounts` add to it
        admin,
        code,
    ]


@pytest.mark.stack
def test_a_container_the_cluster_cannot_run_is_refused_before_submit(local_stack: LocalStack):
    """The local Slurm has no Pyxis: a profile whose clusters run containers with it is refused by the
    preflight (ConfigurationError, which Airflow does not retry), naming the missing option; nothing is
    imported."""
    cluster = {"ssh_conn_id": "slurm_default", "shared_root": str(local_stack.shared_root)}
    pinned = "registry.example.com/team/train@sha256:" + "0" * 64  # Pyxis takes a registry's reference
    document = run_document(pinned, runtime="pyxis")
    with pytest.raises(ConfigurationError, match=r"no --container-image option.*Pyxis is not enabled"):
        prepare_image.function(document, cluster, {"python": "python3"})


@pytest.mark.stack
def test_an_ecr_image_is_pinned_to_its_digest_and_pulled_with_the_connections_token(local_stack: LocalStack):
    """The moto server's ECR: the tag's digest and a pull token through the `aws_default` connection; a tag
    ECR does not know is refused (not retried), and an image outside ECR must be named by digest."""
    from pcflow.aws.clients import aws_client
    from pcflow.imagerefs import parse_image
    from pcflow.pipeline.tasks import registry_pull

    ecr = aws_client("ecr", region_name="us-east-1")
    repository = "pcflow-container-test"
    ecr.create_repository(repositoryName=repository)
    try:
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}
        pushed = ecr.put_image(repositoryName=repository, imageManifest=json.dumps(manifest), imageTag="v1")
        account = pushed["image"]["registryId"]
        host = f"{account}.dkr.ecr.us-east-1.amazonaws.com"
        digest, token = registry_pull(parse_image(f"{host}/{repository}:v1"), "aws_default")
        assert digest == pushed["image"]["imageId"]["imageDigest"] and token
        with pytest.raises(ConfigurationError, match="ECR has no image pcflow-container-test:v2"):
            registry_pull(parse_image(f"{host}/{repository}:v2"), "aws_default")
    finally:
        ecr.delete_repository(repositoryName=repository, force=True)
    with pytest.raises(ConfigurationError, match="outside ECR, name the image by digest"):
        registry_pull(parse_image("registry.example.com/team/train:v1"), "aws_default")
