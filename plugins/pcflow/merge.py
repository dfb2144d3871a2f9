"""Settings laid over settings: a profile under a run's conf, a rendered cluster config under `extra_config`.

Mappings merge key by key. A list replaces the one below it, except:
- the cluster's set-like lists (`MERGED_LISTS`: the validators a dry run suppresses, the directories every
  container sees and the image layouts it may be read from) add to the profile's: an overlay profile or a
  conf lists what it adds, each entry once, the profile's first; an overlay cannot take one away;
- with `by_name` (a ParallelCluster config under `extra_config`), lists of mappings that each have a `Name`
  (SlurmQueues, ComputeResources, SharedStorage) merge item by item by name, new names appended, so an
  extra setting of one queue leaves the queues pcflow renders in place.
Ordered lists (a capacity fallback order, subnets, instance types) always replace: their order is the decision.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

#: Dotted paths of the lists that add to the profile's rather than replace them.
MERGED_LISTS = frozenset({"cluster.suppress_validators", "cluster.containers.mounts", "cluster.containers.layouts"})


def deep_merge(
    base: Mapping[str, Any], override: Mapping[str, Any], *, by_name: bool = False, path: str = ""
) -> dict[str, Any]:
    """`override` over `base`: mappings key by key, lists as the module docstring says, anything else replaced."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        where, below = f"{path}{key}", merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            merged[key] = deep_merge(below, value, by_name=by_name, path=f"{where}.")
        elif isinstance(value, list) and isinstance(below, list) and where in MERGED_LISTS:
            merged[key] = [*below, *(copy.deepcopy(v) for v in value if v not in below)]
        elif isinstance(value, list) and isinstance(below, list) and by_name and named(below) and named(value):
            merged[key] = merge_by_name(below, value, where)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def named(items: list[Any]) -> bool:
    """Every item a mapping with a `Name` (ParallelCluster's queues, compute resources, storage)."""
    return bool(items) and all(isinstance(item, Mapping) and "Name" in item for item in items)


def merge_by_name(below: list[Mapping[str, Any]], over: list[Mapping[str, Any]], path: str) -> list[dict[str, Any]]:
    """Items of the same `Name` merged (deeply, by name again below), new names appended in their order."""
    merged = [copy.deepcopy(dict(item)) for item in below]
    index = {item["Name"]: i for i, item in enumerate(merged)}
    for item in over:
        if item["Name"] in index:
            at = index[item["Name"]]
            merged[at] = deep_merge(merged[at], item, by_name=True, path=f"{path}[{item['Name']}].")
        else:
            merged.append(copy.deepcopy(dict(item)))
    return merged
