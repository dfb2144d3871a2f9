"""Where pcflow's non-Python assets live (`include/`), in a checkout and in the Airflow image alike; where
the deployment's profiles are; and the one check that keeps a path under its root."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

#: Directories of the deployment admin's own profiles (os.pathsep-separated), looked up before
#: include/profiles/; read by the DAG processor (the form's choices) and by the workers (the runs).
PROFILES_DIR_ENV = "PCFLOW_PROFILES_DIR"
#: The profile each DAG's trigger form (and every scheduled run) starts with.
DEFAULT_PROFILE_ENV = "PCFLOW_DEFAULT_PROFILE"


def include_dir() -> Path:
    """`PCFLOW_INCLUDE_DIR`, else the `include/` beside `plugins/` (the layout of the repo and the image)."""
    configured = os.environ.get("PCFLOW_INCLUDE_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parents[2] / "include"


def profile_dirs() -> list[Path]:
    """Where profiles are looked up, first match wins: the admin's directories, then include/profiles/."""
    configured = [Path(p) for p in os.environ.get(PROFILES_DIR_ENV, "").split(os.pathsep) if p]
    return [*configured, include_dir() / "profiles"]


def profile_names() -> list[str]:
    """The profiles that exist (a directory listing: cheap enough for DAG parsing)."""
    from pcflow.patterns import PROFILE_NAME

    found = {p.stem for d in profile_dirs() if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(name for name in found if PROFILE_NAME.match(name))


def default_profile() -> str | None:
    """The deployment's default profile (an environment setting: no I/O), None when it names none."""
    return os.environ.get(DEFAULT_PROFILE_ENV) or None


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
