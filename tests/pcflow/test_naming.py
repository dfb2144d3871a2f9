"""Run keys and resource names: stable across retries, distinct across runs, safe everywhere."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pcflow import naming
from pcflow.naming import Component

SAFE = re.compile(r"^[a-z][a-z0-9-]*[a-z0-9]$")
HOSTILE = ["$(rm -rf /)", "`id`", "a;b&&c", "line\nbreak", "quote'\"", "x" * 5000, "ünïcødé/..", "--flag", ""]


def test_run_key_is_readable_and_stable():
    key = naming.run_key("pretrain", "manual__2026-11-29T18:17:00.123456+00:00")
    assert key.startswith("pretrain-manual-20261129t181700-")
    assert key == naming.run_key("pretrain", "manual__2026-11-29T18:17:00.123456+00:00")


def test_run_key_distinguishes_runs_and_trials():
    keys = {naming.run_key("pretrain_sweep", "manual__2026-11-29T18:17:00+00:00", i) for i in [None, 0, 1, 2, 10]} | {
        naming.run_key("pretrain_sweep", "manual__2026-11-29T18:17:01+00:00")
    }
    assert len(keys) == 6
    assert naming.run_key("d", "r", -1) == naming.run_key("d", "r", None), "unmapped tasks have map_index -1"
    # The same readable prefix must not make different runs collide.
    assert naming.run_key("a-b", "c") != naming.run_key("a", "b-c")


@given(dag_id=st.text(min_size=1, max_size=300), run_id=st.text(min_size=1, max_size=300), idx=st.integers(-1, 10**6))
def test_run_key_is_safe_for_every_system(dag_id, run_id, idx):
    key = naming.run_key(dag_id, run_id, idx)
    assert SAFE.match(key), key  # S3 key segment, Slurm job name, AWS name, tag value, DNS label
    assert len(key) <= naming.RUN_KEY_MAX_LEN
    assert naming.AWS_TAG_VALUE_RE.match(key)


@pytest.mark.parametrize("hostile", HOSTILE[:-1])
def test_hostile_ids_give_inert_keys(hostile):
    assert SAFE.match(naming.run_key(hostile, hostile, 3))


def test_run_key_requires_ids():
    with pytest.raises(ValueError, match="dag_id and a run_id"):
        naming.run_key("", "r")


def test_run_key_from_context_ignores_try_number():
    class TI:
        dag_id, run_id, map_index = "pretrain", "scheduled__2026-11-29T00:00:00+00:00", -1

        def __init__(self, try_number):
            self.try_number = try_number

    assert naming.run_key_from_context({"ti": TI(1)}) == naming.run_key_from_context({"ti": TI(3)})


@pytest.mark.parametrize("name", ["a", "research", "team-a", "x1"])
def test_valid_stack_names(name):
    assert naming.validate_stack_name(name) == name


@pytest.mark.parametrize("name", [*HOSTILE, "Upper", "9lives", "ends-", "a" * 25, None])
def test_invalid_stack_names_are_refused_with_the_rule(name):
    with pytest.raises(ValueError, match="lower-case letters, digits and hyphens"):
        naming.validate_stack_name(name)


def test_resource_names_fit_and_stay_unique():
    assert naming.resource_name("research", Component.NETWORK, "vpc") == "pcflow-research-network-vpc"
    long_a = naming.resource_name("research", Component.CLUSTER, "x" * 80 + "a", max_len=40)
    long_b = naming.resource_name("research", Component.CLUSTER, "x" * 80 + "b", max_len=40)
    assert len(long_a) <= 40 and len(long_b) <= 40 and long_a != long_b


def test_standard_tags():
    now = dt.datetime(2026, 11, 29, 18, 0, tzinfo=dt.UTC)
    tags = naming.standard_tags(stack="research", component="cluster", run="k1", ttl=dt.timedelta(hours=6), now=now)
    assert tags == {
        "pcflow:stack": "research",
        "pcflow:component": "cluster",
        "pcflow:expires": "2026-11-30T00:00:00Z",
        "pcflow:run": "k1",
    }
    assert naming.parse_expires(tags["pcflow:expires"]) == now + dt.timedelta(hours=6)
    shared = naming.standard_tags(stack="research", component=Component.NETWORK)
    assert "pcflow:run" not in shared and shared["pcflow:expires"] == "never"
    assert naming.parse_expires("never") is None
    assert {"Key": "pcflow:stack", "Value": "research"} in naming.aws_tags(tags)


def test_standard_tags_refuse_bad_values():
    with pytest.raises(ValueError):
        naming.standard_tags(stack="research", component="no-such-component")
    with pytest.raises(ValueError, match="override"):
        naming.standard_tags(stack="research", component="ami", extra={"pcflow:stack": "other"})
    with pytest.raises(ValueError, match="characters"):
        naming.standard_tags(stack="research", component="ami", extra={"owner": "a;b"})


def test_tag_filters():
    assert naming.tag_filters("research", "network", "k1") == [
        {"Name": "tag:pcflow:stack", "Values": ["research"]},
        {"Name": "tag:pcflow:component", "Values": ["network"]},
        {"Name": "tag:pcflow:run", "Values": ["k1"]},
    ]


def test_a_resource_names_its_dag_run_when_aws_takes_the_values():
    from pcflow.naming import dag_run_tags, standard_tags

    run_id = "manual__2026-11-29T18:17:00.123456+00:00"
    tags = standard_tags(stack="research", component="network", run="k", dag_run=("pretrain", run_id))
    assert tags["pcflow:dag-id"] == "pretrain" and tags["pcflow:run-id"] == run_id
    assert "pcflow:dag-id" not in standard_tags(stack="research", component="network")
    # `~` is in Airflow's default run id pattern but not in what AWS takes: no DAG run named (expiry decides).
    assert dag_run_tags(("pretrain", "manual~1")) == {} and dag_run_tags(None) == {}
