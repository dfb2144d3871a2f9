"""SageMaker-style metric definitions: a name and a regex with one group, which the harvest runs over the job's
log (pcflow.metrics.definitions.scan_log).

For programs that only print (`Epoch 3 ... val_acc=0.61`). Definitions are checked before anything
runs: a regex that does not compile or does not have exactly one group is refused with a message.
A definition that matches nothing is not an error: the harvest reports it as missing.

The regexes come from whoever triggers the run and run over up to 32 MiB of log, so they are RE2
(google-re2): matching takes time linear in the log whatever the pattern, where Python's `re` can
backtrack for hours on `(a+)+$`. RE2 has no backreferences or lookaround; such a regex is refused.
How many definitions, how long a pattern and how many matches each may yield are capped too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import re2

from pcflow.patterns import METRIC_NAME

MAX_DEFINITIONS = 32
MAX_PATTERN_CHARS = 1024
#: The compiled automaton's memory (RE2's own bound; a pattern that needs more is refused).
RE2_MAX_MEM = 8 * 1024 * 1024


def compile_re2(regex: str) -> re2._Regexp:
    """An RE2 pattern with pcflow's memory bound and without RE2's own stderr logging (the refusal says why):
    matching stays linear in the log whatever the pattern."""
    options = re2.Options()
    options.log_errors = False  # the refusal says why; RE2 would also print it to stderr
    options.max_mem = RE2_MAX_MEM
    return re2.compile(regex, options)


@dataclass(frozen=True)
class MetricDefinition:
    """A SageMaker-style metric definition, checked on construction: a plain name, an RE2 regex of bounded
    length with exactly one group (the value). Anything else is refused before the job runs."""

    name: str
    regex: str

    def __post_init__(self) -> None:
        if not METRIC_NAME.fullmatch(self.name or ""):
            raise ValueError(f"metric definition name {self.name!r}: use 1-128 letters, digits and _.:/-")
        if not isinstance(self.regex, str) or not 0 < len(self.regex) <= MAX_PATTERN_CHARS:
            raise ValueError(f"metric definition {self.name!r}: the regex must be 1-{MAX_PATTERN_CHARS} characters")
        try:
            pattern = self.pattern
        except re2.error as exc:
            raise ValueError(
                f"metric definition {self.name!r}: invalid regex {self.regex!r} ({_reason(exc)}); it must be RE2 "
                "syntax: no backreferences or lookaround, which can take exponential time over a log"
            ) from exc
        if pattern.groups != 1:
            raise ValueError(
                f"metric definition {self.name!r}: the regex must have exactly one capturing group (the value), "
                f"{self.regex!r} has {pattern.groups}; use (?:...) for grouping that is not the value"
            )

    @cached_property
    def pattern(self) -> re2._Regexp:
        return compile_re2(self.regex)

    def as_dict(self) -> dict[str, str]:
        """JSON for the harvest document, in pcflow's own spelling (`parse_definitions` reads it back)."""
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
    if len(definitions) > MAX_DEFINITIONS:
        raise ValueError(f"at most {MAX_DEFINITIONS} metric definitions, got {len(definitions)}")
    names = [d.name for d in definitions]
    if len(set(names)) != len(names):
        raise ValueError(f"metric definition names must be unique, got {names}")
    return definitions


def _reason(exc: Exception) -> str:
    detail = exc.args[0] if exc.args else exc
    return detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
