"""What `make demo` and `make rehearsal` show while the DAG runs: one line per task as it ends (task,
state, seconds, what it did), while Airflow's own output (task runner, XCom pushes, the execution API,
its subprocesses') goes to a log file whose path the summary names."""

from __future__ import annotations

import datetime as dt
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

POLL_S = 1.0
ENDED = ("success", "failed", "skipped", "upstream_failed")
#: What each task's line shows of its returned value.
SHOWN = {
    "network": ("vpc_id",),
    "image": ("image_id", "reused"),
    "dataset": ("object_count", "uploaded", "skipped", "mode"),
    "cluster": ("name", "adopted"),
    "ship_payload": ("dir", "reused"),
    "train": ("job_id", "state", "nodes", "elapsed_s"),
    "metrics": ("outcome", "objective", "cost_usd_estimate"),
    "teardown": ("deleted",),
    "delete_cluster": ("deleted",),
}


def did(task_id: str, value: Any) -> str:
    """A few words on what a task returned (its XCom), for the progress line."""
    if not isinstance(value, dict):
        return "" if value is None else str(value)[:60]
    shown = {k: value[k] for k in SHOWN.get(task_id, ()) if k in value}
    if isinstance(shown.get("objective"), dict):
        shown["objective"] = "{name}={value}".format(**{"name": None, "value": None, **shown["objective"]})
    if isinstance(shown.get("deleted"), list):
        shown["deleted"] = len(shown["deleted"])
    return " ".join(f"{k}={v}" for k, v in shown.items())


class TaskLines(threading.Thread):
    """Polls the run's task instances in the metadata database; prints each one once it has ended."""

    def __init__(self, dag_id: str, run_after: dt.datetime, out: TextIO):
        super().__init__(daemon=True, name="pcflow-progress")
        self.dag_id, self.run_after, self.out = dag_id, run_after, out
        self.run_id: str | None = None  # Airflow adds a random suffix to a manual run's id
        self.done = threading.Event()
        self.printed: set[tuple[str, int]] = set()

    def run(self) -> None:
        while not self.done.wait(POLL_S):
            self.poll_once()
        self.poll_once()

    def poll_once(self) -> None:
        """A look that fails (SQLite busy while the run writes) is only a missed look: tried again next."""
        try:
            self.poll()
        except Exception as exc:  # the run goes on; the error is in Airflow's log
            print(f"pcflow progress: {exc!r}", file=sys.stderr)

    def poll(self) -> None:
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        with create_session() as session:
            if self.run_id is None:
                runs = session.query(DagRun.run_id).filter(DagRun.dag_id == self.dag_id)
                self.run_id = runs.filter(DagRun.run_after == self.run_after).scalar()
            ended = (
                session.query(TaskInstance)
                .filter(TaskInstance.dag_id == self.dag_id, TaskInstance.run_id == self.run_id)
                .filter(TaskInstance.state.in_(ENDED))
                .order_by(TaskInstance.end_date)
                .all()
            )
            for ti in ended:
                if (ti.task_id, ti.map_index) in self.printed:
                    continue
                self.printed.add((ti.task_id, ti.map_index))
                row = session.query(XComModel.value).filter_by(
                    dag_id=self.dag_id, run_id=self.run_id, task_id=ti.task_id, key="return_value"
                )
                value = row.filter_by(map_index=ti.map_index).scalar()
                seconds = (ti.end_date - ti.start_date).total_seconds() if ti.start_date and ti.end_date else 0.0
                name = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
                print(f"  {name:<24} {ti.state:<15} {seconds:7.1f} s  {did(ti.task_id, value)}", file=self.out)


def settle_imports() -> None:
    """Import Airflow's models and configure their mappers before the thread starts: the run's first
    imports and the thread's first query would otherwise wait on each other's locks forever."""
    import airflow.dag_processing.dagbag  # noqa: F401 - what run_dag imports first
    from airflow.models import import_all_models
    from sqlalchemy.orm import configure_mappers

    import_all_models()
    configure_mappers()


@contextmanager
def task_lines(dag_id: str, run_after: dt.datetime, log_path: Path) -> Iterator[None]:
    """Within: this process's stdout and stderr (file descriptors 1 and 2, so subprocesses' too) go to
    `log_path`, and one line per ended task goes to the terminal (stdout as it was)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_err = os.dup(2)
    terminal = os.fdopen(os.dup(1), "w", buffering=1)
    with log_path.open("ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    settle_imports()
    lines = TaskLines(dag_id, run_after, terminal)
    lines.start()
    try:
        yield
    finally:
        lines.done.set()
        lines.join(timeout=10)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(terminal.fileno(), 1)
        os.dup2(saved_err, 2)
        os.close(saved_err)
        terminal.close()
