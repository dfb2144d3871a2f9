"""A job's log scanned with the run's metric definitions (pcflow.metric_definitions: checked when the run
spec is, before anything runs): each match of a definition's group is a point, its ordinal the step, as
SageMaker counts. A definition that matches nothing is not an error: the harvest reports it as missing.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from pcflow.metric_definitions import MetricDefinition
from pcflow.readings.jsonlines import _number
from pcflow.readings.series import Point

#: Matches examined per definition (a pattern matching the empty string matches everywhere).
MAX_MATCHES = 100_000


def scan_log(text: bytes | str, definitions: Sequence[MetricDefinition]) -> tuple[list[Point], list[str]]:
    """Points of every match (step = the match's ordinal, as SageMaker counts), and definitions that
    matched nothing. A match whose group is not a number is skipped; past MAX_MATCHES, the rest is."""
    points: list[Point] = []
    unmatched: list[str] = []
    for definition in definitions:
        found = 0
        for match in itertools.islice(definition.pattern.finditer(text), MAX_MATCHES):
            value = _value(match.group(1))
            if value is None:
                continue
            points.append(Point(definition.name, value, step=found, split=None))
            found += 1
        if not found:
            unmatched.append(definition.name)
    return points, unmatched


def _value(raw: bytes | str | None) -> float | None:
    if raw is None:
        return None
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        return float(text)
    except ValueError:
        return _number(text)
