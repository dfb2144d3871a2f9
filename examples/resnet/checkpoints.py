"""Per-epoch checkpoints in $PCFLOW_CHECKPOINT_DIR (atomic: temporary file, fsync, rename; the newest N
kept), the newest one that loads resumed, and the final model in $PCFLOW_RUN_DIR/model.pt."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import torch

PATTERN = re.compile(r"^epoch-(\d{4,})\.pt$")


def directory() -> Path:
    """$PCFLOW_CHECKPOINT_DIR, else <run dir>/checkpoints (a run by hand)."""
    run_dir = Path(os.environ.get("PCFLOW_RUN_DIR") or ".")
    return Path(os.environ.get("PCFLOW_CHECKPOINT_DIR") or run_dir / "checkpoints")


def atomic_save(state: dict[str, Any], final: Path) -> Path:
    """Write `state` to `final` so that a reader never sees half a file (temporary, fsync, rename)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return final


def listed(where: Path) -> list[tuple[int, Path]]:
    """(epochs done, path), oldest first."""
    if not where.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in where.iterdir() if (m := PATTERN.match(p.name)))


def save(epochs_done: int, state: dict[str, Any], keep: int) -> Path:
    """The checkpoint after `epochs_done` epochs; older ones beyond the newest `keep` removed."""
    where = directory()
    path = atomic_save(state, where / f"epoch-{epochs_done:04d}.pt")
    for _, old in listed(where)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def latest() -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads (a damaged file is skipped for the one before), or None."""
    for _, path in reversed(listed(directory())):
        try:
            return path, torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            print(f"resnet: skipping unreadable checkpoint {path}: {exc}", file=sys.stderr, flush=True)
    return None


def save_model(state: dict[str, Any]) -> Path:
    """$PCFLOW_RUN_DIR/model.pt: the output pcflow's train task requires and copies to S3."""
    return atomic_save(state, Path(os.environ.get("PCFLOW_RUN_DIR") or ".") / "model.pt")
