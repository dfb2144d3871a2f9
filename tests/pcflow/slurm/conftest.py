"""Fixtures of the Slurm tests."""

from __future__ import annotations

import pytest

from pcflow.slurm.hook import SlurmHook


@pytest.fixture
def slurm(local_stack) -> SlurmHook:
    hook = SlurmHook()
    yield hook
    hook.close()
