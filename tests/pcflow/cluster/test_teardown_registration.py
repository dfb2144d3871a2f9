"""The cluster stage's teardown set `pcluster` is registered by a real import in whoever asks for it
(pcflow.aws, below the stage, only names it): each caller, in a fresh interpreter as a worker, the
api-server or a failure callback starts, finds it. The DAG files' case is tests/dags/test_parse.py. Seconds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from dagrun import REPO

from pcflow.aws.teardown import build_handlers
from pcflow.cluster.teardown import HANDLER_SET, ParallelClusterStackHandler
from pcflow.errors import ConfigurationError

#: Prints the sets a caller asks for that are not registered when it asks; stops before any AWS call.
MISSING = """
import json, sys
sys.path.insert(0, "plugins")
import pcflow.aws.janitor as janitor
import pcflow.aws.teardown as teardown

class Asked(Exception):
    pass

def build_handlers(clients, handler_sets):
    missing = sorted(set(handler_sets) - set(teardown.registered_handler_sets()))
    print(json.dumps(missing))
    raise Asked

teardown.build_handlers = janitor.build_handlers = build_handlers
"""
CALLERS = {
    "the UI's resources page": "import pcflow.ui.resources as r; r.janitor_view(None, None, r.JANITOR_HANDLER_SETS)",
    "a failure alert's listing": "import pcflow.alerts as a; a.list_left_running(None, 'demo', None)",
}


def missing_sets(call: str) -> list[str]:
    """What `call`, run in a fresh interpreter, asked for that nobody had registered."""
    code = f"{MISSING}try:\n    {call}\nexcept Asked:\n    pass\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("call", CALLERS.values(), ids=CALLERS.keys())
def test_each_caller_that_asks_for_the_cluster_set_has_registered_it(call):
    assert missing_sets(call) == []


def test_the_aws_teardown_alone_does_not_know_the_cluster_set_and_says_which_it_knows():
    code = (
        "import sys; sys.path.insert(0, 'plugins'); from pcflow.aws.teardown import build_handlers\n"
        "try:\n    build_handlers(lambda service: None, ['pcluster'])\nexcept ValueError as e:\n    print(e)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert "unknown teardown handler set 'pcluster'; choose from: ec2, fsx, images" in out.stdout


def test_importing_the_cluster_teardown_registers_its_set():
    handlers = build_handlers(lambda service: object(), [HANDLER_SET])
    assert [type(h) for h in handlers] == [ParallelClusterStackHandler]
    with pytest.raises(ConfigurationError, match=r"set 'no-such-set'; choose from: .*pcluster"):
        build_handlers(lambda service: object(), ["no-such-set"])
