"""A profile's document as its admin wrote it, read from the profile directories (`paths.profile_dirs`).

Light on purpose (YAML and a merge, no settings models): the nightly's DAG file reads its profile's
`nightly` section when it is parsed (`lineage.nightly_schedule`); runs validate the whole document
(`runspec.resolve_run_spec`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from pcflow.errors import ConfigurationError
from pcflow.merge import deep_merge
from pcflow.paths import include_dir, profile_dirs, profile_names
from pcflow.patterns import PROFILE_NAME

#: libyaml's safe loader where PyYAML has it (7x faster: the nightly's DAG file reads a profile at each parse).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class RunSpecError(ConfigurationError):
    """The run's settings are invalid; the message lists every field that is wrong and why."""


def load_profile(name: str, _children: tuple[str, ...] = ()) -> dict[str, Any]:
    """The profile's document as its admin wrote it (`overridable` included), from the first profile
    directory that has it; one with `extends: <profile>` is laid over that profile (an overlay)."""
    if not isinstance(name, str) or not PROFILE_NAME.fullmatch(name):
        raise RunSpecError(f"profile: {name!r} is not a profile name; available: {', '.join(profile_names())}")
    for directory in profile_dirs():
        path = directory / f"{name}.yaml"
        if path.is_file():
            return with_parent(yaml.load(path.read_text(), Loader=SAFE_LOADER) or {}, (*_children, name))
    searched = ", ".join(str(d) for d in profile_dirs())
    raise RunSpecError(f"profile: no profile {name!r} in {searched}; available: {', '.join(profile_names())}")


def with_parent(document: dict[str, Any], chain: tuple[str, ...]) -> dict[str, Any]:
    """`document` over the profile it `extends` (itself resolved the same way), without the `extends` key."""
    parent = document.pop("extends", None)
    if parent is None:
        return document
    if parent in chain:
        raise RunSpecError(f"profile {chain[-1]!r}: `extends` loops ({' -> '.join([*chain, parent])})")
    return deep_merge(load_profile(parent, chain), document)


def stack_dir() -> Path:
    """The local stack's state directory (`PCFLOW_STACK_DIR`, else the checkout's `.stack`), where its
    example repositories live: what `{stack}` in a profile stands for."""
    return Path(os.environ.get("PCFLOW_STACK_DIR") or include_dir().parent / ".stack")


def expand_paths(value: Any) -> Any:
    """`{include}` in a profile's strings stands for pcflow's include directory (payloads, scripts),
    `{stack}` for the local stack's directory (stack_dir)."""
    if isinstance(value, str):
        return value.replace("{include}", str(include_dir())).replace("{stack}", str(stack_dir()))
    if isinstance(value, list):
        return [expand_paths(v) for v in value]
    if isinstance(value, dict):
        return {k: expand_paths(v) for k, v in value.items()}
    return value
