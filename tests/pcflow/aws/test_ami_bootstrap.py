"""The AMI bootstrap as SSM runs it: `AmiSpec.commands()` joined by newlines, the script that
aws:runShellScript writes and runs with `sh` (dash, Ubuntu's /bin/sh), on a fake root.

Emulated, because the base images cannot be run here (no registry or AWS is reachable): each OS is its
os-release file under `PCFLOW_ROOT` (the script's stand-in for /), plus its own python3, a script that
answers the bootstrap's two questions (version, venv module) as that OS's interpreter does and runs
nothing else. The network is `curl` on PATH: one that fails as with no route to PyPI (logging what it
was asked for), or one that serves a corrupted file. A good interpreter is this machine's own Python,
and pip installs from a local wheel directory (`PIP_NO_INDEX`): `torch` there is a stand-in wheel of a
few lines (the real one is gigabytes from PyPI) whose `torch.distributed.is_available()` is True.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pcflow.aws.ami import AmiSpec, BakeImageOperator, environment_script_env, load_script, required_python
from pcflow.checksums import parse_checksum_list
from pcflow.paths import include_dir

#: os-release of each base OS the profiles name, and its python3 (version, whether it can make a venv).
BASE_OSES = {
    "ubuntu2204": ('ID=ubuntu\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.5 LTS"\n', "3.10", True),
    "ubuntu2404": ('ID=ubuntu\nVERSION_ID="24.04"\nPRETTY_NAME="Ubuntu 24.04.2 LTS"\n', "3.12", False),
    "alinux2023": ('ID="amzn"\nVERSION_ID="2023"\nPRETTY_NAME="Amazon Linux 2023.7.20250512"\n', "3.9", True),
    "rhel9": ('ID="rhel"\nVERSION_ID="9.6"\nPRETTY_NAME="Red Hat Enterprise Linux 9.6 (Plow)"\n', "3.9", True),
}
#: What the script runs besides the interpreters and curl (looked up on this machine's PATH).
TOOLS = ("bash", "env", "uname", "mktemp", "rm", "mkdir", "chmod", "sha256sum")
#: What include/ami/tree-record.sh, which writes the environment's record, runs besides.
RECORD_TOOLS = ("id", "find", "sort", "xargs", "grep", "cp", "mv", "wc", "cut", "sed", "head", "dirname", "cat")
REQUIREMENTS = "# requires-python: >=3.11\n# quoted as given: 'it''s' $(touch /tmp/pcflow-pwned) `id`\ntorch==2.13.0\n"


def rendered(requirements: str, script: str | None = None) -> str:
    """The text aws:runShellScript runs: the `commands` parameter's lines joined by newlines."""
    spec = AmiSpec(
        stack="bake",
        region="us-east-1",
        pcluster_version="3.16.1",
        bootstrap_script=script or load_script("ami/bootstrap.sh"),
        instance_profile="pcflow-ami-builder",
        subnet_id="subnet-0123456789abcdef0",
        os="ubuntu2204",
        script_env=environment_script_env(requirements, "test"),
    )
    return "\n".join(spec.commands())


def posix_sh() -> str:
    """dash, the /bin/sh of Debian and Ubuntu (stricter than bash in sh mode)."""
    dash = shutil.which("dash") or (
        os.path.realpath("/bin/sh") if os.path.realpath("/bin/sh").endswith("dash") else None
    )
    if dash is None:
        pytest.fail("dash is needed to run the bake's command as SSM does on Ubuntu: apt-get install dash")
    return dash


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def base_python(bin_dir: Path, version: str, venv: bool) -> None:
    """The image's own python3: answers as that interpreter would, and refuses to be used for anything."""
    venv_answer = "exit 0" if venv else "echo \"ModuleNotFoundError: No module named 'ensurepip'\" >&2; exit 1"
    executable(
        bin_dir / "python3",
        f'#!/bin/sh\ncase "$2" in\n  *version_info*) echo {version} ;;\n  *ensurepip*) {venv_answer} ;;\n'
        f'  *) echo "the base image python3 {version} was asked to run: $*" >&2; exit 1 ;;\nesac\n',
    )


def stand_in_torch(wheels: Path) -> None:
    """A wheel named torch 2.13.0 with what the bootstrap's last check imports."""
    wheels.mkdir()
    info = "torch-2.13.0.dist-info"
    files = {
        "torch/__init__.py": "",
        "torch/distributed/__init__.py": "def is_available():\n    return True\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: pcflow-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheels / "torch-2.13.0-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)


@pytest.fixture
def builder(tmp_path):
    """A fake root of one base OS, a PATH of only the tools, and a runner of the rendered command."""
    root, bin_dir, wheels = tmp_path / "root", tmp_path / "bin", tmp_path / "wheels"
    for directory in ("etc/ssh", "var/lib/cloud/instances/i-0abc", "root", "home/ubuntu", "opt"):
        (root / directory).mkdir(parents=True)
    for leftover in ("etc/ssh/ssh_host_ed25519_key", "root/.bash_history", "home/ubuntu/.bash_history"):
        (root / leftover).write_text("leftover\n")
    bin_dir.mkdir()
    for tool in TOOLS + RECORD_TOOLS:
        os.symlink(shutil.which(tool), bin_dir / tool)
    stand_in_torch(wheels)

    class Builder:
        def __init__(self):
            self.root, self.bin, self.curl_log = root, bin_dir, tmp_path / "curl.log"
            self.venv = root / "opt/pcflow/payload-venv"

        def base_os(self, name: str) -> str:
            release, version, venv = BASE_OSES[name]
            (root / "etc/os-release").write_text(release)
            base_python(bin_dir, version, venv)
            return version

        def curl(self, body: str | None, file: Path | None = None) -> None:
            """curl that logs its arguments, then fails as without a network (None), writes `body` or copies `file`."""
            serve = 'echo "curl: (6) Could not resolve host: files.pythonhosted.org" >&2; exit 6'
            if body is not None:
                serve = f'while [ "$1" != -o ]; do shift; done; printf %s {body!r} > "$2"'
            if file is not None:
                serve = f'while [ "$1" != -o ]; do shift; done; exec cat {shlex.quote(str(file))} > "$2"'
            log = shlex.quote(str(self.curl_log))
            executable(bin_dir / "curl", f'#!/bin/sh\nprintf "%s\\n" "$@" >> {log}\n{serve}\n')

        def good_python(self) -> str:
            """This machine's interpreter (>= 3.11) as python3.X on PATH."""
            name = f"python3.{sys.version_info.minor}"
            os.symlink(os.path.realpath(sys.executable), bin_dir / name)
            return name

        def stand_in_uv(self) -> str:
            """The uv wheel served by curl: a script that runs this machine's pinned uv, with the bake's pin of its
            sha256 set to this wheel's (the real pins: test_the_bootstrap_pins_the_projects_uv)."""
            wheel = tmp_path / "uv.whl"
            with zipfile.ZipFile(wheel, "w") as archive:
                archive.writestr(
                    "uv-0.13.9.data/scripts/uv", f'#!/bin/sh\nexec {Path(sys.executable).with_name("uv")} "$@"\n'
                )
            self.curl(None, file=wheel)
            pin = f"UV_SHA256_{platform.machine()}="
            lines = load_script("ami/bootstrap.sh").splitlines(keepends=True)
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            return "".join(f"{pin}{digest}\n" if line.startswith(pin) else line for line in lines)

        def run(self, requirements: str = REQUIREMENTS, script: str | None = None) -> subprocess.CompletedProcess:
            env = {
                "PATH": str(bin_dir),
                "HOME": str(tmp_path / "home"),
                "PCFLOW_ROOT": str(root),
                "PIP_NO_INDEX": "1",
                "PIP_FIND_LINKS": str(wheels),
                "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            }
            text = rendered(requirements, script)
            # It may run as root on a test machine: every path its clean-up removes must be under the fake root,
            # or a mistake in it would delete this machine's SSH host keys.
            removals = [line.split()[2:] for line in text.splitlines() if line.startswith("rm -")]
            assert removals and all(path.startswith('"$root"/') for paths in removals for path in paths), removals
            command = [posix_sh(), "-c", text]
            return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)

    return Builder()


@pytest.mark.parametrize("base_os", sorted(BASE_OSES))
def test_too_old_python_fails_early_naming_the_os_and_versions(builder, base_os):
    """No python3.X >= 3.11 on PATH and the image's python3 too old (or, on Ubuntu 24.04, without its
    venv module): the bootstrap turns to a pinned uv for a standalone CPython, and where it cannot get
    one, stops before making any environment, saying what it found and what the payload needs."""
    version = builder.base_os(base_os)
    builder.curl(None)
    result = builder.run()
    assert result.returncode != 0
    pretty = re.search(r'PRETTY_NAME="(.*)"', BASE_OSES[base_os][0]).group(1)
    message = next(line for line in result.stderr.splitlines() if line.startswith("pcflow bootstrap: "))
    assert "no Python >= 3.11" in message and f"on {pretty}:" in message
    assert f"{builder.bin}/python3 {version}" in message and "uv 0.13.9" in message
    if not BASE_OSES[base_os][2]:
        assert f"python3 {version} (no venv module)" in message
    assert "Could not resolve host" in result.stderr  # curl's own reason, above the message
    url = [line for line in builder.curl_log.read_text().splitlines() if line.startswith("https://")]
    assert len(url) == 1 and url[0].startswith("https://files.pythonhosted.org/packages/")
    assert f"/uv-0.13.9-py3-none-manylinux_2_17_{platform.machine()}" in url[0]
    assert not (builder.root / "opt/pcflow").exists()  # nothing made, nothing left for an image
    assert (builder.root / "etc/ssh/ssh_host_ed25519_key").exists()


def test_a_uv_wheel_without_its_pinned_hash_is_refused(builder):
    builder.base_os("ubuntu2204")
    builder.curl("not the uv wheel")
    result = builder.run()
    assert result.returncode != 0
    assert "the uv 0.13.9 wheel downloaded does not have its pinned sha256" in result.stderr
    assert not (builder.root / "opt/pcflow").exists()


def test_a_good_python_on_path_makes_the_payload_environment(builder):
    """The newest python3.X >= the payload's need is taken before the image's python3 (first on PATH and
    too old); the venv is built on it, the requirements arrive byte for byte (quotes, `$(...)` and
    backquotes included) and are installed, and the image is cleaned. The one download is the pinned uv,
    installed at /opt/pcflow/bin/uv (what the aws-gpu profile's training.environment.builder names)."""
    builder.base_os("ubuntu2204")
    script = builder.stand_in_uv()
    name = builder.good_python()
    result = builder.run(script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    venv_python = builder.venv / "bin/python"
    probe = "import sys, torch.distributed as d; print('%d.%d' % sys.version_info[:2], d.is_available())"
    answer = subprocess.run([venv_python, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert answer.split() == [name.removeprefix("python"), "True"]
    config = (builder.venv / "pyvenv.cfg").read_text()
    assert f"home = {builder.bin}\n" in config and f"/{name} -m venv --clear " in config  # not python3
    assert (builder.root / "opt/pcflow/payload-requirements.txt").read_text() == REQUIREMENTS + "\n"
    assert not Path("/tmp/pcflow-pwned").exists()
    url = [line for line in builder.curl_log.read_text().splitlines() if line.startswith("https://")]
    assert len(url) == 1 and f"/uv-0.13.9-py3-none-manylinux_2_17_{platform.machine()}" in url[0]
    uv = builder.root / "opt/pcflow/bin/uv"
    assert oct(uv.stat().st_mode & 0o777) == "0o755"
    assert subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout.startswith("uv 0.13.9")
    profile = (include_dir() / "profiles/aws-gpu.yaml").read_text()
    assert "builder: /opt/pcflow/bin/uv " in profile
    assert not any((builder.root / "var/lib/cloud/instances").iterdir())
    for leftover in ("etc/ssh/ssh_host_ed25519_key", "root/.bash_history", "home/ubuntu/.bash_history"):
        assert not (builder.root / leftover).exists()
    # The environment's integrity record: every file with its sha256 (modules compiled first), and its check passes.
    recorded = parse_checksum_list((builder.venv / ".pcflow-record/files.sha256").read_text())
    assert f"lib/python3.{sys.version_info.minor}/site-packages/torch/distributed/__init__.py" in recorded
    assert any(path.endswith(".pyc") and "/torch/distributed/__pycache__/" in path for path in recorded)
    assert "bin/python ->" in (builder.venv / ".pcflow-record/links").read_text()
    argv = ["bash", str(include_dir() / "ami/tree-record.sh"), "check", str(builder.venv)]
    check = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert check.stdout.splitlines()[0] == "full" and check.stdout.splitlines()[1].startswith("record "), check.stdout


def test_the_bake_enables_pyxis_from_parallelclusters_examples(builder):
    """ParallelCluster's images (3.11.1+) keep Pyxis disabled, its settings in /opt/parallelcluster/examples:
    the bake puts them where Slurm and enroot read them, and has the runtime directories made at boot. An
    image without them bakes as before, saying so."""
    builder.base_os("ubuntu2204")
    script = builder.stand_in_uv()
    builder.good_python()
    without = builder.run(script=script)
    assert without.returncode == 0, without.stderr[-3000:]
    assert "no Pyxis in this image" in without.stdout + without.stderr
    assert not (builder.root / "opt/slurm/etc/plugstack.conf").exists()
    examples = builder.root / "opt/parallelcluster/examples"
    files = {"pyxis/pyxis.conf": "required /usr/local/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis\n",
             "spank/plugstack.conf": "include /opt/slurm/etc/plugstack.conf.d/*\n",
             "enroot/enroot.conf": "ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)\n"}  # fmt: skip
    for name, text in files.items():
        (examples / name).parent.mkdir(parents=True, exist_ok=True)
        (examples / name).write_text(text)
    result = builder.run(script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (builder.root / "opt/slurm/etc/plugstack.conf.d/pyxis.conf").read_text() == files["pyxis/pyxis.conf"]
    assert (builder.root / "opt/slurm/etc/plugstack.conf").read_text() == files["spank/plugstack.conf"]
    assert (builder.root / "etc/enroot/enroot.conf").read_text() == files["enroot/enroot.conf"]
    assert oct((builder.root / "var/enroot").stat().st_mode & 0o7777) == "0o1777"
    tmpfiles = (builder.root / "etc/tmpfiles.d/pcflow-pyxis.conf").read_text().splitlines()
    assert tmpfiles == ["d /run/enroot 1777 root root -", "d /run/pyxis 1777 root root -"]


def test_the_command_is_one_posix_line_that_runs_the_script_with_bash():
    """Nothing before the script but `exec env NAME=... bash -c`: dash parses it, bash runs the script."""
    text = rendered(REQUIREMENTS)
    assert text.startswith("exec env 'PCFLOW_PAYLOAD_REQUIREMENTS=# requires-python: >=3.11\n")
    assert " PCFLOW_PYTHON_MIN=3.11 'PCFLOW_TREE_RECORD=#!/bin/bash\n# A directory tree" in text
    assert " bash -c '#!/bin/bash\n# Runs once on the AMI builder" in text
    dry = subprocess.run([posix_sh(), "-n", "-c", text], capture_output=True, text=True, check=False)
    assert dry.returncode == 0, dry.stderr
    subprocess.run(["bash", "-n", "-c", load_script("ami/bootstrap.sh")], check=True)


def test_requirements_must_say_which_python_they_need():
    assert required_python("# requires-python: >=3.12\nnumpy==2.4.6\n", "r.txt") == "3.12"
    for text in (
        "numpy==2.4.6\n",
        "# requires-python: >=3.11\n# requires-python: >=3.12\n",
        "# requires-python: ~=3.11\n",
    ):
        with pytest.raises(ValueError, match=r"r\.txt must say once which Python .*`# requires-python: >=3\.11`"):
            required_python(text, "r.txt")
    payload = include_dir().parent / "examples/simclr/requirements.txt"
    assert required_python(payload.read_text(), payload) == "3.11"  # numpy 2.4 needs it


def test_the_bake_passes_the_python_the_payload_needs(tmp_path):
    """The operator reads it from the environment file before anything is launched (no AWS call here)."""
    payload = include_dir().parent / "examples/simclr/requirements.txt"
    undeclared = tmp_path / "requirements.txt"
    undeclared.write_text("numpy==2.4.6\n")

    def operator(environment_file: Path) -> BakeImageOperator:
        return BakeImageOperator(
            task_id="ami",
            stack="bake",
            pcluster_version="3.16.1",
            bootstrap_script_path="ami/bootstrap.sh",
            instance_profile="pcflow-ami-builder",
            subnet_id="subnet-0123456789abcdef0",
            environment_file=str(environment_file),
        )

    env = operator(payload).script_env()
    assert env == {
        "PCFLOW_PAYLOAD_REQUIREMENTS": payload.read_text(),
        "PCFLOW_PYTHON_MIN": "3.11",
        "PCFLOW_TREE_RECORD": (include_dir() / "ami/tree-record.sh").read_text(),
    }
    with pytest.raises(ValueError, match="must say once which Python"):
        operator(undeclared).script_env()


def test_the_bootstrap_pins_the_projects_uv():
    makefile = (include_dir().parent / "Makefile").read_text()
    project = re.search(r"^UV_VERSION := (\S+)$", makefile, re.MULTILINE).group(1)
    script = load_script("ami/bootstrap.sh")
    assert re.search(r"^UV_VERSION=(\S+)", script, re.MULTILINE).group(1) == project
    for arch in ("x86_64", "aarch64"):
        wheel = re.search(rf"^UV_WHEEL_{arch}=(\S+)$", script, re.MULTILINE).group(1)
        assert wheel.endswith(".whl") and f"/uv-{project}-py3-none-manylinux_2_17_{arch}" in wheel
        assert re.search(rf"^UV_SHA256_{arch}=[0-9a-f]{{64}}$", script, re.MULTILINE)
