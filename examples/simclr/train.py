"""SimCLR-style self-supervised pretraining on class-labelled images, then probes of trained and untrained encoder.

The images are class folders of PNGs or the dataset stage's WebDataset shards (data.py, shards.py).

Run one copy per Slurm task (`srun python train.py`) or under torchrun; one process without either.
Reads hyperparameters from $PCFLOW_HPARAMS (see hparams.py), writes per-epoch checkpoints to
$PCFLOW_CHECKPOINT_DIR and resumes from the newest one, appends JSON-lines metrics to
$PCFLOW_METRICS_FILE (rank 0), saves the final encoder to $PCFLOW_RUN_DIR/model.pt; starts from the
weights of $PCFLOW_WARM_START when pcflow names an earlier run's model there. Exit status:
0 on success, 2 on bad hyperparameters or data, 1 on any other failure.
"""

from __future__ import annotations

import copy
import datetime
import math
import os
import sys
import time
import traceback
from pathlib import Path

import checkpoint
import torch
import torch.distributed as dist
from augment import resize, two_views
from data import DataError, open_dataset
from distenv import DistEnv, detect, threads_per_task
from hparams import HparamError, Hparams
from loss import global_nt_xent
from metrics import MetricsWriter
from model import SimCLR
from probe import ProbeSettings, few_label_probe, linear_probe
from torch.nn.parallel import DistributedDataParallel

#: Hyperparameters that change the checkpoint's shapes: a checkpoint made with others cannot resume.
SHAPE_HPARAMS = ("width", "embedding_dim")


class InjectedFailure(RuntimeError):
    """The failure `fail_at_epoch` asked for."""


def log(env: DistEnv, message: str, *, all_ranks: bool = False) -> None:
    if all_ranks or env.is_main:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S")
        print(f"{stamp} simclr[{env.rank}/{env.world_size}] {message}", flush=True)


def lr_at(step: int, hp: Hparams, steps_per_epoch: int) -> float:
    """Linear warm-up to hp.lr, then cosine to zero at the last step: a function of the step alone."""
    total = hp.epochs * steps_per_epoch
    warmup = round(hp.warmup_epochs * steps_per_epoch)
    if step < warmup:
        return hp.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return hp.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def view_seed(seed: int, epoch: int, rank: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919 + rank * 104_729) % (2**63)


def setup_process_group(env: DistEnv) -> torch.device:
    use_cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{env.local_rank % torch.cuda.device_count()}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if env.distributed:
        backend = "nccl" if use_cuda else "gloo"
        init = "env://" if env.launcher == "torchrun" else f"tcp://{env.master_addr}:{env.master_port}"
        log(env, f"joining {backend} process group at {init} ({env.launcher})", all_ranks=True)
        dist.init_process_group(
            backend,
            init_method=init,
            rank=env.rank,
            world_size=env.world_size,
            timeout=datetime.timedelta(minutes=10),
        )
    return device


def should_fail(hp: Hparams, epoch: int, env: DistEnv, device: torch.device) -> bool:
    """Rank 0 decides (a marker file makes `fail_once` hold across retries); every rank learns it."""
    decision = 0
    if env.is_main and hp.fail_at_epoch == epoch:
        marker = Path(os.environ.get("PCFLOW_RUN_DIR") or checkpoint_dir()) / f".failed-at-epoch-{epoch}"
        if not (hp.fail_once and marker.exists()):
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            decision = 1
    if env.distributed and hp.fail_at_epoch is not None:
        flag = torch.tensor([decision], device=device)  # NCCL only moves GPU tensors
        dist.broadcast(flag, 0)
        decision = int(flag.item())
    return bool(decision)


def checkpoint_dir() -> Path:
    return Path(os.environ.get("PCFLOW_CHECKPOINT_DIR") or Path(os.environ.get("PCFLOW_RUN_DIR", ".")) / "checkpoints")


def resume(model: SimCLR, optimizer: torch.optim.Optimizer, hp: Hparams, env: DistEnv) -> tuple[int, int]:
    """(epochs done, global step) of the newest verified checkpoint rank 0 sees, loaded on every rank."""
    chosen = [None]
    if env.is_main:  # the newest whose sidecar verifies: never a checkpoint cut short
        found = checkpoint.newest_verified(checkpoint_dir())
        chosen = [str(found) if found else None]
    if env.distributed:
        dist.broadcast_object_list(chosen, 0)
    if chosen[0] is None:
        return 0, 0
    state = checkpoint.load(chosen[0])
    for name in SHAPE_HPARAMS:
        if state["hparams"].get(name) != getattr(hp, name):
            raise HparamError(
                f"checkpoint {chosen[0]} was made with {name}={state['hparams'].get(name)}, this run asks for "
                f"{getattr(hp, name)}: use a new run directory or the same value"
            )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    log(env, f"resumed from {chosen[0]}: {state['epochs_done']} epoch(s) done, step {state['step']}")
    return int(state["epochs_done"]), int(state["step"])


def warm_start(model: SimCLR, hp: Hparams, env: DistEnv) -> int:
    """The weights of an earlier run's model, when pcflow names one in $PCFLOW_WARM_START (checked against the
    sha256 its run recorded): a model.pt's encoder, or a checkpoint's whole model; the optimizer and the
    schedule start afresh. Every rank loads the same file. Returns the number of tensors loaded (0: none)."""
    path = os.environ.get("PCFLOW_WARM_START")
    if not path:
        return 0
    state = checkpoint.load(path)  # weights only: a pickle that holds code is refused
    made_with = state.get("hparams") or {}
    for name in SHAPE_HPARAMS:
        if made_with.get(name, getattr(hp, name)) != getattr(hp, name):
            raise HparamError(
                f"warm start {path} was made with {name}={made_with[name]}, this run asks for {getattr(hp, name)}: "
                "start from a model of the same shape or set the same value"
            )
    weights = state["encoder"] if "encoder" in state else state["model"]
    (model.encoder if "encoder" in state else model).load_state_dict(weights)
    log(env, f"warm start: loaded {len(weights)} tensors from {path} ({state.get('epochs', '?')} epoch(s) trained)")
    return len(weights)


def restarted() -> bool:
    """Whether Slurm requeued this job before this attempt (a lost node, a reclaimed spot instance)."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0


@torch.no_grad()
def encode(encoder: torch.nn.Module, images: torch.Tensor, size: int, device, batch: int = 512) -> torch.Tensor:
    was_training = encoder.training
    encoder.eval()
    out = [encoder(resize(images[i : i + batch].to(device), size)).cpu() for i in range(0, len(images), batch)]
    encoder.train(was_training)
    return torch.cat(out)


def evaluate(encoder: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, hp: Hparams, device):
    """The linear probe on all training labels, and the mean few-label probe (`probe_shots` per class)."""
    features = encode(encoder, images, hp.image_size, device)
    settings = ProbeSettings(hp.probe_test_fraction, hp.probe_seed, hp.probe_steps, hp.probe_lr, hp.probe_weight_decay)
    fewshot = few_label_probe(features, labels, shots=hp.probe_shots, draws=hp.probe_draws, settings=settings)
    return linear_probe(features, labels, settings), fewshot


def run_epoch(
    epoch: int, step: int, *, ddp, optimizer, data, steps_per_epoch: int, hp: Hparams, env: DistEnv, device, metrics
) -> int:
    """One pass over this rank's share of the data; returns the global step after it."""
    per_rank = hp.batch_size // env.world_size
    generator = torch.Generator().manual_seed(view_seed(hp.seed, epoch, env.rank))
    started, loss_sum = time.perf_counter(), 0.0
    for i, batch in enumerate(data.batches(epoch, env.rank, env.world_size, per_rank, steps_per_epoch)):
        lr = lr_at(step, hp, steps_per_epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        v1, v2 = two_views(batch, hp.image_size, generator)
        z1, z2 = ddp(torch.cat([v1, v2]).to(device)).chunk(2)
        loss = global_nt_xent(z1, z2, hp.temperature)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = loss.item()
        loss_sum += value
        if i % hp.log_every_steps == 0 or i == steps_per_epoch - 1 or not math.isfinite(value):
            metrics.write("loss", value, epoch=epoch, step=step)
            metrics.write("lr", lr, epoch=epoch, step=step)
        if not math.isfinite(value):
            raise FloatingPointError(f"loss is {value} at epoch {epoch} step {step}: the run diverged, lower lr")
        step += 1
    seconds = time.perf_counter() - started
    throughput = steps_per_epoch * per_rank * env.world_size / seconds
    metrics.write("epoch_loss", loss_sum / steps_per_epoch, epoch=epoch, step=step)
    metrics.write("epoch_time", seconds, epoch=epoch, step=step)
    metrics.write("throughput", throughput, epoch=epoch, step=step)
    log(
        env,
        f"epoch {epoch + 1}/{hp.epochs}: loss {loss_sum / steps_per_epoch:.4f}, {seconds:.2f}s, "
        f"{throughput:.0f} images/s",
    )
    return step


def open_data(hp: Hparams, env: DistEnv, device):
    """The dataset, and the steps of an epoch (the same on every rank: the shares are equal)."""
    data = open_dataset(hp.data_dir, shuffle_buffer=hp.shuffle_buffer, seed=hp.seed)
    per_rank = hp.batch_size // env.world_size
    if per_rank < 2:
        raise HparamError(f"batch_size {hp.batch_size} over {env.world_size} tasks leaves fewer than 2 per task")
    steps_per_epoch = data.size // env.world_size // per_rank
    if steps_per_epoch == 0:
        raise HparamError(f"batch_size {hp.batch_size} is larger than the dataset ({data.size} images)")
    log(
        env,
        f"{data.size} images, {len(data.classes)} classes from {hp.data_dir} ({type(data).__name__}); "
        f"{env.world_size} task(s), {per_rank} images per task per step, {steps_per_epoch} steps per epoch, "
        f"{torch.get_num_threads()} thread(s) per task, device {device}",
    )
    return data, steps_per_epoch


def train(hp: Hparams, env: DistEnv) -> None:
    device = setup_process_group(env)
    torch.set_num_threads(
        threads_per_task(hp.threads, local_world_size=env.local_world_size, per_node_agent=env.launcher == "torchrun")
    )
    torch.manual_seed(hp.seed)
    metrics = MetricsWriter(os.environ.get("PCFLOW_METRICS_FILE"), enabled=env.is_main)
    data, steps_per_epoch = open_data(hp, env, device)

    model = SimCLR(hp.width, hp.embedding_dim).to(device)
    untrained = copy.deepcopy(model.encoder).cpu() if hp.probe_baseline and env.is_main else None  # the seed's init
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
    start_epoch, step = resume(model, optimizer, hp, env)
    if start_epoch and env.is_main:
        metrics.write("resumed_from_epoch", start_epoch, epoch=start_epoch, step=step)
    if (start_epoch or restarted()) and env.is_main:  # pcflow counts the steps a requeue lost from it
        metrics.write("resumed_from", step, epoch=start_epoch, step=step)
    if not start_epoch:  # a resumed attempt continues its own checkpoint, which a warm start began
        loaded = warm_start(model, hp, env)
        if loaded and env.is_main:
            metrics.write("warm_start_tensors", loaded, epoch=0, step=0)
    ddp = DistributedDataParallel(model) if env.distributed else model

    for epoch in range(start_epoch, hp.epochs):
        if should_fail(hp, epoch, env, device):
            raise InjectedFailure(f"fail_at_epoch={epoch}: failing on purpose at the start of epoch {epoch}")
        step = run_epoch(
            epoch,
            step,
            ddp=ddp,
            optimizer=optimizer,
            data=data,
            steps_per_epoch=steps_per_epoch,
            hp=hp,
            env=env,
            device=device,
            metrics=metrics,
        )
        if env.is_main:
            state = {
                "epochs_done": epoch + 1,
                "step": step,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "hparams": hp.as_dict(),
            }
            path = checkpoint.save(checkpoint_dir(), epoch + 1, state, keep=hp.keep_checkpoints)
            log(env, f"epoch {epoch + 1}/{hp.epochs} checkpointed: {path.name}")

    if env.is_main:
        evaluated = {"hp": hp, "env": env, "device": device, "metrics": metrics, "step": step}
        accuracy = report_evaluation(model.encoder, untrained, data, **evaluated)
        save_model(model, hp, data.classes, accuracy, hp.epochs)
    metrics.close()
    if env.distributed:
        dist.barrier()


def report_evaluation(encoder, untrained, data, *, hp: Hparams, env: DistEnv, device, metrics, step: int) -> float:
    """Probes of the trained encoder and, beside them, of the untrained one; returns probe_accuracy."""
    images, labels = data.eval_set(hp.eval_samples)
    epoch = hp.epochs - 1
    result, fewshot = evaluate(encoder, images, labels, hp, device)
    metrics.write("probe_accuracy", result.accuracy, epoch=epoch, step=step, split="eval")
    metrics.write("probe_train_accuracy", result.train_accuracy, epoch=epoch, step=step, split="eval")
    metrics.write("probe_loss", result.loss, epoch=epoch, step=step, split="eval")
    metrics.write("fewshot_accuracy", fewshot, epoch=epoch, step=step, split="eval")
    chance = 1 / len(data.classes)
    log(
        env,
        f"linear probe: accuracy {result.accuracy:.4f} on {result.n_test} held-out images "
        f"(train {result.train_accuracy:.4f} on {result.n_train}); few-label probe ({hp.probe_shots} per class): "
        f"{fewshot:.4f}; chance is {chance:.2f}",
    )
    if untrained is not None:
        base, base_fewshot = evaluate(untrained.to(device), images, labels, hp, device)
        metrics.write("probe_accuracy_untrained", base.accuracy, epoch=epoch, step=step, split="eval")
        metrics.write("fewshot_accuracy_untrained", base_fewshot, epoch=epoch, step=step, split="eval")
        log(env, f"untrained encoder (same init): linear probe {base.accuracy:.4f}, few labels {base_fewshot:.4f}")
    return result.accuracy


def save_model(model: SimCLR, hp: Hparams, classes: list[str], accuracy: float, epochs: int) -> Path:
    run_dir = Path(os.environ.get("PCFLOW_RUN_DIR") or ".")
    run_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / "model.pt"
    tmp = run_dir / f".model.pt.tmp-{os.getpid()}"
    torch.save(
        {
            "encoder": model.encoder.state_dict(),
            "feature_dim": model.encoder.feature_dim,
            "hparams": hp.as_dict(),
            "classes": classes,
            "epochs": epochs,
            "probe_accuracy": accuracy,
        },
        tmp,
    )
    os.replace(tmp, final)
    return final


def main() -> int:
    env = detect()
    try:
        hp = Hparams.from_env()
        train(hp, env)
    except (HparamError, DataError) as exc:
        log(env, f"error: {exc}", all_ranks=True)
        return 2
    except Exception:
        log(env, f"failed:\n{traceback.format_exc()}", all_ranks=True)
        return 1
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    log(env, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
