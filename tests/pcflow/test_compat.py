"""Stored names keep working across a rename (pcflow.compat): every trigger a release of pcflow stored
(tests/pcflow/stored/<version>.json) is rebuilt by today's code the way Airflow's triggerer rebuilds a
row of its trigger table, and the names compat registers are the ones the code uses."""

from __future__ import annotations

import inspect
import json
import sys
import types
from pathlib import Path

import pytest
from airflow.models.crypto import get_fernet
from airflow.models.trigger import Trigger
from airflow.sdk.module_loading import import_string  # the triggerer's own (airflow._shared.module_loading)
from airflow.serialization.decoders import smart_decode_trigger_kwargs
from airflow.triggers.base import BaseTrigger

import pcflow
from pcflow import compat
from pcflow.provider_info import EXTRA_LINKS, TRIGGER_MODULES

STORED = Path(__file__).with_name("stored")


def stored_triggers() -> list:
    return [
        pytest.param(entry, id=f"{path.stem}-{entry['classpath'].rsplit('.', 1)[1]}")
        for path in sorted(STORED.glob("*.json"))
        for entry in json.loads(path.read_text())["triggers"]
    ]


def rebuild(classpath: str, column: dict) -> BaseTrigger:
    """A trigger from a row of Airflow's trigger table, as the triggerer's runner makes it: the kwargs
    column decrypted and decoded, the class imported by its stored path, called with those kwargs."""
    encrypted = get_fernet().encrypt(json.dumps(column).encode()).decode()
    kwargs = {k: smart_decode_trigger_kwargs(v) for k, v in Trigger._decrypt_kwargs(encrypted).items()}
    return import_string(classpath)(**kwargs)


@pytest.mark.parametrize("entry", stored_triggers())
def test_a_stored_trigger_is_rebuilt_into_a_working_trigger(entry):
    trigger = rebuild(entry["classpath"], entry["kwargs"])
    assert entry["classpath"] in compat.STORED_TRIGGERS
    classpath, kwargs = trigger.serialize()
    assert import_string(classpath) is type(trigger)
    # What it stored means the same today: every argument that kept its name kept its value ...
    stored = Trigger._decrypt_kwargs(json.dumps(entry["kwargs"]))
    kept = stored.keys() & kwargs.keys()
    assert kept and {k: kwargs[k] for k in kept} == {k: stored[k] for k in kept}
    # ... and the rebuilt trigger stores and rebuilds again, and does its I/O-free work.
    again = rebuild(classpath, _column(kwargs))
    assert again.serialize() == (classpath, kwargs)
    exercise(trigger)


def _column(kwargs: dict) -> dict:
    """The kwargs column today's Airflow writes for `kwargs`, decrypted."""
    column = Trigger.encrypt_kwargs(kwargs)
    return json.loads(column if column.startswith("{") else get_fernet().decrypt(column.encode()).decode())


def exercise(trigger: BaseTrigger) -> None:
    """What a trigger computes before its first poll: the Slurm waits' policy, files and budget meter;
    the AWS waits' hook."""
    from airflow.providers.amazon.aws.triggers.base import AwsBaseWaiterTrigger

    from pcflow.slurm.trigger import HeadNodeTrigger

    if isinstance(trigger, HeadNodeTrigger):
        assert trigger.watch_policy.poll_interval > 0
        assert all(path.startswith(trigger.run_dir) for path in trigger.watched_paths)
        assert (trigger.meter is None) == (not trigger.budget)
        trigger.watched_jobs()
    else:
        assert isinstance(trigger, AwsBaseWaiterTrigger)
        assert isinstance(trigger.hook(), trigger.aws_hook_class)


def test_this_release_has_its_stored_triggers_captured():
    """A new version captures what it stores (tests/pcflow/stored/capture.py), so the next one is tested
    against it; every class path a release stored stays registered."""
    captured = STORED / f"{pcflow.__version__}.json"
    assert captured.is_file(), f"run tests/pcflow/stored/capture.py for pcflow {pcflow.__version__}"
    for release in STORED.glob("*.json"):
        assert {e["classpath"] for e in json.loads(release.read_text())["triggers"]} <= set(compat.STORED_TRIGGERS)


def test_every_trigger_class_is_registered_and_every_registered_path_imports():
    found = {
        f"{cls.__module__}.{cls.__qualname__}": cls
        for module in TRIGGER_MODULES
        for _, cls in inspect.getmembers(import_string(module), inspect.isclass)
        if issubclass(cls, BaseTrigger) and cls.__module__ == module
    }
    bases = {p for p, cls in found.items() if any(o is not cls and issubclass(o, cls) for o in found.values())}
    assert set(found) - bases <= set(compat.STORED_TRIGGERS), "register every trigger class in pcflow.compat"
    for classpath in compat.STORED_TRIGGERS:
        assert issubclass(import_string(classpath), BaseTrigger), classpath


def test_the_task_state_key_and_link_keys_are_registered():
    from pcflow.slurm.operators import STATE_KEY

    assert STATE_KEY in compat.STATE_KEYS
    assert {import_string(path)().xcom_key: path for path in EXTRA_LINKS} == compat.LINK_XCOM_KEYS


def test_a_renamed_state_key_is_still_read(monkeypatch):
    saved = {"job_id": "4242", "log_offset": 10}
    monkeypatch.setitem(compat.STATE_KEYS, "slurm_job", ("slurm_submission",))
    assert compat.read_state({"slurm_submission": saved}, "slurm_job") == saved
    assert compat.read_state({"slurm_job": {"job_id": "1"}, "slurm_submission": saved}, "slurm_job") == {"job_id": "1"}
    assert compat.read_state({}, "slurm_job") is None
    assert compat.read_state(None, "slurm_job") is None


def test_a_moved_trigger_resolves_through_a_shim_at_its_old_path(monkeypatch):
    """A trigger moved to a new module: the old module, left as a shim, hands out the class under its old
    path, and a row stored under that path is rebuilt into the class at the new one."""
    from pcflow.slurm.trigger import SlurmJobTrigger

    shim = types.ModuleType("pcflow.slurm.old_trigger")
    shim.__getattr__ = compat.moved(shim.__name__, {"JobTrigger": "pcflow.slurm.trigger.SlurmJobTrigger"})
    monkeypatch.setitem(sys.modules, shim.__name__, shim)
    assert import_string("pcflow.slurm.old_trigger.JobTrigger") is SlurmJobTrigger
    with pytest.raises(ImportError, match="Nothing"):
        import_string("pcflow.slurm.old_trigger.Nothing")
    entry = next(p.values[0] for p in stored_triggers() if p.values[0]["classpath"].endswith(".SlurmJobTrigger"))
    assert type(rebuild("pcflow.slurm.old_trigger.JobTrigger", entry["kwargs"])) is SlurmJobTrigger
