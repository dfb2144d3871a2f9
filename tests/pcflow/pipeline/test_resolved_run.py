"""Run settings travel between tasks as one typed value (issue 25, point 2): the first task's document is
validated once per task into `ResolvedRun` (`pcflow.pipeline.tasks.typed`), and every stage reads its
settings by attribute. A `run["..."]` subscript or `run.get(...)` in plugins/ or dags/ is a setting read
around the model: a typo there is a KeyError mid-run, and an editor cannot follow it to its declaration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from pcflow.pipeline import resolved, tasks

REPO = Path(__file__).resolve().parents[3]
UNTYPED_READ = re.compile(r"""\brun\[["']|\brun\.get\(""")


def untyped_reads(*roots: str) -> list[str]:
    """Each `run["` or `run.get(` in the Python files under `roots`, as path:line: text."""
    found = []
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if UNTYPED_READ.search(line):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    return found


def test_no_setting_is_read_from_the_run_as_a_dict():
    assert untyped_reads("plugins", "dags") == []


def test_the_guard_sees_a_subscript_and_a_get(tmp_path, monkeypatch):
    """The guard itself: it finds both spellings (so an empty answer above means none is left)."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "stage.py").write_text('a = run["region"]\nb = run.get("trials")\nc = run.region\n')
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert [line.split(": ", 1)[1] for line in untyped_reads("plugins")] == [
        'a = run["region"]',
        'b = run.get("trials")',
    ]


def test_a_task_validates_the_document_once_into_the_frozen_model(resolved_run):
    run = resolved_run(training={"nodes": 2})
    document = resolved.dump(run)  # what XCom carries between tasks
    loaded = tasks.typed(document)
    assert isinstance(loaded, resolved.ResolvedRun) and loaded == run and loaded.training.nodes == 2
    assert tasks.typed(loaded) is loaded  # a model is not validated again
    with pytest.raises(ValidationError):
        loaded.region = "eu-west-1"
    with pytest.raises(ValidationError):
        loaded.training.nodes = 3


def test_a_document_with_a_misspelt_setting_is_refused_where_it_is_loaded(resolved_run):
    document = resolved.dump(resolved_run())
    document["dataset"]["bucket_name"] = document["dataset"].pop("bucket")
    with pytest.raises(ValidationError, match="bucket"):
        tasks.typed(document)
