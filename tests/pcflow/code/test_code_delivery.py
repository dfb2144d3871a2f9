"""A run's own code delivered to the local stack for real (pcflow.code.deliver): a git repository's pinned
commit packed, put in the stack's bucket (moto over HTTPS) and staged on the static cluster over sshd;
the second delivery of the same code sends 0 bytes and reuses the staged copy, another cluster stages it
from the bucket without the repository (whose hyperparameter schema the commit's record keeps); a job runs it as
`pkg.module:function` with the hyperparameters as `--key value` arguments and in $PCFLOW_HPARAMS_JSON."""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from pathlib import Path

import pytest
from run_factories import make_resolved_run
from taskcontext import make_context, run_to_end
from test_code_sources import commit, sh

from pcflow.aws.clients import aws_client
from pcflow.code.deliver import deliver, pin_code
from pcflow.code.hparams import code_schema
from pcflow.runspec import CodeSettings
from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.operators import SlurmJobOperator

pytestmark = pytest.mark.stack
log = logging.getLogger(__name__)
TRAIN = """import json, os, sys
def main():
    print("args", sys.argv[1:])
    print("env", json.loads(os.environ["PCFLOW_HPARAMS_JSON"]))
"""
SCHEMA = '{"properties": {"lr": {"type": "number", "maximum": 1}}}'


@pytest.fixture
def bucket(local_stack):
    s3 = aws_client("s3")
    name = f"pcflow-code-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=name)
    yield s3, name
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        for item in page.get("Contents", []):
            s3.delete_object(Bucket=name, Key=item["Key"])
    s3.delete_bucket(Bucket=name)


@pytest.fixture
def repo(tmp_path) -> str:
    work = tmp_path / "work"
    work.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=work)
    (work / "proj" / "pkg").mkdir(parents=True)
    (work / "proj" / "pkg" / "__init__.py").write_text("")
    commit(work, "proj/pkg/train.py", TRAIN)
    commit(work, "proj/hparams.schema.json", SCHEMA)
    sh("git", "clone", "-q", "--bare", str(work), str(tmp_path / "repo.git"), cwd=tmp_path)
    return f"file://{tmp_path / 'repo.git'}"


def test_git_code_is_uploaded_and_staged_once_and_runs_as_an_entry_point(local_stack, bucket, repo):
    s3, name = bucket
    shared_root = str(local_stack.shared_root / "tests" / f"code-{uuid.uuid4().hex[:8]}")
    code = pin_code(CodeSettings.model_validate({"git": {"url": repo, "ref": "main", "subdir": "proj"}}), str)
    training = {"code": code.model_dump(mode="json"), "bundle": {"max_mib": 1, "allow_secrets": False}}
    run = make_resolved_run(
        "local", stack="dev", dataset={"bucket": name}, training={**training, "hyperparameters": {}}
    )
    hook = SlurmHook()
    try:
        first = deliver(run, hook, shared_root=shared_root, s3=s3, log=log)
        assert first["source"] == "git" and first["commit"] == code.git.commit and first["dirty"] is False
        assert first["uploaded_bytes"] == first["bytes"] > 0 and first["reused"] is False and first["files"] == 3
        second = deliver(run, hook, shared_root=shared_root, s3=s3, log=log)
        assert (second["uploaded_bytes"], second["reused"], second["digest"]) == (0, True, first["digest"])
        assert s3.head_object(Bucket=name, Key=first["key"])["ContentLength"] == first["bytes"]
        assert sorted(p.name for p in Path(first["dir"]).iterdir()) == ["hparams.schema.json", "pkg"]
        # Another cluster, the repository gone: the commit's record and bundle in the bucket stage it, and
        # the record answers the first task's question for the code's hyperparameter schema.
        shutil.rmtree(repo.removeprefix("file://"))
        assert code_schema(run, lambda: s3)[1] == SCHEMA.encode()
        other = deliver(run, hook, shared_root=f"{shared_root}/other", s3=s3, log=log)
        assert (other["digest"], other["reused"], other["uploaded_bytes"]) == (first["digest"], False, 0)
        assert (Path(other["dir"]) / "pkg" / "train.py").read_text() == TRAIN

        op = SlurmJobOperator(
            task_id="code",
            program=["pkg.train:main", "--own", "x y"],
            python="python3",
            payload_dir=first["dir"],
            hyperparameters={"lr": 0.5, "name": "a b"},
            hyperparameter_args=True,
            shared_root=shared_root,
            poll_interval=0.2,
            confirm_interval=2.0,
        )
        text = Path(run_to_end(op, make_context("code"))["log"]).read_text()
        assert "args ['--own', 'x y', '--lr', '0.5', '--name', 'a b']" in text
        assert f"env {json.loads(json.dumps({'lr': 0.5, 'name': 'a b'}))}" in text
    finally:
        hook.run(["chmod", "-R", "u+w", shared_root], check=False)
        hook.run(["rm", "-rf", shared_root], check=False)
        hook.close()
