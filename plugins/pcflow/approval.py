"""A person approves a costly run before anything is created: the standard provider's human-in-the-loop
approval (Airflow's "Required actions"), between the first task and the first stage that creates.

The first task decides (`cost.approval.needed`: the run's maximum is above its profile's
`budget.approval_above_usd`); this task only acts on it. Below the threshold it is skipped and the run
goes on (the stages after it run when nothing before them failed). Above, it waits for Approve or
Reject; Reject skips every stage after it, so nothing is created; no answer within
`budget.approval_timeout_hours` fails it, with the same effect.

The approver is another person: the profile's `budget.approvers` minus whoever triggered the run become
the request's `assigned_users` (Airflow lets only them answer), and an approval by the person who
triggered the run fails it whatever the profile says. The answer and who gave it are the task's XCom.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk.exceptions import AirflowSkipException

from pcflow.errors import PcflowInputError, profile_setting, refused

#: The trigger rule of the stages right after the approval: run when it succeeded or was skipped.
AFTER_APPROVAL = "none_failed_min_one_success"


class CostApprovalOperator(ApprovalOperator):
    """Wait for a person's approval of a run whose maximum cost is above its profile's threshold.

    :param cost: the `cost` section the first task returned (`pcflow.budget.plan_cost`).
    """

    template_fields: Sequence[str] = (*ApprovalOperator.template_fields, "cost")
    ui_color = "#fde68a"

    def __init__(self, *, cost: Mapping[str, Any] | Any, **kwargs: Any) -> None:
        super().__init__(subject="Approve the cost of this run", **kwargs)
        self.cost = cost

    def execute(self, context: Any) -> Any:
        from pcflow.budget import usd

        approval = self.cost["approval"]
        if not approval["needed"]:
            threshold = usd(approval["above_usd"]) if approval["above_usd"] is not None else "none set"
            raise AirflowSkipException(
                f"No approval needed: {self.cost['summary']} (the profile asks for approval above {threshold})"
            )
        self.assigned_users = approvers_for(approval.get("approvers") or [], triggered_by(context)) or None
        self.subject = f"Approve up to {usd(self.cost['maximum_usd'])} for {context['dag_run'].run_id}"
        self.body = approval_body(self.cost)
        self.response_timeout = dt.timedelta(hours=approval["timeout_hours"])
        self.log.info("Waiting for approval in the Airflow UI (Required actions): %s", self.cost["summary"])
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """Record who answered; an approval by the person who triggered the run does not count (Airflow lets
        anyone with the right role respond when the profile names no approvers), and fails the run."""
        responder = (event or {}).get("responded_by_user") or {}
        trigger_user = triggered_by(context)
        approved = (event or {}).get("chosen_options") == [self.APPROVE]
        if approved and trigger_user is not None and responder.get("name") == trigger_user:
            problem = (
                f"{trigger_user!r} approved the run they triggered: another person must approve a run above "
                f"{self.cost['approval']['above_usd']:g} USD; nothing was created"
            )
            raise refused("budget.approvers", problem, profile_setting(), SelfApproval)
        result = super().execute_complete(context, event)
        self.log.info("%s by %s (id %s)", event["chosen_options"][0], responder.get("name"), responder.get("id"))
        return result


class SelfApproval(PcflowInputError):
    """The person who triggered a costly run approved it: not an approval, and not retried."""


def triggered_by(context: Any) -> str | None:
    """The user who triggered the run (None for scheduled runs and backfills started by the scheduler)."""
    return getattr(context.get("dag_run"), "triggering_user_name", None) or None


def approvers_for(approvers: list[Mapping[str, str]], trigger_user: str | None) -> list[dict[str, str]]:
    """The profile's approvers who may answer this run: all but the person who triggered it. When that
    leaves nobody, the run cannot be approved: refused now rather than waiting for the timeout."""
    others = [dict(a) for a in approvers if trigger_user is None or trigger_user not in (a["name"], a["id"])]
    if approvers and not others:
        problem = (
            f"the profile's only approver is {trigger_user!r}, who triggered this run: another person must approve "
            "it; nothing was created"
        )
        raise refused("budget.approvers", problem, profile_setting(), SelfApproval)
    return others


def approval_body(cost: Mapping[str, Any]) -> str:
    """What the approver reads (Markdown): the figures, where they come from, what each answer does."""
    from pcflow.budget import breakdown, usd

    budget = usd(cost["budget_usd"]) if cost["budget_usd"] is not None else "none"
    maximum = usd(cost["maximum_usd"]) if cost["maximum_usd"] is not None else "unknown (no time limit)"
    return (
        f"**This run may cost up to {maximum}**, above the {usd(cost['approval']['above_usd'])} its profile "
        "asks a person to approve.\n\n"
        f"- budget: {budget} (the train task cancels the job when the cost so far reaches it)\n"
        f"- how: {breakdown(cost)}\n\n"
        "**Approve**: the run creates its resources and trains. **Reject**: every stage is skipped, nothing is "
        f"created. No answer within {cost['approval']['timeout_hours']:g} h fails the run, nothing created."
    )
