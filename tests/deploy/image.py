"""The Airflow image of the Dockerfile, laid out on this host (there is no container engine): what goes
where is read from the Dockerfile's own instructions (the files its COPY lines put in the wheel's build
context, the directory its `pip install --no-deps` installs, the USER that runs it, its ENV), so a change
to the Dockerfile changes the layout the tests run. The base image's facts, which the Dockerfile builds
on without restating, are named here. Compose's mounts and environment come on top (deploy.services)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
BIN = Path(sys.executable).parent
UV = BIN / "uv"
#: The official apache/airflow image: AIRFLOW_HOME and the working directory are /opt/airflow; it runs
#: as `airflow` (uid 50000), and its pip installs into the invoking user's site-packages (PIP_USER=true).
BASE_AIRFLOW_HOME = BASE_WORKDIR = "/opt/airflow"
BASE_USER = "50000"
BASE_USER_SITE = {user: "/home/airflow/.local/lib/python3.11/site-packages" for user in ("50000", "airflow")}
#: The wheel's layer: `pip install [options] --no-deps <the build context COPY filled in>`.
WHEEL_INSTALL = re.compile(r"\bpip install\b[^&|;]*?--no-deps\s+(/\S+)")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    user: str  # the USER in effect when it runs


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined and comment lines dropped."""
    found, pending, user = [], "", BASE_USER
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        keyword, _, args = (pending + line).strip().partition(" ")
        pending = ""
        if keyword.upper() == "USER":
            user = args.strip().split(":")[0]
        found.append(Instruction(keyword.upper(), args.strip(), user))
    return found


@dataclass(frozen=True)
class Dockerfile:
    steps: list[Instruction]

    @classmethod
    def read(cls, path: Path = DOCKERFILE) -> Dockerfile:
        return cls(instructions(path.read_text()))

    @property
    def env(self) -> dict[str, str]:
        """The image's ENV settings (`ENV K=V ...`), ARG defaults and earlier ENV expanded in them."""
        known: dict[str, str] = {}
        env: dict[str, str] = {}
        for step in self.steps:
            if step.keyword in ("ARG", "ENV"):
                for pair in shlex.split(step.args):
                    name, _, value = pair.partition("=")
                    value = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: known.get(m[1] or m[2], ""), value)
                    known[name] = value
                    if step.keyword == "ENV":
                        env[name] = value
        return env

    @property
    def workdir(self) -> str:
        workdirs = [step.args for step in self.steps if step.keyword == "WORKDIR"]
        return workdirs[-1] if workdirs else BASE_WORKDIR

    def wheel_install(self) -> Instruction:
        (step,) = [s for s in self.steps if s.keyword == "RUN" and WHEEL_INSTALL.search(s.args)]
        return step

    @property
    def wheel_context(self) -> str:
        """The directory the wheel is built from in the image (`pip install ... --no-deps <it>`)."""
        return WHEEL_INSTALL.search(self.wheel_install().args)[1].rstrip("/")

    @property
    def site_packages(self) -> str:
        """Where that pip puts the wheel: the site-packages of the USER it runs as."""
        return BASE_USER_SITE[self.wheel_install().user]

    def copies_into(self, directory: str) -> list[tuple[list[str], str]]:
        """(sources in the build context, destination) of each COPY that writes into `directory`."""
        copies = []
        for step in self.steps:
            if step.keyword == "COPY":
                *sources, dest = [word for word in shlex.split(step.args) if not word.startswith("--")]
                if dest.rstrip("/") == directory or dest.startswith(directory + "/"):
                    copies.append((sources, dest))
        return copies


def stage_context(dockerfile: Dockerfile, root: Path) -> Path:
    """The wheel's build context as the image holds it, under `root`: each COPY into it done as Docker
    does (a directory's contents into the destination; files into a destination ending in `/`)."""
    for sources, dest in dockerfile.copies_into(dockerfile.wheel_context):
        target = root / dest.lstrip("/")
        for source in sources:
            path = REPO / source
            if path.is_dir():
                shutil.copytree(path, target, dirs_exist_ok=True)
            else:
                into = target / path.name if dest.endswith("/") or len(sources) > 1 else target
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, into)
    return root / dockerfile.wheel_context.lstrip("/")


def build_wheel(dockerfile: Dockerfile, root: Path) -> Path:
    """The wheel the image's pip builds from its context (hatchling, pinned in pyproject.toml): about 3 s."""
    context = stage_context(dockerfile, root / "context")
    out = root / "dist"
    subprocess.run([str(UV), "build", "--wheel", "--quiet", "-o", str(out), str(context)], check=True, timeout=300)
    (built,) = out.glob("pcflow-*.whl")
    return built


@dataclass(frozen=True)
class Image:
    """The image under `root` (its paths below root), with the wheel installed where the image has it;
    Airflow and the other requirements come from this environment, as the image's layer 2 pins them."""

    root: Path
    dockerfile: Dockerfile

    @property
    def site(self) -> Path:
        return self.root / self.dockerfile.site_packages.lstrip("/")

    def install(self, wheel: Path) -> Image:
        argv = [str(UV), "pip", "install", "--quiet", "--python", sys.executable, "--no-deps", "--target"]
        subprocess.run([*argv, str(self.site), str(wheel)], check=True, timeout=300)
        return self

    def environment(self) -> dict[str, str]:
        """A process of the image: its PATH (Airflow's scripts first), locale and ENV, pcflow from the
        installed wheel and nothing from the checkout (neither plugins/ nor include/ on the path)."""
        keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "TZ", "USER", "TMPDIR")}
        path = os.pathsep.join([str(BIN), "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
        return {**keep, **self.dockerfile.env, "PATH": path, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(self.site)}
