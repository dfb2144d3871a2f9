"""What a teardown (or a dry run) did, and the error raised when it left something behind."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pcflow.aws.teardown.model import Resource
from pcflow.errors import ServiceFailed


@dataclass
class TeardownReport:
    """What a teardown (or a dry run) did; `to_xcom` is small and free of secrets."""

    dry_run: bool
    passes: int = 0
    deleted: list[Resource] = field(default_factory=list)
    would_delete: list[Resource] = field(default_factory=list)
    remaining: list[Resource] = field(default_factory=list)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)
    #: Resources kept because something they go with must not be deleted yet, and why.
    held: list[Resource] = field(default_factory=list)
    hold_reasons: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.dry_run or not (self.remaining or self.held)

    def summary(self) -> str:
        """The report for a task log: what was (or would be) deleted, what is left with its last error, what is
        kept and why."""
        if self.dry_run:
            lines = [f"dry run: would delete {len(self.would_delete)} resource(s)"]
            lines += [f"  {r.describe()}" for r in self.would_delete]
        else:
            lines = [f"deleted {len(self.deleted)} resource(s) in {self.passes} pass(es)"]
        if self.remaining:
            lines.append(f"{len(self.remaining)} resource(s) could not be deleted:")
            lines += [f"  {r.describe()}: {self.errors.get(r.key, 'still listed')}" for r in self.remaining]
        if self.held:
            lines.append(f"{len(self.held)} resource(s) kept on purpose, with what they belong to:")
            lines += [f"  {reason}" for reason in self.hold_reasons]
            lines += [f"  kept: {r.describe()}" for r in self.held]
        return "\n".join(lines)

    def to_xcom(self) -> dict[str, Any]:
        """The report as small JSON: kinds and ids (no tags or details), errors and hold reasons."""

        def ids(resources: Iterable[Resource]) -> list[dict[str, str]]:
            return [{"kind": r.kind, "id": r.id} for r in resources]

        return {
            "dry_run": self.dry_run,
            "passes": self.passes,
            "deleted": ids(self.deleted),
            "would_delete": ids(self.would_delete),
            "remaining": [
                {"kind": r.kind, "id": r.id, "error": self.errors.get(r.key, "still listed")} for r in self.remaining
            ],
            "held": ids(self.held),
            "hold_reasons": list(self.hold_reasons),
        }


class TeardownIncomplete(ServiceFailed):
    """Raised when the loop stopped with resources left; carries the report."""

    def __init__(self, report: TeardownReport):
        advice = "\nFix the errors above (or delete those resources by hand) and run the teardown again."
        if report.held:
            advice += (
                "\nKept resources: fix what FSx reports, run the cluster's delete task again (it exports first, "
                "then deletes the cluster), then this teardown; see the README, 'When the export before delete fails'."
            )
        super().__init__(report.summary() + advice)
        self.report = report
