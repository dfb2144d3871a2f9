"""On-demand prices from AWS's Price List API (`pricing:GetProducts`), for the run's region, cached per day.

The bundled table (pcflow/prices.json) is one dated snapshot of one region; the Price List API is
what AWS bills today in any region. Its endpoints are in us-east-1, ap-south-1 and eu-central-1 only,
whatever region it prices (`api.pricing.<region>.amazonaws.com`), so the client is made for us-east-1.
Each instance type is asked for with the filters that pick the one product a Linux, shared-tenancy
on-demand instance bills as; the answer's PriceList is a list of JSON strings, each a product document
whose `terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD` is the hourly price.

Answers are cached per day (UTC), per region and instance type: in process, and on disk under the Airflow
home, one file for the day (files of other days are removed when it is written, so the cache stays one
day's worth). Why a file and not an Airflow Variable: the first task runs on any worker and prices are
public and free to ask for, so a worker asking once a day per type costs nothing, while a Variable would
be a shared blob in the metadata database that concurrent first tasks race to rewrite. A refusal (no
permission, no endpoint) is not cached: the next run asks again, and this one uses the table.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pcflow.aws.clients import DEFAULT_AWS_CONN_ID

log = logging.getLogger(__name__)

#: Where the Price List API answers: one of its three endpoint regions (the AWS Price List API guide).
ENDPOINT_REGION = "us-east-1"
#: The product attributes that pick an instance type's on-demand Linux price, besides type and region.
PRODUCT = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}
#: A price is an estimate with a fallback: a few seconds, not botocore's minute of retries, when AWS is away.
CLIENT_CONFIG = {"connect_timeout": 5, "read_timeout": 20, "retries": {"mode": "standard", "total_max_attempts": 3}}


def pricing_client(aws_conn_id: str | None = DEFAULT_AWS_CONN_ID, verify: bool | str | None = None) -> Any:
    """A Price List API client on the connection (its endpoint and credentials), at the API's endpoint region."""
    from pcflow.aws.clients import aws_client

    return aws_client(
        "pricing", aws_conn_id=aws_conn_id, region_name=ENDPOINT_REGION, verify=verify, botocore_config=CLIENT_CONFIG
    )


def product_filters(region: str, instance_type: str) -> list[dict[str, str]]:
    """The GetProducts filters that pick the one product a Linux, shared-tenancy on-demand instance of this type
    bills as."""
    terms = {"instanceType": instance_type, "regionCode": region, **PRODUCT}
    return [{"Type": "TERM_MATCH", "Field": name, "Value": value} for name, value in terms.items()]


def hourly_price(document: str | Mapping[str, Any]) -> float | None:
    """The on-demand USD price per hour of one product document; None when it has none above zero."""
    product = json.loads(document) if isinstance(document, str) else document
    prices = [
        float(dimension["pricePerUnit"]["USD"])
        for term in product.get("terms", {}).get("OnDemand", {}).values()
        for dimension in term.get("priceDimensions", {}).values()
        if dimension.get("unit") == "Hrs" and "USD" in dimension.get("pricePerUnit", {})
    ]
    prices = [p for p in prices if p > 0]
    return max(prices) if prices else None


def ask(pricing: Any, region: str, instance_type: str) -> float | None:
    """The type's on-demand price in the region, from GetProducts; None when AWS lists no such product.
    Several matching products (AWS adds attributes over time) are priced at the highest: a maximum never
    under-counts. Raises botocore's errors (a refusal, no endpoint)."""
    pages = pricing.get_paginator("get_products").paginate(
        ServiceCode="AmazonEC2",
        Filters=product_filters(region, instance_type),
        FormatVersion="aws_v1",
        PaginationConfig={"MaxItems": 100},
    )
    prices = [price for page in pages for doc in page.get("PriceList", []) if (price := hourly_price(doc)) is not None]
    return round(max(prices), 6) if prices else None


def default_directory() -> Path:
    """Where the day's answers are cached on disk: under the Airflow home, which every worker has."""
    return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "pcflow" / "price-list"


@dataclass
class PriceCache:
    """One day's Price List answers (region -> instance type -> price or None), in process and on disk."""

    directory: Path = field(default_factory=default_directory)
    days: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)

    def day(self, day: str) -> dict[str, dict[str, float | None]]:
        """The day's answers (from memory, else its file); asking for a new day drops the old one from memory."""
        if day not in self.days:
            self.days = {day: self._read(day)}  # only today's stays in process too
        return self.days[day]

    def _read(self, day: str) -> dict[str, dict[str, float | None]]:
        try:
            return json.loads((self.directory / f"{day}.json").read_text())
        except (OSError, ValueError):  # none yet, or a file another worker left half-written
            return {}

    def store(self, day: str, region: str, answers: Mapping[str, float | None]) -> None:
        """Add the answers to the day's file (written whole, then renamed: a reader never sees half of
        it); other days' files go. A worker losing a race to another loses nothing but a cached answer."""
        known = self.day(day)
        known.setdefault(region, {}).update(answers)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.directory, suffix=".tmp", delete=False) as out:
                json.dump({**self._read(day), **known}, out)
            os.replace(out.name, self.directory / f"{day}.json")
            for old in self.directory.glob("*.json"):
                if old.stem != day:
                    old.unlink(missing_ok=True)
        except OSError as exc:  # a read-only home: the in-process cache still answers
            log.warning("Price List answers not cached on disk in %s: %s", self.directory, exc)


_CACHE: PriceCache | None = None


def default_cache() -> PriceCache:
    """The process's one cache, made when first asked for (no I/O at import)."""
    global _CACHE  # noqa: PLW0603 (one cache per process, made when first needed: no I/O at import)
    if _CACHE is None:
        _CACHE = PriceCache()
    return _CACHE


@dataclass(frozen=True)
class Listed:
    """What the Price List API said of each type asked for (None: no such product), and of which day."""

    day: str
    prices: dict[str, float | None]


def on_demand(
    pricing: Any,
    region: str,
    instance_types: Iterable[str],
    *,
    today: dt.date | None = None,
    cache: PriceCache | None = None,
) -> Listed:
    """The types' on-demand prices in `region` as the Price List API lists them today, cached for the day.
    Types it was not asked about (the API refused or is unreachable) are left out: the table prices them."""
    from botocore.exceptions import (  # here: DAG files import it (through pcflow.metrics.operators)
        BotoCoreError,
        ClientError,
    )

    day = (today or dt.datetime.now(dt.UTC).date()).isoformat()
    cache = cache or default_cache()
    known = cache.day(day).get(region, {})
    wanted = [t for t in dict.fromkeys(instance_types) if t and t not in known]
    answers: dict[str, float | None] = {}
    try:
        for instance_type in wanted:
            answers[instance_type] = ask(pricing, region, instance_type)
    except (ClientError, BotoCoreError) as exc:
        log.warning("No answer from the AWS Price List API (%s); pricing from the table instead", exc)
    if answers:
        cache.store(day, region, answers)
    found = {**known, **answers}
    return Listed(day, {t: found[t] for t in dict.fromkeys(instance_types) if t in found})
