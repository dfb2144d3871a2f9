"""Where pcflow's non-Python assets live (`include/`), in a checkout and in the Airflow image alike; where
the deployment's profiles are and which of them it offers; which directory a payload's name means; and
the one check that keeps a path under its root."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from pcflow.errors import ConfigurationError, deployment_admin, refused
from pcflow.patterns import PAYLOAD_NAME, PROFILE_NAME

#: Directories of the deployment admin's own profiles (os.pathsep-separated), looked up before
#: include/profiles/; read by the DAG processor (the form's choices) and by the workers (the runs).
PROFILES_DIR_ENV = "PCFLOW_PROFILES_DIR"
#: The profile each DAG's trigger form (and every scheduled run) starts with.
DEFAULT_PROFILE_ENV = "PCFLOW_DEFAULT_PROFILE"
#: The profiles a run may name, comma-separated (the form's choices); unset or empty: every profile found.
OFFERED_PROFILES_ENV = "PCFLOW_OFFERED_PROFILES"


#: Where the deployment keeps include/ (docker-compose.yaml: its mount, /opt/airflow/include).
INCLUDE_DIR_ENV = "PCFLOW_INCLUDE_DIR"
#: Where it keeps examples/ (docker-compose.yaml: /opt/airflow/examples); unset: beside include/.
EXAMPLES_DIR_ENV = "PCFLOW_EXAMPLES_DIR"


def checkout_root() -> Path | None:
    """The checkout pcflow is imported from (its package is `<root>/plugins/pcflow`, with `<root>/include`:
    pytest, `make demo`, the editable install), or None for an installed wheel (the image), whose package
    sits in site-packages with nothing of the checkout beside it."""
    package = Path(__file__).resolve().parent
    root = package.parents[1]
    return root if package.parent.name == "plugins" and (root / "include").is_dir() else None


def include_dir() -> Path:
    """`PCFLOW_INCLUDE_DIR`, else the checkout's `include/`. An installed pcflow has no include/ of its own:
    a path guessed beside site-packages would only fail later as "no profile 'aws-gpu' in <somewhere>", so
    a deployment that names none, or names a directory nothing is mounted at, is told which setting to fix."""
    configured = os.environ.get(INCLUDE_DIR_ENV)
    if configured:
        if not Path(configured).is_dir():
            problem = (
                f"{configured} is not a directory; mount the checkout's include/ there "
                "(docker-compose.yaml mounts ./include at /opt/airflow/include)"
            )
            raise refused(INCLUDE_DIR_ENV, problem, deployment_admin())
        return Path(configured)
    root = checkout_root()
    if root is None:
        raise ConfigurationError(
            f"{INCLUDE_DIR_ENV} is not set and pcflow is installed in {Path(__file__).resolve().parents[1]}, "
            "not in a checkout: set it to where the deployment mounts the checkout's include/ "
            f"(docker-compose.yaml: /opt/airflow/include); {deployment_admin()}"
        )
    return root / "include"


def payloads_dir() -> Path:
    """`include/payloads/`: the admin's own payloads (a trigger user's code comes through `training.code`)."""
    return include_dir() / "payloads"


def examples_dir() -> Path:
    """`PCFLOW_EXAMPLES_DIR`, else `examples/` beside include/: the projects pcflow ships as a user would
    write them, which a profile may train as its payload (docker-compose.yaml mounts and names them)."""
    configured = os.environ.get(EXAMPLES_DIR_ENV)
    return Path(configured) if configured else include_dir().parent / "examples"


def payload_roots() -> list[Path]:
    """Where a payload's name is looked up: `include/payloads/`, then `examples/`, whose projects (SimCLR,
    the shipped profiles' default) are trained from where they are, not copied. Both are the deployment's."""
    return [payloads_dir(), examples_dir()]


def roots_holding(name: str) -> list[Path]:
    """The payload roots that have a directory `name`, in lookup order (more than one: an ambiguous name,
    which shipping refuses; none: no such payload)."""
    return [root for root in payload_roots() if (root / name).is_dir()]


class PayloadError(ConfigurationError):
    """The payload cannot be shipped as it is; the message says what to change."""


def payload_source(name: str) -> Path:
    """`<root>/<name>/` of the one payload root that has it, refused unless it is a plain name of an
    existing directory there (not a link out of it), and named by one root only."""
    if not isinstance(name, str) or not PAYLOAD_NAME.fullmatch(name):
        raise PayloadError(f"payload: {name!r} is not a payload name (lower-case letters, digits, _ and -)")
    found = roots_holding(name)
    if len(found) > 1:
        raise PayloadError(f"payload: {name!r} is a directory of both {found[0]} and {found[1]}: rename one")
    if not found:
        available = sorted(
            {
                p.name
                for root in payload_roots()
                if root.is_dir()
                for p in root.iterdir()
                if p.is_dir() and PAYLOAD_NAME.fullmatch(p.name)
            }
        )
        where = " and ".join(str(root) for root in payload_roots())
        raise PayloadError(f"payload: no directory {name!r} in {where}; available: {', '.join(available)}")
    try:
        return within(found[0] / name, found[0])  # a link out of its root is refused
    except ValueError as exc:
        raise PayloadError(f"payload: {exc}") from None


def profile_dirs() -> list[Path]:
    """Where profiles are looked up, first match wins: the admin's directories, then include/profiles/."""
    configured = [Path(p) for p in os.environ.get(PROFILES_DIR_ENV, "").split(os.pathsep) if p]
    return [*configured, include_dir() / "profiles"]


def profile_names() -> list[str]:
    """The profiles that exist (a directory listing: cheap enough for DAG parsing)."""
    found = {p.stem for d in profile_dirs() if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(name for name in found if PROFILE_NAME.fullmatch(name))


def default_profile() -> str | None:
    """The deployment's default profile (an environment setting: no I/O), None when it names none."""
    return os.environ.get(DEFAULT_PROFILE_ENV) or None


def offered_profiles() -> list[str]:
    """The profiles this deployment offers: `PCFLOW_OFFERED_PROFILES` in the admin's order, else every
    profile found. The form asks when a DAG file is parsed and the first task asks again for each run,
    so a setting that names a profile with no file, or leaves the default out, fails both (a
    ConfigurationError naming the setting): the DAG files do not import, and no run starts."""

    found = profile_names()
    setting = os.environ.get(OFFERED_PROFILES_ENV, "")
    named = list(dict.fromkeys(name.strip() for name in setting.split(",") if name.strip()))
    missing = [name for name in named if name not in found]
    if missing:
        problem = (
            f"no profile file for {', '.join(map(repr, missing))} in {os.pathsep.join(map(str, profile_dirs()))}"
            f"; profiles found: {', '.join(found)}"
        )
        raise refused(OFFERED_PROFILES_ENV, problem, deployment_admin())
    offered = named or found
    default = default_profile()
    if default is not None and default not in offered:
        where = f"{OFFERED_PROFILES_ENV} offers" if named else f"that exist ({OFFERED_PROFILES_ENV} unset)"
        problem = f"{default!r} is not among the profiles {where} ({', '.join(offered)}); the default must be one"
        raise refused(DEFAULT_PROFILE_ENV, problem, deployment_admin())
    return offered


def check_offered(profile: object) -> None:
    """Refuse (ConfigurationError) a run that names a profile this deployment does not offer."""
    offered = offered_profiles()
    if profile not in offered:
        raise ConfigurationError(
            f"profile: {profile!r} is not offered on this deployment; choose one of {', '.join(offered)} "
            f"(the admin decides which, in {OFFERED_PROFILES_ENV})"
        )


def within(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path:
    """`path` with symlinks and `..` resolved, refused (ValueError) unless it is `root` or below it."""
    resolved, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if resolved != top and top not in resolved.parents:
        raise ValueError(f"{os.fspath(path)!r} is outside {os.fspath(root)!r}")
    return resolved


def remote_within(path: str, root: str) -> str:
    """The same for a path on the cluster (POSIX, not resolvable from here): normalised, refused unless
    it stays under `root`, which must itself be absolute."""
    if not root.startswith("/"):
        raise ValueError(f"{root!r} is not an absolute path")
    normal, top = posixpath.normpath(path), posixpath.normpath(root)
    if normal != top and not normal.startswith(top.rstrip("/") + "/"):
        raise ValueError(f"{path!r} is outside {root!r}")
    return normal


def ami_script(path: str | os.PathLike[str]) -> Path:
    """A bootstrap script: a file of include/ami/ (relative paths are taken from include/), symlinks and
    `..` resolved; anything that ends elsewhere is refused (ValueError)."""
    script = Path(path)
    try:
        return within(script if script.is_absolute() else include_dir() / script, include_dir() / "ami")
    except ValueError:
        raise ValueError(f"bootstrap script {os.fspath(path)!r} is not in include/ami/") from None
