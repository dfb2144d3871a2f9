"""The run priced from AWS's Price List API for its region (pcflow.pricing.price_list), cached per day, with
the bundled table as the fallback and every estimate saying which source it used (`price-list`,
`spot-history`, `table`). The region difference is the local stack's answers (its Price List stand-in,
include/local/price_list_standin.py, serving price_list_sample.json); a refusal, an unreachable endpoint
and the cache are offline: botocore's Stubber answers with the sample's documents or AWS's refusal."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import boto3
import pytest
from airflow.sdk.exceptions import AirflowFailException
from botocore.stub import Stubber
from run_factories import make_planned_run

from pcflow.budget import BudgetRefused, plan_cost, refuse_over_budget
from pcflow.pricing import price_list

SAMPLE = Path(__file__).resolve().parents[2] / "include" / "local" / "price_list_sample.json"
DAY = dt.date(2026, 12, 2)
NOW = dt.datetime(2026, 12, 2, 12, tzinfo=dt.UTC)
#: c5.xlarge on demand, Linux, as AWS publishes it (the sample; us-east-1 is also pcflow's table).
C5_XLARGE = {"us-east-1": 0.17, "eu-west-1": 0.192}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> price_list.PriceCache:
    """The process's Price List cache, empty, on a directory of the test's own."""
    fresh = price_list.PriceCache(tmp_path / "price-list")
    monkeypatch.setattr(price_list, "_CACHE", fresh)
    return fresh


def local_run(**settings):
    """The local profile's run as the first task plans it (its 2 x c5.xlarge, static cluster)."""
    return make_planned_run("local", **settings)


def sample_document(region: str, instance_type: str) -> str:
    """The sample's Linux product document of the type, as GetProducts returns it: a JSON string."""
    for product in json.loads(SAMPLE.read_text())["PriceList"]:
        attributes = product["product"]["attributes"]
        if (attributes["regionCode"], attributes["instanceType"], attributes["operatingSystem"]) == (
            region,
            instance_type,
            "Linux",
        ):
            return json.dumps(product)
    raise LookupError((region, instance_type))


def offline_pricing() -> object:
    return boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")


def count_calls(client) -> list[str]:
    """GetProducts requests the client makes (botocore's before-parameter-build event, which Stubber's
    answers do not skip)."""
    calls: list[dict] = []
    client.meta.events.register("before-parameter-build.pricing.GetProducts", lambda params, **kw: calls.append(params))
    return calls


@pytest.mark.stack
@pytest.mark.usefixtures("local_stack", "cache")
def test_the_first_task_prices_each_region_from_the_price_list_api():
    """eu-west-1 and us-east-1 priced from the Price List API's answers (the stand-in's): the same type, two
    prices; eu-west-1, which pcflow's table lacks, is priced all the same, and what the API does not list
    there is unknown, never another region's price."""
    from pcflow.checks import check_cost

    costs = {region: check_cost(local_run(region=region)).cost for region in C5_XLARGE}
    for region, cost in costs.items():
        assert cost["compute_per_node_hour"] == C5_XLARGE[region] and cost["price_sources"] == ["price-list"]
        assert cost["maximum_usd"] == pytest.approx(2 * C5_XLARGE[region] * 0.5 * 4)  # 2 nodes, 30 min, 4 attempts
        day = cost["price_list_as_of"]
        assert cost["summary"].endswith(f"prices: price-list (AWS Price List API, {region}, {day})")
    assert costs["eu-west-1"]["maximum_usd"] > costs["us-east-1"]["maximum_usd"]

    with pytest.raises(AirflowFailException) as refused:  # the sample lists no g5.12xlarge in eu-west-1
        check_cost(local_run(region="eu-west-1", instance_type="g5.12xlarge"))
    assert "no prices for region eu-west-1 (it has us-east-1) and none came from the AWS Price List API" in str(
        refused.value
    )
    with pytest.raises(AirflowFailException) as refused:  # listed nowhere
        check_cost(local_run(instance_type="m7i.xlarge"))
    assert "no price for m7i.xlarge (not in the AWS Price List API nor the us-east-1 price table)" in str(refused.value)


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1"])
def test_a_refused_price_list_falls_back_to_the_table_and_says_so(cache, region):
    """A role without pricing:GetProducts: the table prices what it has, labelled `table`, and the refusal
    is not cached (the next run asks again). The table has no eu-west-1: that run cannot be priced."""
    pricing = offline_pricing()
    with Stubber(pricing) as stub:
        stub.add_client_error("get_products", "AccessDeniedException", "not authorized: pricing:GetProducts", 400)
        cost = plan_cost(local_run(region=region), pricing=pricing, now=NOW).cost
        stub.assert_no_pending_responses()
    assert not list(cache.directory.glob("*.json")) and cache.day(DAY.isoformat()) == {}
    if region == "us-east-1":
        assert cost["compute_per_node_hour"] == 0.17 and cost["price_sources"] == ["table"]
        assert cost["summary"].endswith("prices: table (us-east-1 price table as of 2026-11-01)")
        return
    assert cost["maximum_usd"] is None and cost["price_sources"] == []
    with pytest.raises(BudgetRefused, match=r"no prices for region eu-west-1.*none came from the AWS Price List API"):
        refuse_over_budget(cost, local_run(region=region))


def test_an_unreachable_price_list_endpoint_falls_back_to_the_table(cache, monkeypatch):
    """No endpoint answers (a closed port stands in for a network without a route to api.pricing): the
    shipped client (`pricing_client`: a few attempts, short timeouts) gives up and the table prices."""
    connection = {"conn_type": "aws", "login": "x", "password": "x", "extra": {"endpoint_url": "https://127.0.0.1:9"}}
    monkeypatch.setenv("AIRFLOW_CONN_PRICING_NOWHERE", json.dumps(connection))
    pricing = price_list.pricing_client("pricing_nowhere")
    calls = count_calls(pricing)
    over = local_run(instance_type="g5.12xlarge", training={"nodes": 3})
    cost = plan_cost(over, pricing=pricing, now=NOW).cost
    assert len(calls) == 1 and cost["price_sources"] == ["table"] and cost["compute_per_node_hour"] == 5.672
    assert pricing.meta.config.retries == {"mode": "standard", "total_max_attempts": 3}
    with pytest.raises(BudgetRefused) as refused:  # the refusal message says where its prices came from
        refuse_over_budget(cost, over)
    assert "prices: table (us-east-1 price table as of 2026-11-01)" in str(refused.value)


def test_the_days_answers_are_cached_in_process_and_on_disk(cache):
    """A second run of the day asks nothing (in this process, or another on the same worker, from the day's
    file); the next day asks again and the previous day's file goes."""
    pricing = offline_pricing()
    calls = count_calls(pricing)
    run = local_run(region="eu-west-1")
    with Stubber(pricing) as stub:
        for _day in (DAY, DAY + dt.timedelta(days=1)):
            answer = {"FormatVersion": "aws_v1", "PriceList": [sample_document("eu-west-1", "c5.xlarge")]}
            expected = {
                "ServiceCode": "AmazonEC2",
                "Filters": price_list.product_filters("eu-west-1", "c5.xlarge"),
                "FormatVersion": "aws_v1",
            }
            stub.add_response("get_products", answer, expected)
        first = plan_cost(run, pricing=pricing, now=NOW).cost
        again = plan_cost(run, pricing=pricing, now=NOW).cost
        assert len(calls) == 1 and first["compute_per_node_hour"] == again["compute_per_node_hour"] == 0.192
        other_process = price_list.PriceCache(cache.directory)
        listed = price_list.on_demand(pricing, "eu-west-1", ["c5.xlarge"], today=DAY, cache=other_process)
        assert len(calls) == 1 and listed.prices == {"c5.xlarge": 0.192}
        assert [p.name for p in cache.directory.iterdir()] == ["2026-12-02.json"]
        plan_cost(run, pricing=pricing, now=NOW + dt.timedelta(days=1))
        stub.assert_no_pending_responses()
    assert len(calls) == 2 and [p.name for p in cache.directory.iterdir()] == ["2026-12-03.json"]


def test_a_product_document_is_priced_from_its_on_demand_terms():
    assert price_list.hourly_price(sample_document("eu-west-1", "t3.micro")) == 0.0114
    assert price_list.hourly_price({"terms": {"OnDemand": {}}}) is None  # listed, but nothing on demand
