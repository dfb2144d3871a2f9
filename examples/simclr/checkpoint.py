"""Per-epoch checkpoints: written atomically (temporary file, fsync, rename), each with a sidecar that
records its size and sha256; the newest one whose sidecar verifies is resumed.

`epoch-0003.pt` holds the state after three completed epochs, `epoch-0003.pt.sha256.json` its
`{"file", "size", "sha256"}` (include/payloads/README.md, the checkpoint contract). The sidecar is written
last, from the bytes read back from disk, so a checkpoint without one (the job was killed between the two
renames), or whose bytes no longer match it (cut short, damaged, half restored from S3 on FSx), is passed
over for the one before it: an attempt never resumes from a partial checkpoint.
"""

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
#: The sidecar beside each checkpoint: `<checkpoint name>` + this.
SIDECAR_SUFFIX = ".sha256.json"
#: A sidecar is a few dozen bytes: anything larger is not one.
SIDECAR_MAX_BYTES = 4096


def path_for(directory: str | Path, epochs_done: int) -> Path:
    return Path(directory) / f"epoch-{epochs_done:04d}.pt"


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(epochs done, path), oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := PATTERN.match(p.name))]
    return sorted(found)


def sidecar_for(path: str | Path) -> Path:
    """The sidecar that records `path`'s size and sha256."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def digest(path: str | Path) -> tuple[int, str]:
    """(size, sha256 hex) of the bytes on disk, read in 1 MiB blocks (a checkpoint may be gigabytes)."""
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            sha.update(block)
            size += len(block)
    return size, sha.hexdigest()


def _write_durably(final: Path, write) -> None:
    """`write(fh)` into a hidden temporary file beside `final`, fsync, rename: a reader sees all or nothing."""
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)


def save(directory: str | Path, epochs_done: int, state: dict[str, Any], keep: int = 2) -> Path:
    """The checkpoint after `epochs_done` epochs, then its sidecar (size and sha256 of the bytes as written);
    older ones beyond the newest `keep` removed with their sidecars."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = path_for(directory, epochs_done)
    _write_durably(final, lambda fh: torch.save(state, fh))
    size, sha256 = digest(final)
    record = json.dumps({"file": final.name, "size": size, "sha256": sha256}).encode()
    _write_durably(sidecar_for(final), lambda fh: fh.write(record))
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for _, old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
        sidecar_for(old).unlink(missing_ok=True)
    return final


def unverified(path: str | Path) -> str | None:
    """Why `path` cannot be resumed from (no sidecar, or its size or sha256 differ from the sidecar's); None
    when it verifies."""
    path, sidecar = Path(path), sidecar_for(path)
    try:
        with open(sidecar, "rb") as fh:
            data = fh.read(SIDECAR_MAX_BYTES + 1)
        record = json.loads(data) if len(data) <= SIDECAR_MAX_BYTES else None
    except FileNotFoundError:
        return f"no {sidecar.name} (written after the checkpoint: the write did not finish)"
    except ValueError:
        return f"{sidecar.name} is not a checkpoint record"
    if not isinstance(record, dict) or not {"size", "sha256"} <= record.keys():
        return f"{sidecar.name} is not a checkpoint record"
    if path.stat().st_size != record["size"]:
        return f"{path.stat().st_size} bytes, its sidecar says {record['size']}"
    if digest(path)[1] != record["sha256"]:
        return "its sha256 differs from its sidecar's"
    return None


def newest_verified(directory: str | Path) -> Path | None:
    """The newest checkpoint whose sidecar verifies; each newer one passed over is said on stderr."""
    for _, path in reversed(list_checkpoints(directory)):
        why = unverified(path)
        if why is None:
            return path
        print(f"pcflow-simclr: not resuming from {path}: {why}", file=sys.stderr, flush=True)
    return None


def load_latest(directory: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest verified checkpoint and its state, or None when there is none."""
    path = newest_verified(directory)
    return (path, load(path)) if path is not None else None


def load(path: str | Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)
