"""The one teardown operator and its specialisations, offline: the arguments every teardown shares are
declared once, each operator selects what it owns, and a stack teardown without a stack refuses instead
of selecting every stack. Under a second."""

from __future__ import annotations

import pytest

from pcflow.aws.janitor import JanitorOperator
from pcflow.aws.network import DeleteNetworkOperator
from pcflow.aws.teardown import Selector, TeardownOperator
from pcflow.naming import run_key


class _TI:
    dag_id, run_id, map_index = "pretrain", "manual__2026-11-29T18:00:00+00:00", -1


SHARED = {"handler_sets": ("pcluster", "ec2"), "pass_delay": 0.5, "max_passes": 3, "region_name": "eu-west-1"}


@pytest.mark.parametrize("operator", [TeardownOperator, JanitorOperator, DeleteNetworkOperator])
def test_the_shared_arguments_mean_the_same_on_every_teardown(operator):
    task = operator(task_id="t", stack="demo", **SHARED)
    assert (task.handler_sets, task.pass_delay, task.max_passes, task.region_name) == tuple(SHARED.values())
    assert {"stack", "run", "components", "dry_run", "aws_conn_id", "region_name"} <= set(task.template_fields)


def test_a_stack_teardown_needs_its_stack_and_narrows_to_run_and_components():
    for unset in (None, ""):
        with pytest.raises(ValueError, match="needs the stack"):
            TeardownOperator(task_id="teardown", stack=unset).selector({})
    task = TeardownOperator(task_id="teardown", stack="demo", run="r1", components=["cluster"])
    assert task.selector({}) == Selector(stack="demo", run="r1", components=frozenset({"cluster"}))


def test_the_janitor_spans_every_stack_unless_told_and_reports_when_triggered_by_hand():
    class DagRun:
        run_type = "manual"

    janitor = JanitorOperator(task_id="reap")
    assert janitor.selector({}) == Selector() and janitor.is_dry_run({"dag_run": DagRun()}) is True
    DagRun.run_type = "scheduled"
    assert janitor.is_dry_run({"dag_run": DagRun()}) is False
    assert JanitorOperator(task_id="reap", stack="demo", dry_run=True).selector({}) == Selector(stack="demo")


def test_the_network_delete_selects_the_network_of_this_run():
    context = {"ti": _TI()}
    whole = DeleteNetworkOperator(task_id="delete", stack="demo").selector(context)
    assert whole == Selector(stack="demo", components=frozenset({"network"}))
    scoped = DeleteNetworkOperator(task_id="delete", stack="demo", run_scoped=True).selector(context)
    assert scoped == Selector(stack="demo", run=run_key(_TI.dag_id, _TI.run_id, -1), components=frozenset({"network"}))
