"""What the teardown loop acts on: a listed `Resource`, and the `Selector` that picks pcflow's own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pcflow.naming import TAG_COMPONENT, TAG_RUN, TAG_STACK, validate_stack_name


@dataclass(frozen=True)
class Resource:
    """One listed resource; `state` lets the loop see progress in async deletions (shutting-down...)."""

    kind: str
    id: str
    tags: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    state: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.id)

    def describe(self) -> str:
        """`<kind> <id> (<state>)`, as the report and the logs name a resource."""
        return f"{self.kind} {self.id}" + (f" ({self.state})" if self.state else "")


@dataclass(frozen=True)
class Selector:
    """Which pcflow resources a teardown or the janitor acts on.

    `stack=None` means every pcflow stack (the janitor); `predicate` is a last, client-side test on the
    tags (e.g. "expired"). EC2 listing is narrowed server-side with the equivalent filters.
    """

    stack: str | None = None
    run: str | None = None
    components: frozenset[str] | None = None
    predicate: Callable[[Mapping[str, str]], bool] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.stack is not None:
            validate_stack_name(self.stack)
        if self.components is not None:
            object.__setattr__(self, "components", frozenset(str(c) for c in self.components))

    def ec2_filters(self) -> list[dict[str, Any]]:
        """EC2's tag filters for the selector (all but `predicate`): the listing is narrowed on the server,
        `matches` decides."""
        if self.stack is not None:
            filters = [{"Name": f"tag:{TAG_STACK}", "Values": [self.stack]}]
        else:
            filters = [{"Name": "tag-key", "Values": [TAG_STACK]}]
        if self.run is not None:
            filters.append({"Name": f"tag:{TAG_RUN}", "Values": [self.run]})
        if self.components is not None:
            filters.append({"Name": f"tag:{TAG_COMPONENT}", "Values": sorted(self.components)})
        return filters

    def matches(self, tags: Mapping[str, str]) -> bool:
        """Whether a resource's tags are picked: pcflow's stack tag always required, then stack, run, components
        and the predicate."""
        if TAG_STACK not in tags or (self.stack is not None and tags[TAG_STACK] != self.stack):
            return False
        if self.run is not None and tags.get(TAG_RUN) != self.run:
            return False
        if self.components is not None and tags.get(TAG_COMPONENT) not in self.components:
            return False
        return self.predicate is None or bool(self.predicate(tags))
