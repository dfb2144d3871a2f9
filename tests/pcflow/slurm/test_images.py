"""Container images without a cluster: the references a run may name, what the first task refuses, the
preflight's reading of `srun --help`, the Pyxis path as the aws-gpu rehearsal renders it (job script and
the one `enroot import`, its registry credentials kept out of every argument and log), and the OCI
bundle a local job gets. The local stack runs the OCI path for real (test_containers.py)."""

from __future__ import annotations

import json
import logging
import subprocess
from dataclasses import dataclass, field

import pytest
from airflow.sdk.exceptions import AirflowFailException

from pcflow.errors import ConfigurationError
from pcflow.imagerefs import parse_image
from pcflow.paths import include_dir
from pcflow.profiles import RunSpecError
from pcflow.runspec import resolve_run_spec
from pcflow.slurm import images
from pcflow.slurm.render import render_batch_script
from pcflow.slurm.spec import JobSpec, RunDir

pytestmark = pytest.mark.security  # docs/security.md names this module's refusals

ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com/train"
DIGEST = "sha256:" + "ab" * 32
TOKEN = "eyJwYXlsb2FkIjoi-secret-token"


@dataclass
class Result:
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0


@dataclass
class FakeHook:
    """Answers the commands a test names; records every argv and every file written."""

    answers: dict[str, Result] = field(default_factory=dict)
    files: dict[str, tuple[str, int]] = field(default_factory=dict)
    argvs: list[list[str]] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    job_user: str | None = "pcflow-job"

    def run(self, argv, check=True, timeout=None):
        self.argvs.append(list(argv))
        return self.answers.get(argv[0] if argv[0] != "env" else "enroot", Result())

    def file_size(self, path):
        return self.sizes.get(path)

    def write_file(self, path, data, mode=0o600):
        self.files[path] = (data, mode)

    def make_private_dirs(self, *paths):
        self.argvs.append(["private", *paths])


@pytest.mark.parametrize(
    ("text", "kind", "parts"),
    [
        ("oci:/srv/images/py:3.11", "oci", {"layout": "/srv/images/py", "tag": "3.11"}),
        (f"{ECR}:v1", "registry", {"registry": ECR.split("/", maxsplit=1)[0], "repository": "train", "tag": "v1"}),
        (f"docker://{ECR}@{DIGEST}", "registry", {"repository": "train", "digest": DIGEST, "tag": None}),
        ("registry.local:5000/team/pytorch", "registry", {"repository": "team/pytorch", "tag": "latest"}),
    ],
)
def test_references_a_run_may_name(text, kind, parts):
    ref = parse_image(text)
    assert ref.kind == kind and {k: getattr(ref, k) for k in parts} == parts


@pytest.mark.parametrize(
    "text", ["ubuntu", "oci:relative/dir:tag", "oci:/a b:tag", f"{ECR}:v1;id", f"{ECR}@sha256:short", "oci:/x:$(id)"]
)
def test_what_is_not_an_image_reference_is_refused(text):
    with pytest.raises(ValueError, match="not an image reference"):
        parse_image(text)


def test_the_first_task_refuses_a_container_the_profile_cannot_run(tmp_path):
    """Each profile takes its runtime's kind of reference; local reads layouts only under its roots; a
    launcher that starts workers outside Slurm's steps cannot run in one."""
    cases = {
        ("local", f"{ECR}:v1", "srun"): "takes an oci:/layout:tag reference",
        ("local", "oci:/etc/secrets:x", "srun"): "is not under a directory the profile allows",
        ("aws-gpu-rehearsal", "oci:/fsx/layout:x", "torchrun"): "takes a registry reference",
        ("local", "oci:/etc/secrets:x", "mpirun"): "mpirun launcher starts its workers outside",
    }
    for (profile, image, launcher), message in cases.items():
        with pytest.raises(RunSpecError, match=message):
            resolve_run_spec(profile, {"training": {"container": image, "launcher": launcher}})
    layout = f"oci:{include_dir().parent}/.stack-images/debian-python3:bookworm-python3"
    with pytest.raises(RunSpecError, match="one task per node in a container"):
        resolve_run_spec("local", {"training": {"container": layout, "launcher": "srun", "tasks_per_node": 2}})
    for launcher, tasks in (("srun", 1), ("torchrun", 2)):
        resolve_run_spec("local", {"training": {"container": layout, "launcher": launcher, "tasks_per_node": tasks}})
    spec = resolve_run_spec(
        "aws-gpu-rehearsal", {"training": {"container": {"image": f"{ECR}:v1", "python": "python"}}}
    )
    assert spec.training.container.python == "python" and spec.cluster.containers.runtime == "pyxis"


HELP_WITH_OCI = "      --container            Path to OCI container bundle\n      --cpu-bind=type        ..."
HELP_WITH_PYXIS = "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n      --container-mounts=SRC:DST"


@pytest.mark.parametrize(
    ("runtime", "help_text", "message"),
    [
        ("pyxis", HELP_WITH_OCI, "no --container-image option.*Pyxis is not enabled"),
        ("oci", HELP_WITH_PYXIS, "no --container option.*without OCI support"),
        ("oci", "", "no --container option"),
    ],
)
def test_the_preflight_refuses_a_cluster_whose_srun_cannot_run_the_container(runtime, help_text, message):
    hook = FakeHook(answers={"srun": Result(stdout=help_text)})
    with pytest.raises(ConfigurationError, match=message) as refused:
        images.check_cluster_runs(hook, runtime)
    assert "cluster.containers.runtime" in str(refused.value)
    assert isinstance(refused.value, AirflowFailException)  # Airflow fails it without retries


def test_the_preflight_refuses_oci_without_oci_conf_and_passes_with_it():
    """Without oci.conf Slurm runs the step outside the container, silently: refused."""
    answers = {"srun": Result(stdout=HELP_WITH_OCI), "scontrol": Result(stdout="SLURM_CONF = /etc/slurm/slurm.conf\n")}
    with pytest.raises(ConfigurationError, match=r"no oci\.conf beside /etc/slurm/slurm\.conf"):
        images.check_cluster_runs(FakeHook(answers=answers), "oci")
    images.check_cluster_runs(FakeHook(answers=answers, sizes={"/etc/slurm/oci.conf": 120}), "oci")
    images.check_cluster_runs(FakeHook(answers={"srun": Result(stdout=HELP_WITH_PYXIS)}), "pyxis")


def pyxis_container(**extra) -> dict:
    return {
        "runtime": "pyxis",
        "path": f"/fsx/pcflow/images/{DIGEST[7:]}.sqsh",
        "shared_root": "/fsx",
        "reference": f"{ECR}:v1",
        "digest": DIGEST,
        "mounts": [{"path": "/fsx/e2e"}],
        **extra,
    }


def test_the_rehearsal_renders_the_pyxis_path():
    """aws-gpu's torchrun job in its image: srun gets the squashfs imported once per digest and exactly
    the run's, code and data directories (code and data read-only); the home is not mounted, the
    interpreter is the image's. The script is valid bash."""
    spec = resolve_run_spec("aws-gpu-rehearsal", {"training": {"container": f"{ECR}:v1"}})
    run_dir = RunDir("/fsx/pcflow/runs/research-1/train")
    job = JobSpec(
        launcher=spec.training.launcher,
        program=spec.training.program,
        python=spec.training.container.python,
        payload_dir="/fsx/pcflow/payloads/0123abcd",
        container=pyxis_container(),
    )
    script = render_batch_script(job, run_dir, job_name="research-1.train", run_key="research-1")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    code = "/fsx/pcflow/payloads/0123abcd"
    mounts = f"{run_dir.root}:{run_dir.root},{code}:{code}:ro,/fsx/e2e:/fsx/e2e:ro"
    expected = (
        f'--ntasks="$SLURM_NNODES" --container-image=/fsx/pcflow/images/{DIGEST[7:]}.sqsh '
        f"--container-mounts={mounts} --container-workdir={run_dir.root} --no-container-mount-home "
        "--no-container-remap-root \\\n  python3 -m torch.distributed.run"
    )
    assert expected in script, script
    assert "--no-python python3 /fsx/pcflow/payloads/0123abcd/train.py" in script
    assert 'python3 "$sampler"' in script  # the sampler stays on the node, outside the container
    plain = render_batch_script(job.model_copy(update={"container": None}), run_dir, job_name="j", run_key="k")
    assert "--container" not in plain


def test_the_one_enroot_import_pins_the_digest_and_keeps_the_token_out_of_every_argument():
    hook = FakeHook()
    ref = parse_image(f"{ECR}:v1")
    credentials = images.enroot_credentials(ref.registry, TOKEN)
    found = images.import_sqsh(hook, ref, DIGEST, "/fsx", credentials=credentials, log=logging.getLogger("t"))
    final = f"/fsx/pcflow/images/{DIGEST[7:]}.sqsh"
    assert found == {"path": final, "imported": True}
    (private,) = [argv[1] for argv in hook.argvs if argv[0] == "private"]
    assert private.startswith("/fsx/pcflow/.enroot-")
    assert hook.files == {f"{private}/.credentials": (f"machine {ref.registry} login AWS password {TOKEN}\n", 0o600)}
    (imported,) = [argv for argv in hook.argvs if "import" in argv]
    assert imported[:5] == ["env", f"ENROOT_CONFIG_PATH={private}", "enroot", "import", "--output"]
    assert imported[-1] == f"docker://{ref.registry}#train@{DIGEST}"  # by digest: a moved tag changes nothing
    assert all(TOKEN not in " ".join(argv) for argv in hook.argvs)
    assert ["rm", "-rf", "--", private, imported[5]] in hook.argvs  # the credentials go when the import ends
    again = FakeHook(sizes={final: 10 << 30})
    assert images.import_sqsh(again, ref, DIGEST, "/fsx", credentials=None, log=logging.getLogger("t")) == {
        "path": final,
        "imported": False,
    }
    assert not any("import" in argv for argv in again.argvs)


def test_a_failed_import_leaves_no_credentials_and_is_retried():
    hook = FakeHook(answers={"enroot": Result(stderr="[ERROR] URL https://... returned error code: 401", exit_code=1)})
    ref = parse_image(f"{ECR}:v1")
    with pytest.raises(images.ImageError, match="returned error code: 401"):
        images.import_sqsh(hook, ref, DIGEST, "/fsx", credentials="machine x login AWS password y\n", log=None)
    assert hook.argvs[-1][:3] == ["rm", "-rf", "--"]


def test_a_local_jobs_bundle_mounts_only_its_directories():
    """The OCI bundle's config: the image's rootfs read-only, the shared root an empty tmpfs with the run's
    directory (written) and its code and data (read) bound into it, no capability, the job's umask."""
    container = {"runtime": "oci", "env": ["PATH=/usr/bin:/bin"]}
    mounts = images.job_mounts("/s/pcflow/runs/k/train", "/s/pcflow/payloads/abc", [{"path": "/s/pcflow/datasets/p"}])
    config = images.bundle_config(container, "/s", mounts, "/s/pcflow/runs/k/train")
    assert config["root"] == {"path": "rootfs", "readonly": True}
    by_place = {m["destination"]: m for m in config["mounts"]}
    assert by_place["/s"]["type"] == "tmpfs" and by_place["/tmp"]["type"] == "tmpfs"
    binds = [(m["destination"], m["options"][-1]) for m in config["mounts"] if m["type"] == "bind"]
    assert binds == [("/s/pcflow/runs/k/train", "rw"), ("/s/pcflow/payloads/abc", "ro"), ("/s/pcflow/datasets/p", "ro")]
    assert [m["destination"] for m in config["mounts"]].index("/s") < [
        m["destination"] for m in config["mounts"]
    ].index("/s/pcflow/runs/k/train")
    assert all(v == [] for v in config["process"]["capabilities"].values())
    assert config["process"]["user"]["umask"] == 0o007 and config["process"]["env"] == ["PATH=/usr/bin:/bin"]
    assert images.srun_options(container, "/s/pcflow/runs/k/train/bundle", mounts, "/x") == [
        "--container=/s/pcflow/runs/k/train/bundle"
    ]
    json.dumps(config)  # what write_bundle writes


def test_mount_points_are_made_in_the_image_but_never_through_its_links(tmp_path):
    """The admin's mounts need a directory in the read-only image: made (read-only), and refused where
    the image has a link on the way (an absolute one would lead the mkdir onto the head node)."""
    rootfs, outside = tmp_path / "image" / "rootfs", tmp_path / "outside"
    (rootfs / "usr").mkdir(parents=True)
    outside.mkdir()
    (rootfs / "fsx").symlink_to(outside)
    (rootfs / "usr").chmod(0o555)
    run = ["sh", "-c", images.MOUNT_POINTS, "sh", str(rootfs)]
    points = ["/usr/share/models", "/opt/cache", "/etc/hosts:file"]
    made = subprocess.run([*run, *points], capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    assert (rootfs / "usr/share/models").is_dir() and (rootfs / "opt/cache").is_dir()
    assert (rootfs / "etc/hosts").is_file() and (rootfs / "etc/hosts").read_bytes() == b""
    assert oct((rootfs / "etc/hosts").stat().st_mode & 0o777) == "0o444"
    again = subprocess.run([*run, *points], capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr  # made once: a second run changes nothing
    assert oct((rootfs / "usr").stat().st_mode & 0o777) == "0o555"  # the image's own modes kept
    assert oct((rootfs / "usr/share/models").stat().st_mode & 0o777) == "0o555"
    refused = subprocess.run([*run, "/fsx/pcflow"], capture_output=True, text=True, check=False)
    assert refused.returncode == 3 and "crosses the link /fsx" in refused.stderr
    assert list(outside.iterdir()) == []


def test_a_local_srun_job_names_its_bundle_and_the_rendezvous_host():
    """Slurm's `--container=<the job's bundle>` on the step; the image has no scontrol, so the batch script
    (outside it) names the first node as MASTER_ADDR, where torch and the payloads look for it."""
    run_dir = RunDir("/s/pcflow/runs/k/train")
    container = {**pyxis_container(), "runtime": "oci", "path": f"/s/pcflow/images/{DIGEST[7:]}", "shared_root": "/s"}
    job = JobSpec(program=["python3", "train.py"], container=container)
    script = render_batch_script(job, run_dir, job_name="k.train", run_key="k")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "srun --kill-on-bad-exit=1 --container=/s/pcflow/runs/k/train/bundle python3 train.py &" in script
    assert 'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"' in script
    plain = render_batch_script(job.model_copy(update={"container": None}), run_dir, job_name="k.train", run_key="k")
    assert "MASTER_ADDR" not in plain and "srun --kill-on-bad-exit=1 python3 train.py &" in plain
