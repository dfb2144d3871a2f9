"""STAND-IN for the FSx calls moto lacks (data repository associations and tasks: moto 5.2.5 answers
500), following the FSx API reference; shared by the dataset (import) and cluster (export) tests."""

from __future__ import annotations

import datetime as dt
import itertools

from botocore.awsrequest import AWSResponse
from botocore.validate import ParamValidator

CREATED = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)


class FsxStandIn:
    """Answers, on a real FSx client, only the calls moto lacks; everything else goes to moto.

    Registered on botocore's `before-call` event (the hook Stubber uses), after botocore has validated
    the request; each response is validated against the operation's output shape.
    """

    OPERATIONS = ("DescribeDataRepositoryAssociations", "DescribeDataRepositoryTasks", "CreateDataRepositoryTask")

    def __init__(self, *, links: dict[str, list[str]], ends: tuple[str, str | None] | None = None):
        """`ends`: when given, a task described by id moves PENDING -> EXECUTING -> ends[0] (reason ends[1])."""
        self.links, self.ends = links, ends
        self.tasks: dict[str, dict] = {}
        self.by_token: dict[str, str] = {}
        self.calls: list[tuple[str, dict]] = []
        self._ids = itertools.count(1)

    def attach(self, client) -> FsxStandIn:
        for op in self.OPERATIONS:
            client.meta.events.register(f"before-parameter-build.fsx.{op}", self._keep_params)
            client.meta.events.register(f"before-call.fsx.{op}", self._answer)
        return self

    def finish(self, task_id: str, lifecycle: str, message: str | None = None) -> None:
        self.tasks[task_id]["Lifecycle"] = lifecycle
        if message:
            self.tasks[task_id]["FailureDetails"] = {"Message": message}

    def creates(self) -> list[dict]:
        return [params for op, params in self.calls if op == "CreateDataRepositoryTask"]

    @staticmethod
    def _keep_params(params, context, **_):
        context["standin_params"] = dict(params)  # before-call sees the serialized request, not these

    def _answer(self, model, context, **_):
        params = context["standin_params"]  # reached only once botocore has validated them
        self.calls.append((model.name, params))
        response = getattr(self, f"_{model.name}")(params)
        report = ParamValidator().validate(response, model.output_shape)
        assert not report.has_errors(), report.generate_report()
        return AWSResponse("https://fsx.stand-in", 200, {}, None), response

    def _DescribeDataRepositoryAssociations(self, params):
        fs_ids = [v for f in params.get("Filters", []) if f["Name"] == "file-system-id" for v in f["Values"]]
        associations = [
            {"AssociationId": f"dra-{i:017x}", "FileSystemId": fs, "Lifecycle": "AVAILABLE", "DataRepositoryPath": p}
            for fs in fs_ids
            for i, p in enumerate(self.links.get(fs, []))
        ]
        return {"Associations": associations}

    def _DescribeDataRepositoryTasks(self, params):
        if self.ends:
            for task_id in params.get("TaskIds", []):
                now = self.tasks[task_id]["Lifecycle"]
                if now == "PENDING":
                    self.finish(task_id, "EXECUTING")
                elif now == "EXECUTING":
                    self.finish(task_id, *self.ends)
        fs_ids = [v for f in params.get("Filters", []) if f["Name"] == "file-system-id" for v in f["Values"]]
        tasks = [
            t
            for t in self.tasks.values()
            if (not params.get("TaskIds") or t["TaskId"] in params["TaskIds"])
            and (not fs_ids or t["FileSystemId"] in fs_ids)
        ]
        return {"DataRepositoryTasks": tasks}

    def _CreateDataRepositoryTask(self, params):
        token = params["ClientRequestToken"]
        if token not in self.by_token:  # FSx: the same token returns the same task
            task_id = f"task-{next(self._ids):017x}"
            self.by_token[token] = task_id
            self.tasks[task_id] = {
                "TaskId": task_id,
                "Lifecycle": "PENDING",
                "Type": params["Type"],
                "CreationTime": CREATED,
                "FileSystemId": params["FileSystemId"],
                "Paths": params.get("Paths", []),
                "Tags": params.get("Tags", []),
            }
        return {"DataRepositoryTask": self.tasks[self.by_token[token]]}
