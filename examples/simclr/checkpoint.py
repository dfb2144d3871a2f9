"""Per-epoch checkpoints: written atomically (temporary file, fsync, rename), newest one resumed.

`epoch-0003.pt` holds the state after three completed epochs. A reader never sees half a file; a
file that does not load anyway (a disk that lied) is skipped in favour of the one before it.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import torch

PATTERN = re.compile(r"^epoch-(\d{4,})\.pt$")


def path_for(directory: str | Path, epochs_done: int) -> Path:
    return Path(directory) / f"epoch-{epochs_done:04d}.pt"


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(epochs done, path), oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := PATTERN.match(p.name))]
    return sorted(found)


def save(directory: str | Path, epochs_done: int, state: dict[str, Any], keep: int = 2) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = path_for(directory, epochs_done)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for _, old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def load_latest(directory: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, or None when there is none."""
    for _, path in reversed(list_checkpoints(directory)):
        try:
            return path, load(path)
        except Exception as exc:  # a damaged file: fall back to the previous epoch
            print(f"pcflow-simclr: skipping unreadable checkpoint {path}: {exc}", file=sys.stderr, flush=True)
    return None


def load(path: str | Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)
