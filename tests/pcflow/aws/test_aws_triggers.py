"""The triggerer rebuilds a trigger from `serialize()`: class path + kwargs must give the same trigger."""

from __future__ import annotations

from importlib import import_module

import pytest

from pcflow.aws.waits import FsxDataRepositoryTaskTrigger, ImageAvailableTrigger, LockReleasedTrigger
from pcflow.cluster.triggers import ClusterStackTrigger


@pytest.mark.parametrize(
    "trigger",
    [
        ImageAvailableTrigger(image_id="ami-0123456789abcdef0", region_name="us-east-1", botocore_config={"a": 1}),
        FsxDataRepositoryTaskTrigger(task_id="task-0123456789abcdef0", waiter_delay=5, aws_conn_id=None),
        ClusterStackTrigger(stack_name="pcflow-c", waiter_name="stack_delete_complete", verify=False),
        LockReleasedTrigger(bucket="b", key="pcflow/images/s/r/lock", etag='"e"', holder="pretrain-x", waiter_delay=5),
    ],
)
def test_trigger_round_trips_through_its_class_path(trigger):
    path, kwargs = trigger.serialize()
    module, name = path.rsplit(".", 1)
    rebuilt = getattr(import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)
    assert rebuilt.waiter_args == trigger.waiter_args and rebuilt.return_value == trigger.return_value


def test_cluster_trigger_refuses_an_unknown_waiter():
    with pytest.raises(ValueError, match="waiter_name must be one of"):
        ClusterStackTrigger(stack_name="s", waiter_name="stack_exists")
