"""What a person who triggers a run may change: the profile's `overridable` section, checked against the
run's conf (the trigger form, `--dag-run-conf`, a backfill's conf) before anything is merged.

The deployment admin writes the profiles; a profile lists, by dotted path, the settings a trigger user
may change and within what bounds (docs/security.md). Everything else is the admin's: the first task
refuses it, naming the field and who may change it.

    overridable:
      training.hyperparameters: {}              # any value the settings' own schema accepts
      training.nodes: {min: 1, max: 4}          # numbers within bounds
      instance_type: {one_of: [g5.12xlarge]}    # one of a list
      dataset.source: {under: [/data/raw, s3://raw-data/imagenet]}  # dataset roots (pcflow.datasource)

A path covers everything below it (`training.hyperparameters` covers `training.hyperparameters.lr`);
bounds apply to the value at the path itself. A conf never removes a setting: null at any path is
refused (a budget of null would otherwise run with no cap at all), so what a conf leaves out, or sets
to null, is the profile's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pcflow.datasource import SourceRefused, resolve_source
from pcflow.errors import ConfigurationError, profile_admin, refusal, trigger_user

DOTTED_PATH = re.compile(r"^[a-z_][a-z0-9_]*(\.[A-Za-z0-9_-]+)*$")
#: Never overridable, whatever a profile lists: who may SSH to the head node (aws/ssh_ingress.py).
#: Nor what a bundle of a run's code may hold (its size cap, shipping what looks like a secret: pcflow.code).
#: Nor the subnets the cluster's nodes launch in (an adopted VPC's, the other zones' of a capacity fallback:
#: pcflow.aws.network), which a run would otherwise point at any subnet the account has.
ADMIN_ALONE = (
    "network.ssh_ingress_cidrs",
    "network.allow_ssh_from_anywhere",
    "training.bundle",
    "network.vpc_id",
    "network.public_subnet_id",
    "network.private_subnet_ids",
    "network.zone_subnet_cidrs",
)
#: A URL with a scheme other than s3:// (a git repository's): `under` compares it by whole path segments.
URL = re.compile(r"^(?!s3://)[a-z][a-z0-9+.-]*://")


class ConfRefused(ConfigurationError):
    """The run's conf changes what its profile does not let a trigger user change; one line per field."""


class Rule(BaseModel):
    """How one overridable setting may be changed: any valid value, or within these bounds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: float | None = None
    max: float | None = None
    one_of: list[Any] | None = None
    under: list[str] | None = None  # roots: built-ins, local, S3 (pcflow.datasource) and URL prefixes

    def refuses(self, value: Any) -> str | None:
        """Why `value` is outside this rule's bounds, or None."""
        if self.min is not None or self.max is not None:
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                return f"{value!r} is not a number"
            if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
                return f"{value!r} is outside what the profile allows ({_bounds(self.min, self.max)})"
        if self.one_of is not None and not any(_same(value, allowed) for allowed in self.one_of):
            return f"{value!r} is not one the profile allows ({', '.join(map(str, self.one_of))})"
        if self.under is not None:
            return _source_refused(value, self.under)
        return None


def _bounds(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{low:g} to {high:g}"
    return f"at least {low:g}" if low is not None else f"at most {high:g}"


def _same(value: Any, allowed: Any) -> bool:
    """Equal and of the same kind: `True` is not `1`, `"1"` is not `1` (but `2` is `2.0`)."""
    if isinstance(value, bool) or isinstance(allowed, bool):
        return value is allowed
    if isinstance(value, int | float) and isinstance(allowed, int | float):
        return value == allowed
    return type(value) is type(allowed) and value == allowed


def parse_rules(section: Any, profile: str) -> dict[str, Rule]:
    """The profile's `overridable` section, checked (an admin's mistake is named, like a user's)."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ConfRefused(f"profile {profile!r}: overridable: must map dotted setting paths to rules")
    rules = {}
    for path, rule in section.items():
        if not isinstance(path, str) or not DOTTED_PATH.fullmatch(path):
            raise ConfRefused(f"profile {profile!r}: overridable: {path!r} is not a dotted setting path")
        covered = [alone for alone in ADMIN_ALONE if alone == path or alone.startswith(f"{path}.")]
        if covered:
            raise ConfRefused(
                f"profile {profile!r}: overridable: {path!r} covers {', '.join(covered)}, which only the "
                "deployment admin sets (who may SSH to the head node, the subnets nodes launch in, a bundle's limits); "
                "list narrower paths"
            )
        try:
            rules[path] = Rule.model_validate(rule or {})
        except ValidationError as exc:
            raise ConfRefused(f"profile {profile!r}: overridable.{path}: {exc.errors()[0]['msg']}") from None
    return rules


def changed_paths(document: Mapping[str, Any], rules: Mapping[str, Rule], prefix: str = "") -> Iterator[tuple]:
    """(dotted path, value) of what `document` changes when merged over a profile: its leaves, or a whole
    mapping where a rule names it and none names anything below it. An empty mapping changes nothing."""
    for key, value in document.items():
        path = f"{prefix}{key}"
        ruled_below = any(rule.startswith(f"{path}.") for rule in rules)
        if isinstance(value, Mapping) and (path not in rules or ruled_below):
            yield from changed_paths(value, rules, f"{path}.")
        elif not (isinstance(value, Mapping) and not value):
            yield path, value


def rule_for(path: str, rules: Mapping[str, Rule]) -> Rule | None:
    """The rule at `path` or at a path above it (whose bounds then do not apply: it covers all below)."""
    if path in rules:
        return rules[path]
    parents = [p for p in rules if path.startswith(f"{p}.")]
    return Rule() if parents else None


def owner_of(path: str, rules: Mapping[str, Rule], profile: str) -> str:
    """Who may change the setting at `path` (errors.py's words): a trigger user where the profile's
    `overridable` covers it, else the deployment admin alone."""
    return trigger_user(profile) if rule_for(path, rules) is not None else profile_admin(profile)


def refusals(
    changes: Mapping[str, Any], rules: Mapping[str, Rule], profile: str, labels: Mapping[str, str] | None = None
) -> list[str]:
    """One line per change the profile does not allow: the field, and who may change it."""
    lines = []
    for path, value in changed_paths(changes, rules):
        field = f"{path} (form field {labels[path]!r})" if labels and path in labels else path
        rule = rule_for(path, rules)
        if rule is None:
            allowed = ", ".join(sorted(rules)) or "nothing"
            lines.append(f"{refusal(field, None, profile_admin(profile))}; a run's conf may change only {allowed}")
        elif value is None:
            problem = "null would remove the profile's value (leave the field out to keep it)"
            lines.append(refusal(field, problem, profile_admin(profile)))
        elif why := rule.refuses(value):
            lines.append(refusal(field, why, trigger_user(profile)))
    return lines


def _source_refused(source: Any, roots: list[str]) -> str | None:
    """Why a source (a dataset's, a run's code) is not under one of the profile's roots, or None: a URL by
    `url_under`, everything else as pcflow.datasource decides for a dataset source."""
    if isinstance(source, str) and URL.match(source):
        if any(url_under(source, root) for root in roots):
            return None
        return f"{source!r} is not under a URL the profile allows ({', '.join(roots) or 'none'})"
    try:
        resolve_source(source, roots)
    except SourceRefused as exc:
        return str(exc)
    return None


def url_under(url: str, root: str) -> bool:
    """Whether `url` lies under `root`: the same scheme and host, then whole path segments (no `.` or `..`);
    a file:// URL's path once symlinks and `..` are resolved (paths.within), as a directory's is."""
    from urllib.parse import urlsplit

    from pcflow.paths import within

    if not URL.match(root):
        return False
    got, top = urlsplit(url), urlsplit(root)
    if (got.scheme, got.netloc) != (top.scheme, top.netloc) or got.query or got.fragment:
        return False
    if got.scheme == "file":
        try:
            within(got.path, top.path)
        except ValueError:
            return False
        return True
    parts, prefix = got.path.rstrip("/").split("/"), top.path.rstrip("/").split("/")
    return not any(part in (".", "..") for part in parts) and parts[: len(prefix)] == prefix
