"""The one teardown operator: a stack's (or one run's) tagged resources through the convergence loop.

The arguments every teardown shares (what to list, the handler sets, dry run, the loop's pace) are
declared here once; the janitor and the network-only delete specialise what they select
(`selector`) and when they only report (`is_dry_run`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pcflow.aws.base import PcflowAwsOperator, aws_template_fields
from pcflow.aws.teardown.engine import teardown
from pcflow.aws.teardown.model import Selector
from pcflow.aws.teardown.registry import DEFAULT_HANDLER_SETS
from pcflow.aws.teardown.report import TeardownReport
from pcflow.errors import refused, task_author


class TeardownOperator(PcflowAwsOperator):
    """Convergent teardown of a stack's (or one run's) tagged resources; fails with a report if any are left.

    Wire it as an Airflow teardown task so it runs when training fails. `handler_sets` names registered
    handler sets (`ec2`, `fsx`, `images`, or one another stage registered: the DAG that asks for it
    imports the module that registers it); AMIs are kept unless the teardown policy adds `images`.
    Returns `TeardownReport.to_xcom()`.
    """

    template_fields: Sequence[str] = aws_template_fields("stack", "run", "components", "dry_run")
    ui_color = "#f4a6a6"
    #: Whether an unset `stack` means every pcflow stack (the janitor) rather than a mistake.
    every_stack: ClassVar[bool] = False

    def __init__(
        self,
        *,
        stack: str | None,
        run: str | None = None,
        components: Sequence[str] | None = None,
        handler_sets: Sequence[str] = DEFAULT_HANDLER_SETS,
        dry_run: bool | None = False,
        pass_delay: float = 5.0,
        max_passes: int = 30,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.stack = stack
        self.run = run
        self.components = components
        self.handler_sets = tuple(handler_sets)
        self.dry_run = dry_run
        self.pass_delay = pass_delay
        self.max_passes = max_passes

    def selector(self, context: Any) -> Selector:
        """What this task deletes: the stack's resources, narrowed to the run and components if given."""
        if not self.stack and not self.every_stack:
            problem = f"{self.task_id}: a teardown needs the stack it deletes (got {self.stack!r})"
            raise refused("stack", problem, task_author(self.task_id))
        return Selector(
            stack=self.stack or None,
            run=self.run or None,
            components=frozenset(self.components) if self.components else None,
        )

    def is_dry_run(self, context: Any) -> bool:
        """Whether this try only reports: the operator's `dry_run` (the janitor decides by how the run was started)."""
        return bool(self.dry_run)

    def converge(self, selector: Selector, *, dry_run: bool) -> TeardownReport:
        """The loop over this task's handler sets, on its connection, at its pace, logged in its log."""
        return teardown(
            self.client,
            selector,
            handler_sets=self.handler_sets,
            dry_run=dry_run,
            pass_delay=self.pass_delay,
            max_passes=self.max_passes,
            logger=self.log,
        )

    def execute(self, context: Any) -> dict[str, Any]:
        return self.converge(self.selector(context), dry_run=self.is_dry_run(context)).to_xcom()
