"""The metrics stage's operators: thin shells over harvest/cost/report/publish (plain functions).

`HarvestMetricsOperator` takes the train task's XCom (`job`), reads the run directory over SSH,
publishes to S3 and CloudWatch and returns a small summary. `SweepLeaderboardOperator` does the same
for every trial of a job array, then ranks the trials and returns the best one's hyperparameters.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pcflow.aws.base import PcflowAwsOperator
from pcflow.errors import ConfigurationError, PcflowInputError, refused, task_author
from pcflow.metric_definitions import parse_definitions
from pcflow.metrics import publish
from pcflow.metrics.harvest import JobRef, RequiredMetricMissing, harvest_job, job_refs, load_job, xcom_summary
from pcflow.metrics.leaderboard import leaderboard_csv, leaderboard_page, rank_trials
from pcflow.metrics.links import MetricsDashboardLink, MetricsReportLink
from pcflow.metrics.report import render_report
from pcflow.naming import run_key_from_context, validate_stack_name
from pcflow.prices import NoPrices
from pcflow.pricing import cost, price_list
from pcflow.readings.series import Objective
from pcflow.slurm.head_node import HeadNode, head_node_argument
from pcflow.urls import report_path
from pcflow.values import known_at_run_time

#: What the summary and the model's asset event say of the saved outputs: where, and their sha256.
MODEL_SUMMARY = ("prefix", "model", "model_sha256", "checkpoint", "checkpoint_sha256")

if TYPE_CHECKING:
    from airflow.sdk import Context

    from pcflow.slurm.hook import SlurmHook


class HarvestMetricsOperator(PcflowAwsOperator):
    """Harvest a finished (or running) Slurm job's metrics, usage and cost; publish them.

    :param job: the XCom of SlurmJobOperator (or SlurmArrayJobOperator: every trial is harvested),
        a dict or its JSON, e.g. `"{{ ti.xcom_pull(task_ids='train') }}"`.
    :param bucket: S3 bucket of the reports: `s3://<bucket>/runs/<run key>/{metrics.json,report.html}`.
    :param stack: the pcflow stack (CloudWatch dimension, dashboard `pcflow-<stack>`).
    :param objective: `{"name": "probe_accuracy", "mode": "max"}` or `"loss:min"`.
    :param metric_definitions: SageMaker-style `[{"name": ..., "regex": ...}]` over the job log.
    :param required_metrics: metric names whose absence fails the task (all others are optional).
    :param instance_type: compute node type, for the cost; `capacity_type` `ondemand` or `spot`.
    :param nodes: node count when Slurm no longer knows the job (node-hours = elapsed x nodes).
    :param head_instance_type, fsx_storage_gib, fsx_deployment_type: priced over the run's window.
    :param cluster_provider, cluster: the cluster stage's provider and settings; for `parallelcluster`
        the head node type and FSx size are taken from them (unless given above).
    :param prices: overrides of pcflow/prices.json (e.g. `{"on_demand_per_hour": {...}}`).
    :param cost_before: the first task's `cost` section (pcflow.budget: maximum, budget, prices): the
        report shows it beside the final estimate, with the cost so far at each evaluation.
    :param cloudwatch: publish CloudWatch metrics and the dashboard (S3 and XCom always).
    :param head_node: the head node, as for SlurmJobOperator (or its parts, `ssh_conn_id`, `remote_host`,
        `host_key`, as before HeadNode).
    :param dataset: the dataset stage's XCom (DatasetLoadOperator): the partition the model event names.
    :param environment: the prepare_environment task's XCom: the run's environment (id, built or reused) in
        metrics.json and the summary (provenance).
    :param code: the ship_payload task's XCom: the code the run trained (pcflow.lineage.code_extra), in the
        run's document, report, summary and the model's event.
    :param warm_start: the warm_start task's XCom: the model the run started from (pcflow.warmstart.provenance:
        source, uri, sha256, run), in the same four places. The summary's `resume` says what requeues cost:
        restarts, the step resumed from and the steps lost (pcflow.metrics.resume).

    The job's `model.pt` and newest checkpoint are copied to `s3://<bucket>/runs/<run key>/model/`
    (`outputs.py`) before the report, which links them. Outlets that are Assets get an event whose extra
    is the summary; an AssetAlias gets an event of the stack's own Asset (`pcflow.lineage`).
    """

    template_fields: Sequence[str] = (
        *PcflowAwsOperator.template_fields,  # the region: the run's (its prices, its S3 and CloudWatch)
        "job",
        "bucket",
        "stack",
        "objective",
        "metric_definitions",
        "required_metrics",
        "instance_type",
        "capacity_type",
        "nodes",
        "head_instance_type",
        "fsx_storage_gib",
        "fsx_deployment_type",
        "cluster_provider",
        "cluster",
        "head_node",
        "prices",
        "cost_before",
        "cloudwatch",
        "dataset",
        "environment",
        "code",
        "warm_start",
    )
    template_fields_renderers = {"job": "json", "metric_definitions": "json", "prices": "json"}  # noqa: RUF012
    operator_extra_links = (MetricsReportLink(), MetricsDashboardLink())
    ui_color = "#f3d9a4"

    def __init__(
        self,
        *,
        job: Mapping[str, Any] | str,
        bucket: str,
        stack: str,
        objective: Mapping[str, str] | str | None = None,
        metric_definitions: list[Mapping[str, str]] | str | None = None,
        required_metrics: Sequence[str] = (),
        instance_type: str | None = None,
        capacity_type: str = "ondemand",
        nodes: int | str | None = None,
        head_instance_type: str | None = None,
        fsx_storage_gib: float | str | None = None,
        fsx_deployment_type: str | None = None,
        cluster_provider: str | None = None,
        cluster: Mapping[str, Any] | str | None = None,
        prices: Mapping[str, Any] | None = None,
        cost_before: Mapping[str, Any] | None = None,
        cloudwatch: bool = True,
        head_node: HeadNode | Mapping[str, Any] | str | None = None,
        ssh_conn_id: str | None = None,
        remote_host: str | None = None,
        host_key: str | None = None,
        dataset: Mapping[str, Any] | None = None,
        environment: Mapping[str, Any] | None = None,
        code: Mapping[str, Any] | None = None,
        warm_start: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.warm_start = warm_start
        self.dataset = dataset
        self.environment = environment
        self.code = code
        self.bucket = bucket
        self.stack = stack
        self.objective = objective
        self.metric_definitions = metric_definitions or []
        self.required_metrics = required_metrics
        self.instance_type = instance_type
        self.capacity_type = capacity_type
        self.nodes = nodes
        self.head_instance_type = head_instance_type
        self.fsx_storage_gib = fsx_storage_gib
        self.fsx_deployment_type = fsx_deployment_type
        self.cluster_provider = cluster_provider
        self.cluster = cluster
        self.prices = prices
        self.cost_before = cost_before
        self.cloudwatch = cloudwatch
        self.head_node = head_node_argument(head_node, ssh_conn_id, remote_host, host_key)
        # Refuse bad definitions and objectives when the DAG is parsed, not after the training ran.
        if not known_at_run_time(self.metric_definitions):
            parse_definitions(self.metric_definitions)
        if not known_at_run_time(self.objective):
            Objective.parse(self.objective)

    @cached_property
    def slurm(self) -> SlurmHook:
        from pcflow.slurm.hook import SlurmHook  # paramiko: imported then, not when the DAG file is parsed

        return SlurmHook(HeadNode.of(self.head_node))

    @cached_property
    def pricing(self) -> Any:
        """The connection's Price List API client (at the API's endpoint region, whatever the run's)."""
        return price_list.pricing_client(self.aws_conn_id, verify=self.verify)

    # -- the parts -------------------------------------------------------------------------------

    def settings(self) -> tuple[Objective | None, list, str]:
        """The objective, the metric definitions and the stack, validated; bad input fails the task without
        retry (a retry would read the same input)."""
        try:
            definitions = self.metric_definitions
            if isinstance(definitions, str):
                definitions = json.loads(definitions)
            return (
                Objective.parse(self.objective),
                parse_definitions(definitions),
                validate_stack_name(self.stack),
            )
        except ValueError as exc:  # objective, metric_definitions or stack
            raise ConfigurationError(f"Task {self.task_id}: {exc}; {task_author(self.task_id)}") from exc

    def cost_of(self, document: Mapping[str, Any], context: Context) -> dict[str, Any]:
        """The run's cost estimate from what the job used (accounting's node-seconds, else elapsed time x nodes)
        and the run's window; a region without prices gives an unpriced estimate, never another region's."""
        usage = document.get("accounting") or {}
        node_seconds = usage.get("node_seconds")
        if node_seconds is None and document.get("elapsed_s") is not None and self.nodes:
            node_seconds = int(document["elapsed_s"]) * int(self.nodes)
        start, end = _parse_time(usage.get("start")), _parse_time(usage.get("end"))
        window_s = document.get("elapsed_s")
        now = dt.datetime.now(dt.UTC)
        dag_run = context.get("dag_run")
        if dag_run is not None and getattr(dag_run, "start_date", None):
            window_s = (now - dag_run.start_date).total_seconds()
        if window_s is not None and (start is None or end is None):  # no accounting: the run's window
            start, end = start or now - dt.timedelta(seconds=window_s), end or now
        head, fsx_gib, fsx_type = self.priced_infrastructure()
        instance_type, capacity_type, zone = self.capacity_used()
        inputs = cost.CostInputs(
            instance_type=instance_type,
            capacity_type=capacity_type,
            node_seconds=node_seconds,
            window_s=window_s,
            head_instance_type=head,
            fsx_storage_gib=fsx_gib,
            fsx_deployment_type=fsx_type,
            start=start,
            end=end,
            availability_zone=zone,
        )
        try:
            types = [instance_type, head]
            table = cost.run_prices(self.hook.region_name, types, pricing=self.pricing, overrides=self.prices)
        except NoPrices as exc:  # never another region's prices
            self.log.warning("Not priced: %s", exc)
            return cost.unpriced(inputs, str(exc))
        ec2 = self.client("ec2") if capacity_type == "spot" else None
        return cost.estimate(inputs, table, ec2=ec2)

    def capacity_used(self) -> tuple[str, str, str | None]:
        """The instance type, capacity type and zone the job ran on: the run's (its network's zone: None), or
        after a capacity fallback (the train task's `capacity_moves`, pcflow.capacity) the last option's capacity
        type, zone and first listed type (which of its types EC2 launched is not known here)."""
        moves = (self.job or {}).get("capacity_moves") if isinstance(self.job, Mapping) else None
        if not moves:
            return self.instance_type, self.capacity_type, None
        option = moves[-1]
        return option["instance_types"][0], option["capacity_type"], option.get("availability_zone")

    def cost_over_time(self, document: Mapping[str, Any], context: Context) -> dict[str, Any]:
        """What the first task said the run may cost, and the cost so far at each evaluation."""
        before = self.cost_before
        if not before:
            return {}
        from pcflow.budget import checkpoint_costs

        keys = ("maximum_usd", "budget_usd", "per_hour", "summary", "if_maximum_exceeds")
        objective = (document.get("objective") or {}).get("name")
        dag_run = context.get("dag_run")
        checkpoints = checkpoint_costs(
            before,
            document.get("series", {}).get(objective) or [],
            job_start=_parse_time((document.get("accounting") or {}).get("start")),
            run_start=getattr(dag_run, "start_date", None),
        )
        return {"cost_before": {k: before.get(k) for k in keys}, "cost_checkpoints": checkpoints}

    def priced_infrastructure(self) -> tuple[str | None, float | None, str]:
        """(head node type, FSx GiB, FSx deployment type): as given, else from the ParallelCluster settings."""
        head, gib, kind = self.head_instance_type, self.fsx_storage_gib, self.fsx_deployment_type
        try:
            settings = json.loads(self.cluster) if isinstance(self.cluster, str) else self.cluster
            found = cost.cluster_infrastructure(self.cluster_provider, settings)
        except (ValueError, TypeError) as exc:  # the cost is an estimate: never fail the harvest for it
            self.log.warning("Cluster settings not priced (%s); the cost leaves the head node and FSx out", exc)
            found = cost.Infrastructure()
        head, gib = head or found.head_instance_type, gib or found.fsx_storage_gib
        kind = kind or (found.fsx_deployment_type if found.fsx_storage_gib else None)
        return head or None, float(gib) if gib else None, kind or "SCRATCH_2"

    def harvest_one(self, context: Context, ref: JobRef, key: str, objective, definitions) -> dict[str, Any]:
        """Harvest one job and publish it under `runs/<key>/`; returns (document, summary)."""
        from pcflow.lineage import code_extra
        from pcflow.warmstart import provenance

        ti = context["ti"]
        try:
            document = harvest_job(
                self.slurm, ref, definitions=definitions, objective=objective, required=list(self.required_metrics)
            )
        except RequiredMetricMissing as exc:
            raise refused("required_metrics", str(exc), task_author(self.task_id), RequiredMetricMissing) from exc
        document.update(run_key=key, stack=self.stack, dag_id=ti.dag_id, run_id=ti.run_id, code=code_extra(self.code))
        document["environment"] = environment_provenance(self.environment)
        document["container"] = container_provenance(self.job)
        document["warm_start"] = provenance(self.warm_start)
        document["cost"] = self.cost_of(document, context)
        document |= self.cost_over_time(document, context)
        s3 = self.client("s3")
        document["model"] = self.save_model(s3, document, key)
        prefix = publish.run_prefix(key)
        publish.put_object(s3, self.bucket, prefix + "metrics.json", json.dumps(document, indent=1), "application/json")
        report_url = publish.put_object(
            s3, self.bucket, prefix + "report.html", render_report(document), "text/html; charset=utf-8"
        )
        if self.cloudwatch:
            dims = publish.dimensions(stack=self.stack, dag_id=ti.dag_id, run_key=key, trial=ref.trial)
            data = publish.metric_data(document, dims, dt.datetime.now(dt.UTC))
            sent = publish.publish_metric_data(
                self.client("cloudwatch"), s3, self.bucket, prefix + "cloudwatch.json", data
            )
            self.log.info("CloudWatch: %d datapoints sent, %d sent before", sent["sent"], sent["already_sent"])
        self.log.info("Harvested %s (%s): report %s", ref.run_dir, document["outcome"], report_url)
        for item in document["missing"]:
            self.log.warning("Not harvested: %s (%s): %s", item["what"], item["path"], item["why"])
        model = {k: document["model"].get(k) for k in MODEL_SUMMARY}  # the hashes a later run loads them with
        summary = {**xcom_summary(document, report_url=report_url), "model": model, "code": document["code"]}
        return document, {
            **summary,
            **{k: document[k] for k in ("environment", "container", "warm_start")},
        }

    def save_model(self, s3: Any, document: dict[str, Any], key: str) -> dict[str, Any]:
        """The job's model and newest checkpoint, from the cluster to `s3://<bucket>/runs/<key>/model/`."""
        from pcflow.metrics.outputs import MODEL_FILE, save_outputs

        prefix, run_dir = publish.run_prefix(key) + "model/", document["job"]["run_dir"]
        saved = save_outputs(self.slurm, s3, run_dir=run_dir, bucket=self.bucket, prefix=prefix, log=self.log)
        saved["console_url"] = publish.s3_console_url(self.bucket, prefix, self.hook.region_name)
        if saved["model"] is None:
            document["missing"].append({"what": "model", "path": f"{run_dir}/{MODEL_FILE}", "why": "does not exist"})
        return saved

    def publish_dashboard(self, documents: Sequence[Mapping[str, Any]]) -> str | None:
        """The stack's dashboard, merged with the objective's graphs and the standard ones; None when CloudWatch
        is off."""
        if not self.cloudwatch:
            return None
        names: list[str] = []
        for doc in documents:
            obj = doc.get("objective") or {}
            if obj.get("name"):
                names.append(f"{obj['name']}_best")
                names.append(obj["name"])
            names += [
                n for n in ("loss", "gpu_util_percent", "gpu_memory_percent", "cost_usd_estimate") if n not in names
            ]
        return publish.publish_dashboard(
            self.client("cloudwatch"), self.stack, self.hook.region_name, dict.fromkeys(names)
        )

    def publish_run(self, context: Context, key: str, documents: Sequence[Mapping[str, Any]]) -> str | None:
        """The dashboard, and what the run cost as RunCostUSD (dimension: the stack), sent once per run."""
        dashboard = self.publish_dashboard(documents)
        usd = publish.run_cost(documents)
        if not self.cloudwatch or usd is None:
            return dashboard
        s3, marker = self.client("s3"), publish.run_prefix(key) + "cloudwatch-run-cost.json"
        if publish.read_json(s3, self.bucket, marker):  # once per run: a re-harvest must not count it twice
            self.log.info("%s of this run was sent before", publish.RUN_COST_METRIC)
            return dashboard
        now = dt.datetime.now(dt.UTC)
        started = getattr(context.get("dag_run"), "start_date", None) or now
        datum = publish.run_cost_datum(self.stack, usd, started, now)
        publish.publish_metric_data(self.client("cloudwatch"), s3, self.bucket, marker, [datum])
        self.log.info("%s of stack %s: %.4f USD", publish.RUN_COST_METRIC, self.stack, usd)
        return dashboard

    def link(self, context: Context, dashboard: str | None) -> None:
        """The report opens inside Airflow (the pcflow page serves its S3 copy); the dashboard in AWS."""
        ti = context["ti"]
        MetricsReportLink.persist(context, report_path(ti.dag_id, ti.run_id))
        if dashboard:
            MetricsDashboardLink.persist(context, publish.dashboard_url(self.hook.region_name, dashboard))

    def asset_events(self, context: Context, extra: Mapping[str, Any]) -> None:
        """An Asset outlet gets the event's extra; an AssetAlias, an event of this stack's own Asset
        behind it (`pcflow.lineage`), so one stack's runs never update another stack's model. The extra
        names the partition the model was trained on (`dataset`): the link partition -> model."""
        from pcflow.lineage import dataset_extra, emit

        trained_on = {"dataset": dataset_extra(self.dataset)} if isinstance(self.dataset, Mapping) else {}
        emit(context, self.outlets or [], self.stack, {**extra, **trained_on})

    # -- execute -----------------------------------------------------------------------------------

    def refs_to_harvest(self) -> list[JobRef]:
        """The job(s) to harvest, from the train task's XCom; a malformed one fails without retries."""
        try:
            return job_refs(self.job)
        except ValueError as exc:  # the train task's XCom, as it is: a retry reads the same
            raise PcflowInputError(f"Task {self.task_id}: {exc}") from exc

    def execute(self, context: Context) -> dict[str, Any]:
        objective, definitions, _ = self.settings()
        refs = self.refs_to_harvest()
        key = run_key_from_context(context)
        try:
            if len(refs) == 1 and refs[0].trial is None:
                document, summary = self.harvest_one(context, refs[0], key, objective, definitions)
                documents, result = [document], summary
            else:
                documents, result = self.harvest_trials(context, refs, key, objective, definitions)
            dashboard = self.publish_run(context, key, documents)
        finally:
            self.slurm.close()
        self.link(context, dashboard)
        self.asset_events(context, {"run_key": key, **result})
        return result

    def harvest_trials(self, context, refs, key, objective, definitions):
        """Harvest each trial of a sweep under `<run key>/trials/<i>`; the summary lists them with the run's
        total cost."""
        documents, summaries = [], []
        for ref in refs:
            document, summary = self.harvest_one(context, ref, f"{key}/trials/{ref.trial}", objective, definitions)
            documents.append(document)
            summaries.append(summary)
        return documents, {"run_key": key, "trials": summaries, "cost_usd_estimate": publish.run_cost(documents)}


class SweepLeaderboardOperator(HarvestMetricsOperator):
    """Every trial of a sweep harvested and published, then ranked by the objective:
    `s3://<bucket>/runs/<run key>/leaderboard.csv` and `leaderboard.html` (the trials' curves overlaid).

    Returns `{"run_key", "objective", "leaderboard": [...], "best": {"trial", "value",
    "hyperparameters"}, "cost_usd_estimate", "leaderboard_csv", "leaderboard_html"}`; `best` is None when no trial
    reported the objective.
    """

    def execute(self, context: Context) -> dict[str, Any]:
        objective, definitions, _ = self.settings()
        if objective is None:
            problem = "a leaderboard needs an objective (name and mode)"
            raise refused("objective", problem, task_author(self.task_id))
        refs = self.refs_to_harvest()
        key = run_key_from_context(context)
        try:
            documents, _ = self.harvest_trials(context, refs, key, objective, definitions)
            dashboard = self.publish_run(context, key, documents)
        finally:
            self.slurm.close()
        rows = rank_trials(documents, objective)
        s3 = self.client("s3")
        prefix = publish.run_prefix(key)
        csv_url = publish.put_object(s3, self.bucket, prefix + "leaderboard.csv", leaderboard_csv(rows), "text/csv")
        html_url = publish.put_object(
            s3,
            self.bucket,
            prefix + "leaderboard.html",
            leaderboard_page(rows, documents, objective, key),
            "text/html; charset=utf-8",
        )
        self.link(context, dashboard)
        best = next((r for r in rows if r["value"] is not None), None)
        if best is not None:  # every trial's model is in S3 under its own prefix; the best one is named here
            model = next(d["model"] for d in documents if d["job"]["trial"] == best["trial"])
            best = {
                **{k: best[k] for k in ("trial", "value", "hyperparameters")},
                **{"model": model["model"], "model_sha256": model.get("model_sha256")},
            }
        result = {
            "run_key": key,
            "objective": objective.as_dict(),
            "leaderboard": rows,
            "best": best,
            "cost_usd_estimate": publish.run_cost(documents),  # the trials' shared head node and FSx once
            "warm_start": documents[0]["warm_start"] if documents else None,  # every trial started from it
            "leaderboard_csv": csv_url,
            "leaderboard_html": html_url,
        }
        self.asset_events(context, {k: v for k, v in result.items() if k != "leaderboard"})
        return result


def _parse_time(text: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC) if text else None
    except ValueError:
        return None


def container_provenance(job: Mapping[str, Any] | str) -> dict[str, Any] | None:
    """The image the job ran in, as the train task recorded it (reference, digest, whether this run imported
    it, runtime), for metrics.json and the summary; None when it ran on the nodes themselves."""
    image = load_job(job).get("container")
    return dict(image) if isinstance(image, Mapping) else None


def environment_provenance(prepared: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the run's summary and metrics.json say of its environment (prepare_environment's result): its id
    (None: `training.python` as it is), whether this run built it and how long that took."""
    if not prepared:
        return None
    return {key: prepared.get(key) for key in ("id", "built", "build_s", "python")}
