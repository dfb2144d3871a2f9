"""Names and values checked by a pattern are checked whole: Python's `$` also matches before a trailing
newline, so `re.match(r"^...$")` passed `"12:00:00\n"` as a time limit (and a stack, partition, prefix,
payload or tag value with a newline after it). Every such check now uses `fullmatch` (issue 24, low)."""

from __future__ import annotations

import pytest

from pcflow.cluster.spec import validate_cluster_name
from pcflow.dataset.partition import validate_partition
from pcflow.naming import validate_stack_name
from pcflow.paths import PayloadError, payload_source
from pcflow.patterns import time_limit_seconds, validate_prefix
from pcflow.profiles import RunSpecError

pytestmark = pytest.mark.security


@pytest.mark.parametrize(
    ("check", "good"),
    [
        (validate_stack_name, "research"),
        (validate_partition, "2026-11-29"),
        (validate_prefix, "datasets/imagenet"),
        (validate_cluster_name, "pcflow-research"),
        (payload_source, "simclr"),
    ],
)
def test_a_trailing_newline_is_refused(check, good):
    check(good)
    with pytest.raises((ValueError, RunSpecError, PayloadError)):
        check(good + "\n")


def test_a_time_limit_with_a_trailing_newline_is_not_one():
    assert time_limit_seconds("12:00:00") == 12 * 3600
    assert time_limit_seconds("12:00:00\n") is None
