"""What a handler is (lists and deletes one kind of resource), and the base of the kinds listed by tag.

Most kinds are one describe call whose items carry tags: `ListByTagHandler` pages through that call,
reads the tags and keeps what the selector picks, so a kind only names its call and fields and says
which items are still live."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from pcflow.aws.tags import tag_dict
from pcflow.aws.teardown.model import Resource, Selector


class ResourceHandler(Protocol):
    """Lists and deletes one kind of resource. Lower `order` is deleted earlier in each pass."""

    kind: str
    order: int

    def list(self, selector: Selector) -> list[Resource]:
        """What the selector picks of this kind now; called again every pass, so a deletion is confirmed by listing."""

    def prepare(self, resources: Sequence[Resource]) -> None:
        """A step over the whole batch before any deletion of this kind (e.g. revoking rules between groups)."""

    def delete(self, resource: Resource) -> None:
        """Start deleting one resource; an error means "not yet" to the loop, which lists again to see it gone."""

    def holds(self, resources: Sequence[Resource]) -> dict[tuple[str, str], str]:
        """The listed resources that must not go yet, by key, with why: they keep their owner's other resources too."""


class Handler:
    """Convenience base: `prepare` does nothing unless a kind needs a whole-batch step first; `holds`
    names listed resources that must not go yet (none, unless a kind can hold data not saved elsewhere)."""

    kind: ClassVar[str] = ""
    order: ClassVar[int] = 0

    def prepare(self, resources: Sequence[Resource]) -> None:
        """Nothing: most kinds need no whole-batch step before their deletions."""
        return None

    def holds(self, resources: Sequence[Resource]) -> dict[tuple[str, str], str]:
        """Nothing is held: most kinds keep no data that exists nowhere else."""
        return {}


def paginate(client: Any, operation: str, result_key: str, **kwargs: Any) -> list[dict[str, Any]]:
    """Every item of a describe call, through its paginator when the service has one."""
    if client.can_paginate(operation):
        items: list[dict[str, Any]] = []
        for page in client.get_paginator(operation).paginate(**kwargs):
            items.extend(page.get(result_key, []))
        return items
    return list(getattr(client, operation)(**kwargs).get(result_key, []))


class ListByTagHandler(Handler):
    """A kind listed by one describe call whose items carry pcflow's tags.

    A subclass names the call (`operation`, `result_key`) and the item's fields (`id_key`, `tags_key`,
    `state_key`); it overrides `arguments` when the call is narrowed differently than by EC2's tag
    filters, and `selects` when some listed items are already gone or not its own (a default group)."""

    operation: ClassVar[str] = ""
    result_key: ClassVar[str] = ""
    id_key: ClassVar[str] = ""
    tags_key: ClassVar[str] = "Tags"
    state_key: ClassVar[str] = "State"

    def __init__(self, client: Any):
        self.client = client

    def list(self, selector: Selector) -> list[Resource]:
        """The call's items that the selector picks, as Resources (tags read from `tags_key`, state for the loop)."""
        resources = []
        for item in self.describe(selector):
            tags = tag_dict(item.get(self.tags_key))
            if self.selects(selector, item, tags):
                resources.append(Resource(self.kind, item[self.id_key], tags, self.state(item), item))
        return resources

    def describe(self, selector: Selector) -> list[dict[str, Any]]:
        """The call's items (a superset: `selects` decides)."""
        return self.call(**self.arguments(selector))

    def call(self, **arguments: Any) -> list[dict[str, Any]]:
        """Every item the describe call returns for these arguments, page after page."""
        return paginate(self.client, self.operation, self.result_key, **arguments)

    def arguments(self, selector: Selector) -> dict[str, Any]:
        """The call's arguments: EC2's tag filters, so the listing is narrowed on the server."""
        return {"Filters": selector.ec2_filters()}

    def selects(self, selector: Selector, item: dict[str, Any], tags: dict[str, str]) -> bool:
        """Whether a listed item is one to delete: by default, whether its tags match the selector."""
        return selector.matches(tags)

    def state(self, item: dict[str, Any]) -> str:
        """What the loop compares between passes to see an asynchronous deletion progress."""
        return str(item.get(self.state_key, ""))
