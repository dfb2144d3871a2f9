"""The price table bundled with pcflow (pcflow/prices.json): one dated section per region, with FSx and
what a kept stack bills, and how a run's prices are laid over it.

It sits in the foundation layer, below the stages that price: the estimate of a run (`pcflow.pricing.cost`,
which adds the Price List API's and EC2's spot answers), the budget, and the janitor's cost of what it
keeps (`pcflow.aws.kept`). A region the table lacks is unpriced (`NoPrices`), never priced as another.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

DEFAULT_REGION = "us-east-1"


class NoPrices(LookupError):
    """The price table has no section for the region: its runs cannot be priced from it."""


@cache
def bundled_prices() -> dict[str, Any]:
    """The price table shipped with pcflow (prices.json), read once per process: the fallback when the Price
    List API does not answer."""
    return json.loads(resources.files("pcflow").joinpath("prices.json").read_text())


def price_table(
    overrides: Mapping[str, Any] | None = None,
    region: str = DEFAULT_REGION,
    *,
    listed: Mapping[str, float] | None = None,
    listed_on: str | None = None,
) -> dict[str, Any]:
    """The bundled prices of `region`, flat (`on_demand_per_hour`, `fsx_lustre_per_gib_month`, the dated
    `as_of`...), with the Price List API's on-demand prices `listed` (on the day `listed_on`) laid over
    them, then `overrides` (top-level keys; per-type maps merged one level). Raises `NoPrices` for a region
    the table lacks, unless the API or `overrides` price the compute nodes."""
    bundled = bundled_prices()
    regional = bundled["regions"].get(region)
    if regional is None and not listed and not (overrides or {}).get("on_demand_per_hour"):
        priced = ", ".join(sorted(bundled["regions"]))
        raise NoPrices(
            f"the price table (pcflow/prices.json, as of {bundled['as_of']}) has no prices for region "
            f"{region} (it has {priced}) and none came from the AWS Price List API; add the region's prices there"
        )
    common = {k: v for k, v in bundled.items() if k not in ("regions", "_about")}
    table = json.loads(json.dumps({**common, "region": region, **(regional or {})}))
    overrides = dict(overrides or {})
    if listed:
        table.setdefault("on_demand_per_hour", {}).update(listed)
        table["price_list"] = {
            "as_of": listed_on,
            "types": sorted(set(listed) - set(overrides.get("on_demand_per_hour", {}))),
        }
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(table.get(key), dict):
            table[key].update(value)
        else:
            table[key] = value
    return table


def fsx_per_hour(table: Mapping[str, Any], gib: float, deployment_type: str) -> float | None:
    """FSx for Lustre's price per hour for `gib` of `deployment_type`; None when the table lacks it."""
    per_month = table.get("fsx_lustre_per_gib_month", {}).get(deployment_type)
    if per_month is None:
        return None
    return gib * float(per_month) / float(table.get("hours_per_month", 730))
