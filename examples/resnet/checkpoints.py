"""Per-epoch checkpoints in $PCFLOW_CHECKPOINT_DIR (atomic: temporary file, fsync, rename; the newest N
kept), each followed by a sidecar with its size and sha256 (`epoch-0003.pt.sha256.json`, the checkpoint
contract in include/payloads/README.md); the newest one whose sidecar verifies is resumed, so a checkpoint
cut short (killed mid-write, half restored) never is. The final model goes to $PCFLOW_RUN_DIR/model.pt."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch

PATTERN = re.compile(r"^epoch-(\d{4,})\.pt$")
SIDECAR_SUFFIX = ".sha256.json"
SIDECAR_MAX_BYTES = 4096


def directory() -> Path:
    """$PCFLOW_CHECKPOINT_DIR, else <run dir>/checkpoints (a run by hand)."""
    run_dir = Path(os.environ.get("PCFLOW_RUN_DIR") or ".")
    return Path(os.environ.get("PCFLOW_CHECKPOINT_DIR") or run_dir / "checkpoints")


def atomic_save(state: dict[str, Any], final: Path) -> Path:
    """Write `state` to `final` so that a reader never sees half a file (temporary, fsync, rename)."""
    return atomic_write(final, lambda fh: torch.save(state, fh))


def atomic_write(final: Path, write) -> Path:
    """`write(fh)` into a hidden temporary file beside `final`, fsync, rename."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return final


def sidecar_for(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def digest(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of the bytes on disk."""
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            sha.update(block)
            size += len(block)
    return size, sha.hexdigest()


def unverified(path: Path) -> str | None:
    """Why `path` is not to be resumed from (no sidecar, or size or sha256 not the sidecar's); None: it verifies."""
    try:
        with open(sidecar_for(path), "rb") as fh:
            data = fh.read(SIDECAR_MAX_BYTES + 1)
        record = json.loads(data) if len(data) <= SIDECAR_MAX_BYTES else None
    except FileNotFoundError:
        return "no sidecar (the write did not finish)"
    except ValueError:
        record = None
    if not isinstance(record, dict) or not {"size", "sha256"} <= record.keys():
        return "its sidecar is not a checkpoint record"
    size, sha256 = digest(path)
    if (size, sha256) != (record["size"], record["sha256"]):
        return f"{size} bytes, sha256 {sha256[:12]}; its sidecar: {record['size']} bytes, {str(record['sha256'])[:12]}"
    return None


def listed(where: Path) -> list[tuple[int, Path]]:
    """(epochs done, path), oldest first."""
    if not where.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in where.iterdir() if (m := PATTERN.match(p.name)))


def save(epochs_done: int, state: dict[str, Any], keep: int) -> Path:
    """The checkpoint after `epochs_done` epochs; older ones beyond the newest `keep` removed."""
    where = directory()
    path = atomic_save(state, where / f"epoch-{epochs_done:04d}.pt")
    size, sha256 = digest(path)
    record = json.dumps({"file": path.name, "size": size, "sha256": sha256}).encode()
    atomic_write(sidecar_for(path), lambda fh: fh.write(record))
    for _, old in listed(where)[:-keep]:
        old.unlink(missing_ok=True)
        sidecar_for(old).unlink(missing_ok=True)
    return path


def latest() -> Path | None:
    """The newest checkpoint whose sidecar verifies (each newer one passed over is said), or None."""
    for _, path in reversed(listed(directory())):
        why = unverified(path)
        if why is None:
            return path
        print(f"resnet: not resuming from {path}: {why}", file=sys.stderr, flush=True)
    return None


def save_model(state: dict[str, Any]) -> Path:
    """$PCFLOW_RUN_DIR/model.pt: the output pcflow's train task requires and copies to S3."""
    return atomic_save(state, Path(os.environ.get("PCFLOW_RUN_DIR") or ".") / "model.pt")
