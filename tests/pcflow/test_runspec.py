"""The run spec: profiles + the trigger form's fields, resolved and refused field by field."""

from __future__ import annotations

import pytest

from pcflow.pipeline import early_stopping_rule, overrides_from_params
from pcflow.runspec import RunSpecError, resolve_run_spec


def test_region_is_checked_against_botocores_list_as_the_cluster_spec_does():
    with pytest.raises(RunSpecError, match=r"region: .*unknown AWS region 'us-esat-1'.*us-east-1"):
        resolve_run_spec("local", {"region": "us-esat-1"})
    assert resolve_run_spec("local", {"region": "eu-west-1"}).region == "eu-west-1"


def test_early_stopping_rule_from_the_trigger_form_and_the_profile():
    assert early_stopping_rule(resolve_run_spec("local", {}).metrics) is None  # off unless asked for
    spec = resolve_run_spec("local", overrides_from_params({"early_stopping_patience": 3}))
    assert early_stopping_rule(spec.metrics) == {
        "objective": {"name": "fewshot_accuracy", "mode": "max"},
        "patience": 3,
        "min_delta": 0.0,
    }
    own = {"patience": 2, "metric": "epoch_loss", "mode": "min", "min_delta": 0.01}
    spec = resolve_run_spec("local", {"metrics": {"early_stopping": own}})
    assert early_stopping_rule(spec.metrics)["objective"] == {"name": "epoch_loss", "mode": "min"}
    with pytest.raises(RunSpecError, match=r"metrics\.early_stopping\.patience"):
        resolve_run_spec("local", {"metrics": {"early_stopping": {"patience": 0}}})


def test_sweep_trials_are_crossed_with_the_grid():
    from pcflow.pipeline import MAX_TRIALS, expand_trials

    trials = [{"seed": 0, "lr": 1.0}, {"seed": 1}]
    grid = {"lr": [0.001, 0.01], "temperature": [0.1]}
    assert expand_trials(trials, grid) == [
        {"seed": 0, "lr": 0.001, "temperature": 0.1},
        {"seed": 0, "lr": 0.01, "temperature": 0.1},
        {"seed": 1, "lr": 0.001, "temperature": 0.1},
        {"seed": 1, "lr": 0.01, "temperature": 0.1},
    ]
    assert expand_trials(trials, {}) == trials
    with pytest.raises(ValueError, match=r"grid\.lr: needs a non-empty list"):
        expand_trials([{}], {"lr": []})
    with pytest.raises(ValueError, match=rf"1 trials x 1024 grid points = 1024 trials, more than {MAX_TRIALS}"):
        expand_trials([{}], {f"p{i}": [0, 1] for i in range(10)})
