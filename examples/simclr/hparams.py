"""The payload's hyperparameters: read from the JSON file at $PCFLOW_HPARAMS, defaults for the rest.

Unknown names are refused (a typo would otherwise train with a silent default), and values are
checked for type and range before any process group exists, so a bad request fails in a second.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any


class HparamError(ValueError):
    """The hyperparameters cannot be used; the message names the value and what is allowed."""


@dataclass(frozen=True)
class Hparams:
    # data
    data_dir: str = ""  #: class folders of PNGs, or a partition of WebDataset shards (dir or s3://) (required)
    image_size: int = 16  #: side the (8x8) digits are resampled to by the augmentations
    shuffle_buffer: int = 1000  #: shards: samples a rank shuffles through while it streams its share
    # pretraining
    epochs: int = 5
    batch_size: int = 128  #: global: split evenly over the tasks (one result whatever the task count)
    lr: float = 2e-3  #: peak learning rate of AdamW, reached after the warm-up
    weight_decay: float = 1e-4
    warmup_epochs: float = 0.5  #: linear warm-up, then cosine decay to zero at the last step
    temperature: float = 0.2  #: NT-Xent temperature
    width: int = 32  #: channels of the encoder's first block (doubled per block)
    embedding_dim: int = 64  #: output of the projection head, where the loss is taken
    seed: int = 0
    # linear probe on frozen encoder features
    probe_test_fraction: float = 0.3
    probe_seed: int = 0
    probe_steps: int = 300  #: full-batch optimisation steps of the logistic regression
    probe_lr: float = 0.1
    probe_weight_decay: float = 1e-4
    probe_shots: int = 1  #: few-label probe: labelled images per class it is fitted on
    probe_draws: int = 10  #: few-label probe: draws of those images, the accuracy is their mean
    probe_baseline: bool = True  #: also probe the untrained encoder (the same init), side by side
    eval_samples: int = 10_000  #: the probes' images: all of a folder up to this many; the first of shards
    # operations
    log_every_steps: int = 1
    keep_checkpoints: int = 2
    threads: int = 0  #: torch threads per task; 0 = SLURM_CPUS_PER_TASK, else the cores / local tasks
    fail_at_epoch: int | None = None  #: raise at the start of this epoch (tests, demos of retry/resume)
    fail_once: bool = True  #: fail only the first time that epoch is reached in this run directory

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Hparams:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise HparamError(f"unknown hyperparameter(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        checked: dict[str, Any] = {}
        for name, value in values.items():
            default = known[name].default
            checked[name] = _coerce(name, value, default, optional=name == "fail_at_epoch")
        hp = cls(**checked)
        hp.validate()
        return hp

    @classmethod
    def from_env(cls) -> Hparams:
        path = os.environ.get("PCFLOW_HPARAMS")
        if not path:
            raise HparamError("PCFLOW_HPARAMS is not set: it must name the JSON file of hyperparameters")
        try:
            values = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise HparamError(f"cannot read hyperparameters from {path}: {exc}") from exc
        if not isinstance(values, dict):
            raise HparamError(f"{path} must hold a JSON object, got {type(values).__name__}")
        return cls.from_dict(values)

    def validate(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise HparamError(message)

        need(bool(self.data_dir), "data_dir is required: class folders of PNG images, or a partition of shards")
        need(self.shuffle_buffer >= 1, f"shuffle_buffer must be >= 1, got {self.shuffle_buffer}")
        need(4 <= self.image_size <= 224, f"image_size must be 4..224, got {self.image_size}")
        need(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        need(self.batch_size >= 2, f"batch_size must be >= 2, got {self.batch_size}")
        need(self.lr > 0, f"lr must be > 0, got {self.lr}")
        need(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        need(0 <= self.warmup_epochs <= self.epochs, f"warmup_epochs must be 0..epochs, got {self.warmup_epochs}")
        need(self.temperature > 0, f"temperature must be > 0, got {self.temperature}")
        need(1 <= self.width <= 1024, f"width must be 1..1024, got {self.width}")
        need(1 <= self.embedding_dim <= 4096, f"embedding_dim must be 1..4096, got {self.embedding_dim}")
        need(0 < self.probe_test_fraction < 1, f"probe_test_fraction must be in (0, 1), got {self.probe_test_fraction}")
        need(self.probe_steps >= 1, f"probe_steps must be >= 1, got {self.probe_steps}")
        need(self.probe_lr > 0, f"probe_lr must be > 0, got {self.probe_lr}")
        need(self.probe_shots >= 1, f"probe_shots must be >= 1, got {self.probe_shots}")
        need(self.probe_draws >= 1, f"probe_draws must be >= 1, got {self.probe_draws}")
        need(self.eval_samples >= 2, f"eval_samples must be >= 2, got {self.eval_samples}")
        need(self.log_every_steps >= 1, f"log_every_steps must be >= 1, got {self.log_every_steps}")
        need(self.keep_checkpoints >= 1, f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        need(self.threads >= 0, f"threads must be >= 0, got {self.threads}")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _coerce(name: str, value: Any, default: Any, *, optional: bool) -> Any:
    """JSON types to the field's type; ints are accepted where floats are expected, nothing else."""
    if optional and value is None:
        return None
    kind = type(default) if default is not None else int
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise HparamError(f"hyperparameter {name} must be {kind.__name__}, got {value!r}")
    return value
