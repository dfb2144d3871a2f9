"""Supervised image classification with a bottleneck ResNet on WebDataset shards, data-parallel.

Run one copy per Slurm task (`srun python train.py`), under torchrun, or as one process. Reads the
hyperparameters from $PCFLOW_HPARAMS (hparams.schema.json), the shards from their `data_dir`; appends
metrics to $PCFLOW_METRICS_FILE (rank 0), checkpoints every epoch to $PCFLOW_CHECKPOINT_DIR and resumes
from the newest, and leaves the model in $PCFLOW_RUN_DIR/model.pt. Exit status: 0 success, 2 bad
hyperparameters or data (retrying will not help), 1 anything else.
"""

from __future__ import annotations

import datetime
import math
import os
import sys
import time
import traceback
from itertools import islice

import checkpoints
import dist
import torch
import torch.distributed as torch_dist
from hparams import HparamError, from_env
from metrics import Metrics
from resnet import build
from shards import DataError, ShardStream, normalize, open_partition
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

#: What a checkpoint must share with the run that resumes it (the shapes of the weights).
ARCH = ("depth", "width", "stem")


def log(place: dist.Place, message: str) -> None:
    """A timestamped line from rank 0 (the job's log, which pcflow shows with the run)."""
    if place.main:
        print(
            f"{datetime.datetime.now(datetime.UTC):%H:%M:%S} resnet[{place.rank}/{place.world}] {message}", flush=True
        )


def lr_at(step: int, hp, steps_per_epoch: int) -> float:
    """Linear warm-up to hp.lr, then cosine to zero at the last step."""
    total, warmup = hp.epochs * steps_per_epoch, round(hp.warmup_epochs * steps_per_epoch)
    if step < warmup:
        return hp.lr * (step + 1) / warmup
    return hp.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def optimizer_for(model: torch.nn.Module, hp) -> torch.optim.Optimizer:
    """Weight decay on the weights of convolutions and the classifier, not on BatchNorm or biases."""
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": hp.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    if hp.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=hp.lr)
    return torch.optim.SGD(groups, lr=hp.lr, momentum=0.9, nesterov=True)


def loader(partition, hp, place: dist.Place, *, train: bool, epoch: int, batch: int, device) -> DataLoader:
    """A DataLoader over this process's share of a split (`loader_workers` decoding processes)."""
    stream = ShardStream(partition, hp, train=train, epoch=epoch, rank=place.rank, world=place.world)
    workers = hp.loader_workers
    return DataLoader(stream, batch_size=batch, num_workers=workers, pin_memory=device.type == "cuda")


def resume(model, optimizer, hp, place: dist.Place) -> tuple[int, int]:
    """(epochs done, step) of the newest checkpoint; every process loads the same one (rank 0 picks)."""
    chosen = [None]
    if place.main:
        chosen = [checkpoints.latest()]  # verified against its sidecar: never one cut short
    if place.world > 1:
        torch_dist.broadcast_object_list(chosen, 0)
    if chosen[0] is None:
        return 0, 0
    state = torch.load(chosen[0], map_location="cpu", weights_only=True)
    for name in ARCH:
        if state["hparams"][name] != getattr(hp, name):
            raise HparamError(
                f"checkpoint {chosen[0]} has {name}={state['hparams'][name]}, this run {getattr(hp, name)}"
            )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    log(place, f"resumed from {chosen[0]}: {state['epochs_done']} epoch(s) done")
    return int(state["epochs_done"]), int(state["step"])


def warm_start(model, hp, place: dist.Place) -> int:
    """The weights of an earlier run's model.pt or checkpoint, when pcflow names one in $PCFLOW_WARM_START
    (checked against the sha256 its run recorded); optimizer and schedule start afresh. Returns the number of
    tensors loaded (0: none)."""
    path = os.environ.get("PCFLOW_WARM_START")
    if not path:
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)  # weights only: no pickled code
    for name in ARCH:
        if state["hparams"].get(name) != getattr(hp, name):
            raise HparamError(
                f"warm start {path} has {name}={state['hparams'].get(name)}, this run {getattr(hp, name)}"
            )
    model.load_state_dict(state["model"])
    log(place, f"warm start: loaded {len(state['model'])} tensors from {path}")
    return len(state["model"])


def train_epoch(epoch: int, step: int, run: dict, metrics: Metrics) -> tuple[int, float, float]:
    """One epoch of `steps` batches on every process; returns (step after it, mean loss, accuracy)."""
    hp, place, device, model, optimizer = run["hp"], run["place"], run["device"], run["ddp"], run["optimizer"]
    model.train()
    batches = loader(run["partition"], hp, place, train=True, epoch=epoch, batch=run["per_rank"], device=device)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=hp.label_smoothing)
    loss_sum = correct = seen = 0.0
    for i, (raw_images, raw_labels) in enumerate(islice(batches, run["steps"])):
        lr = lr_at(step, hp, run["steps"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        images = normalize(raw_images.to(device, non_blocking=True))
        labels = raw_labels.to(device, non_blocking=True)
        if run["channels_last"]:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=run["amp"]):
            logits = model(images)
            loss = criterion(logits.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = loss.item()
        if not math.isfinite(value):
            metrics.write("loss", value, epoch=epoch, step=step)
            raise FloatingPointError(f"loss is {value} at epoch {epoch} step {step}: the run diverged, lower lr")
        loss_sum, seen = loss_sum + value * len(labels), seen + len(labels)
        correct += (logits.argmax(1) == labels).sum().item()
        if i % hp.log_every_steps == 0 or i == run["steps"] - 1:
            metrics.write("loss", value, epoch=epoch, step=step)
            metrics.write("lr", lr, epoch=epoch, step=step)
        step += 1
    loss_sum, correct, seen = dist.all_sum([loss_sum, correct, seen], place, device)
    return step, loss_sum / seen, correct / seen


@torch.no_grad()
def evaluate(run: dict) -> dict[str, float]:
    """Top-1 and top-5 accuracy and the loss on the held-out samples, over all processes."""
    hp, place, device, model = run["hp"], run["place"], run["device"], run["model"]  # not DDP: no collectives
    model.eval()
    batches = loader(run["partition"], hp, place, train=False, epoch=0, batch=2 * run["per_rank"], device=device)
    top1 = top5 = loss_sum = seen = 0.0
    k = min(5, len(run["partition"].classes))
    for raw_images, raw_labels in batches:
        images, labels = normalize(raw_images.to(device)), raw_labels.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=run["amp"]):
            logits = model(images).float()
        loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
        top1 += (logits.argmax(1) == labels).sum().item()
        top5 += (logits.topk(k, 1).indices == labels[:, None]).any(1).sum().item()
        seen += len(labels)
    top1, top5, loss_sum, seen = dist.all_sum([top1, top5, loss_sum, seen], place, device)
    if not seen:
        raise DataError(f"no held-out samples (val_fraction {hp.val_fraction}): raise it")
    return {"accuracy": top1 / seen, f"top{k}_accuracy": top5 / seen, "val_loss": loss_sum / seen}


def setup(hp, place: dist.Place) -> dict:
    """The data, the model, its optimizer, resumed from the newest checkpoint: what every epoch uses."""
    device = dist.start(place)
    torch.set_num_threads(dist.threads(hp.threads, place))
    torch.manual_seed(hp.seed)
    partition = open_partition(hp.data_dir)
    if hp.batch_size % place.world:
        raise HparamError(f"batch_size {hp.batch_size} is not a multiple of the {place.world} processes")
    steps = int(partition.size * (1 - hp.val_fraction)) // hp.batch_size
    if steps == 0:
        raise HparamError(f"batch_size {hp.batch_size} is larger than the training split (~{partition.size} samples)")
    cuda = device.type == "cuda"
    model = build(hp, len(partition.classes)).to(device)
    if cuda and hp.amp:
        model = model.to(memory_format=torch.channels_last)
    optimizer = optimizer_for(model, hp)
    start_epoch, step = resume(model, optimizer, hp, place)
    warm = 0 if start_epoch else warm_start(model, hp, place)  # a resumed attempt continues its checkpoint
    ddp = DistributedDataParallel(model) if place.world > 1 else model
    params = sum(p.numel() for p in model.parameters())
    log(
        place,
        f"ResNet-{hp.depth} width {hp.width} ({params / 1e6:.2f} M parameters), {len(partition.classes)} classes, "
        f"{partition.size} samples in {len(partition.shards)} shard(s); {place.world} process(es) on {device}, "
        f"{hp.batch_size // place.world} images each per step, {steps} steps per epoch",
    )
    run = {"hp": hp, "place": place, "device": device, "partition": partition, "model": model, "ddp": ddp}
    run.update(optimizer=optimizer, steps=steps, per_rank=hp.batch_size // place.world, amp=cuda and hp.amp)
    return {**run, "channels_last": cuda and hp.amp, "start": (start_epoch, step), "params": params, "warm": warm}


def train(hp, place: dist.Place) -> None:
    """Every epoch from the newest checkpoint on, each evaluated and checkpointed, then model.pt."""
    run = setup(hp, place)
    metrics = Metrics(os.environ.get("PCFLOW_METRICS_FILE"), enabled=place.main)
    start_epoch, step = run["start"]
    if start_epoch:
        metrics.write("resumed_from_epoch", start_epoch, epoch=start_epoch, step=step)
    if start_epoch or int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0:  # pcflow counts the steps a requeue lost
        metrics.write("resumed_from", step, epoch=start_epoch, step=step)
    if run["warm"]:
        metrics.write("warm_start_tensors", run["warm"], epoch=0, step=0)
    scores: dict[str, float] = {}
    for epoch in range(start_epoch, hp.epochs):
        started = time.perf_counter()
        step, loss, accuracy = train_epoch(epoch, step, run, metrics)
        seconds = time.perf_counter() - started
        scores = evaluate(run)
        for name, value in {"epoch_loss": loss, "train_accuracy": accuracy, "epoch_time": seconds}.items():
            metrics.write(name, value, epoch=epoch, step=step)
        metrics.write("throughput", run["steps"] * hp.batch_size / seconds, epoch=epoch, step=step)
        for name, value in scores.items():
            metrics.write(name, value, epoch=epoch, step=step, split="eval")
        log(
            place,
            f"epoch {epoch + 1}/{hp.epochs}: loss {loss:.4f}, train {accuracy:.3f}, "
            + ", ".join(f"{name} {value:.4f}" for name, value in scores.items())
            + f", {seconds:.1f} s",
        )
        if place.main:
            state = {"epochs_done": epoch + 1, "step": step, "hparams": vars(hp)}
            checkpoints.save(
                epoch + 1,
                {**state, "model": run["model"].state_dict(), "optimizer": run["optimizer"].state_dict()},
                hp.keep_checkpoints,
            )
    if not scores:  # resumed after the last epoch: every process evaluates (the sums are collective)
        scores = evaluate(run)
    if place.main:
        arch = {"depth": hp.depth, "width": hp.width, "stem": hp.stem, "num_classes": len(run["partition"].classes)}
        checkpoints.save_model(
            {
                "model": run["model"].state_dict(),
                "arch": arch,
                "classes": run["partition"].classes,
                "hparams": vars(hp),
                "epochs": hp.epochs,
                **scores,
            }
        )
    metrics.close()
    if place.world > 1:
        torch_dist.barrier()


def main() -> int:
    """Run the training; map what went wrong to the exit status pcflow reads (2: do not retry)."""
    place = dist.detect()
    try:
        train(from_env(), place)
    except (HparamError, DataError) as exc:
        print(f"resnet[{place.rank}] error: {exc}", flush=True)
        return 2
    except Exception:
        print(f"resnet[{place.rank}] failed:\n{traceback.format_exc()}", flush=True)
        return 1
    finally:
        if torch_dist.is_available() and torch_dist.is_initialized():
            torch_dist.destroy_process_group()
    log(place, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
