"""SageMaker-style metric definitions: a name and a regex with one group, run over the job's log.

For programs that only print (`Epoch 3 ... val_acc=0.61`). Definitions are checked before anything
runs: a regex that does not compile or does not have exactly one group is refused with a message.
A definition that matches nothing is not an error: the harvest reports it as missing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pcflow.metrics.jsonlines import _number
from pcflow.metrics.series import Point

NAME = re.compile(r"^[A-Za-z0-9_.:/\-]{1,128}$")


@dataclass(frozen=True)
class MetricDefinition:
    name: str
    regex: str

    def __post_init__(self) -> None:
        if not NAME.match(self.name or ""):
            raise ValueError(f"metric definition name {self.name!r}: use 1-128 letters, digits and _.:/-")
        try:
            pattern = re.compile(self.regex)
        except (re.error, TypeError) as exc:
            raise ValueError(f"metric definition {self.name!r}: invalid regex {self.regex!r}: {exc}") from exc
        if pattern.groups != 1:
            raise ValueError(
                f"metric definition {self.name!r}: the regex must have exactly one capturing group (the value), "
                f"{self.regex!r} has {pattern.groups}; use (?:...) for grouping that is not the value"
            )

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.regex)

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "regex": self.regex}


def parse_definitions(raw: Iterable[Mapping[str, Any] | MetricDefinition] | None) -> list[MetricDefinition]:
    """`[{"Name": ..., "Regex": ...}]` (SageMaker's spelling) or `[{"name": ..., "regex": ...}]`."""
    definitions: list[MetricDefinition] = []
    for item in raw or []:
        if isinstance(item, MetricDefinition):
            definitions.append(item)
            continue
        if not isinstance(item, Mapping):
            raise ValueError(f"a metric definition is a mapping with name and regex, got {item!r}")
        name = item.get("name", item.get("Name"))
        regex = item.get("regex", item.get("Regex"))
        definitions.append(MetricDefinition(str(name or ""), regex if isinstance(regex, str) else ""))
    names = [d.name for d in definitions]
    if len(set(names)) != len(names):
        raise ValueError(f"metric definition names must be unique, got {names}")
    return definitions


def scan_log(text: str, definitions: Sequence[MetricDefinition]) -> tuple[list[Point], list[str]]:
    """Points of every match (step = the match's ordinal, as SageMaker counts), and definitions that
    matched nothing. A match whose group is not a number is skipped."""
    points: list[Point] = []
    unmatched: list[str] = []
    for definition in definitions:
        found = 0
        for match in definition.pattern.finditer(text):
            raw = match.group(1)
            try:
                value = float(raw)
            except (TypeError, ValueError):
                value = _number(raw)
                if value is None:
                    continue
            points.append(Point(definition.name, value, step=found, split=None))
            found += 1
        if not found:
            unmatched.append(definition.name)
    return points, unmatched
