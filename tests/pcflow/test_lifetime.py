"""The longest a run may take, from its settings, and the expiry its resources are stamped with."""

from __future__ import annotations

import pytest

from pcflow.lifetime import expiry_hours, longest_run
from pcflow.runspec import resolve_run_spec


def settings(profile: str, **training):
    """The profile's run spec with `training` laid over it."""
    return resolve_run_spec(profile, {"training": training} if training else None)


def test_aws_gpu_runs_outlive_its_ttl_and_are_stamped_to_outlast_them():
    """12 h limit plus 1 h pending, 6 attempts (5 requeues), the cluster's 40 + 20 minutes: 79 h, longer
    than the profile's 48 h TTL."""
    run = settings("aws-gpu")
    assert longest_run(run).total_seconds() == pytest.approx(79 * 3600)
    assert expiry_hours(run) == {"longest_run_hours": 79.0, "run_hours": 79.0, "kept_hours": 48 + 79.0}


def test_a_sweeps_trials_count_one_after_another():
    one, three = longest_run(settings("aws-gpu")), longest_run(settings("aws-gpu"), trials=3)
    assert (three - one).total_seconds() == pytest.approx(2 * 78 * 3600)


def test_a_run_shorter_than_its_ttl_keeps_the_ttl_and_one_without_a_time_limit_has_no_bound():
    local = settings("local", max_restarts=0, pending_timeout_s=None)
    assert expiry_hours(local)["run_hours"] == local.ttl_hours
    unbounded = settings("aws-gpu", time_limit=None)
    assert longest_run(unbounded) is None
    assert expiry_hours(unbounded) == {"longest_run_hours": None, "run_hours": 48.0, "kept_hours": 48.0}
