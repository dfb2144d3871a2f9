"""Checks of the payload's pure parts, run by the payload venv's python (the Airflow venv has no torch).

`python payload_checks.py [name ...]` runs every `check_*` function (or the named ones) and prints one
JSON object: {check name: null when it passed, else the traceback}. test_payload_units.py drives it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import tempfile
import traceback
from pathlib import Path

SIMCLR = Path(__file__).resolve().parents[2] / "examples" / "simclr"
sys.path.insert(0, str(SIMCLR))

import torch  # noqa: E402


def check_augment_keeps_shape_range_and_seed():
    from augment import augment, resize, two_views

    images = torch.rand(16, 1, 8, 8)
    out = augment(images, 16, torch.Generator().manual_seed(1))
    assert out.shape == (16, 1, 16, 16), out.shape
    assert out.min() >= 0 and out.max() <= 1
    again = augment(images, 16, torch.Generator().manual_seed(1))
    assert torch.equal(out, again), "same generator seed, different views"
    v1, v2 = two_views(images, 12, torch.Generator().manual_seed(2))
    assert v1.shape == v2.shape == (16, 1, 12, 12)
    assert not torch.allclose(v1, v2), "the two views of a pair are identical"
    assert resize(images, 8).sub(images).abs().max() < 1e-5, "identity resize changed the image"


def check_nt_xent_known_case():
    from loss import nt_xent

    # Two orthogonal images, each view equal to its pair, temperature 1: for every row the positive
    # scores 1 and the two others 0, so the loss is -log(e / (e + 2)) = log(e + 2) - 1.
    z = torch.eye(2)
    got = nt_xent(z, z.clone(), temperature=1.0).item()
    assert math.isclose(got, math.log(math.e + 2) - 1, rel_tol=1e-6), got

    # Against a plain loop on random embeddings.
    g = torch.Generator().manual_seed(0)
    z1, z2, t = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g), 0.3
    z = torch.nn.functional.normalize(torch.cat([z1, z2]), dim=1)
    total = 0.0
    for i in range(10):
        positive = (i + 5) % 10
        denom = sum(math.exp(float(z[i] @ z[k]) / t) for k in range(10) if k != i)
        total += -math.log(math.exp(float(z[i] @ z[positive]) / t) / denom)
    assert math.isclose(nt_xent(z1, z2, t).item(), total / 10, rel_tol=1e-5)
    # Aligned pairs score better than mismatched ones.
    assert nt_xent(z1, z1 + 0.01, t) < nt_xent(z1, z2, t)


def check_checkpoint_round_trip_prune_and_fallback():
    import checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        assert checkpoint.load_latest(tmp) is None
        model = torch.nn.Linear(3, 2)
        for done in (1, 2, 3):
            checkpoint.save(tmp, done, {"epochs_done": done, "model": model.state_dict()}, keep=2)
        names = sorted(os.listdir(tmp))
        # pruned with their sidecars, no temporary files left
        assert names == [f"epoch-000{n}.pt{s}" for n in (2, 3) for s in ("", ".sha256.json")], names
        path, state = checkpoint.load_latest(tmp)
        assert path.name == "epoch-0003.pt" and state["epochs_done"] == 3
        restored = torch.nn.Linear(3, 2)
        restored.load_state_dict(state["model"])
        assert torch.equal(restored.weight, model.weight)
        (Path(tmp) / "epoch-0004.pt").write_bytes(b"torn")  # a damaged newest file, without its sidecar
        path, state = checkpoint.load_latest(tmp)
        assert path.name == "epoch-0003.pt", path


def check_a_truncated_checkpoint_is_never_resumed_from():
    """A newest checkpoint cut short (a job killed while the file was copied or restored, whatever wrote it)
    whose sidecar names the whole file's size and sha256: passed over for the one before, which verifies.
    Without the sidecar check the cut file is the newest, and torch.load of a zip cut past its first members
    can still fail late or not at all."""
    import checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        model = torch.nn.Linear(64, 64)
        for done in (1, 2):
            checkpoint.save(tmp, done, {"epochs_done": done, "model": model.state_dict()}, keep=3)
        newest = Path(tmp) / "epoch-0002.pt"
        whole = newest.read_bytes()
        newest.write_bytes(whole[: len(whole) // 2])  # the sidecar still says the whole size and sha256
        assert checkpoint.newest_verified(tmp).name == "epoch-0001.pt"
        path, state = checkpoint.load_latest(tmp)
        assert (path.name, state["epochs_done"]) == ("epoch-0001.pt", 1)
        newest.write_bytes(whole[:-1] + bytes([whole[-1] ^ 1]))  # same size, one bit changed
        assert "sha256" in checkpoint.unverified(newest)
        assert checkpoint.newest_verified(tmp).name == "epoch-0001.pt"
        newest.write_bytes(whole)  # the bytes back: it verifies again
        assert checkpoint.newest_verified(tmp).name == "epoch-0002.pt"
        checkpoint.sidecar_for(newest).unlink()  # killed between the checkpoint's rename and its sidecar's
        assert "no epoch-0002.pt.sha256.json" in checkpoint.unverified(newest)
        assert checkpoint.newest_verified(tmp).name == "epoch-0001.pt"


def check_metrics_line_format():
    from metrics import MetricsWriter, metric_line

    record = json.loads(metric_line("loss", torch.tensor(1.5).item(), epoch=2, step=17, split="train", now=12.5))
    assert record == {"time": 12.5, "epoch": 2, "step": 17, "name": "loss", "value": 1.5, "split": "train"}
    assert list(record) == ["time", "epoch", "step", "name", "value", "split"]
    try:
        metric_line("loss", 1.0, epoch=0, step=0, split="test")
    except ValueError:
        pass
    else:
        raise AssertionError("accepted split 'test'")
    diverged = json.loads(metric_line("loss", float("nan"), epoch=0, step=3, split="train"))
    assert math.isnan(diverged["value"])  # written as NaN: the metrics stage reads divergence from it
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.jsonl"
        for attempt in range(2):  # a requeued attempt appends
            writer = MetricsWriter(path)
            writer.write("probe_accuracy", 0.9, epoch=attempt, step=3, split="eval")
            writer.close()
        MetricsWriter(path, enabled=False).write("loss", 1.0, epoch=0, step=0)  # ranks > 0 write nothing
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert [(r["epoch"], r["name"], r["split"]) for r in lines] == [
            (0, "probe_accuracy", "eval"),
            (1, "probe_accuracy", "eval"),
        ]
        assert all(isinstance(r["time"], float) and isinstance(r["value"], float) for r in lines)


def check_hparams_defaults_types_and_unknown_names():
    from hparams import HparamError, Hparams

    hp = Hparams.from_dict({"data_dir": "/d", "epochs": 2, "lr": 1, "fail_at_epoch": None})
    assert hp.epochs == 2 and hp.lr == 1.0 and isinstance(hp.lr, float) and hp.fail_at_epoch is None
    for bad in (
        {"data_dir": "/d", "epochs": "2"},
        {"data_dir": "/d", "epoch": 2},
        {"epochs": 2},
        {"data_dir": "/d", "temperature": 0},
    ):
        try:
            Hparams.from_dict(bad)
        except HparamError:
            continue
        raise AssertionError(f"accepted {bad}")


def check_distenv_from_slurm_torchrun_and_alone():
    from distenv import detect, rendezvous_port, threads_per_task

    slurm = {
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_ID": "12345",
        "SLURM_JOB_NODELIST": "node[3-4]",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_CPUS_PER_TASK": "3",
    }
    env = detect(slurm, expand=lambda nodes: ["node3", "node4"] if nodes == "node[3-4]" else [])
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size) == ("slurm", 1, 4, 1, 2)
    assert env.master_addr == "node3" and env.master_port == rendezvous_port("12345") != rendezvous_port("12346")
    assert 1024 < env.master_port < 32768
    assert threads_per_task(0, slurm) == 3 and threads_per_task(5, slurm) == 5
    assert threads_per_task(0, {"SLURM_CPUS_PER_TASK": "8"}, local_world_size=4, per_node_agent=True) == 2
    assert detect({**slurm, "MASTER_ADDR": "h", "MASTER_PORT": "999"}).master_addr == "h"

    torchrun = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "a",
        "MASTER_PORT": "29400",
        **slurm,
    }
    env = detect(torchrun)
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.master_port) == ("torchrun", 3, 8, 1, 29400)
    assert detect({}).launcher == "single" and not detect({}).distributed

    # An Open MPI rank inherits the Slurm variables of mpirun's (or orted's) step: OMPI's win, and the
    # rendezvous is at the job's first node, not the step's.
    ompi = {
        "OMPI_COMM_WORLD_RANK": "2",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        **slurm,
        "SLURM_PROCID": "0",
        "SLURM_STEP_NODELIST": "node4",
    }
    env = detect(ompi, expand=lambda nodes: ["node3", "node4"] if nodes == "node[3-4]" else [])
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size) == ("mpirun", 2, 4, 0, 2)
    assert (env.master_addr, env.master_port) == ("node3", rendezvous_port("12345"))


def check_lr_schedule_warms_up_then_decays_to_zero():
    from hparams import Hparams
    from train import lr_at

    hp = Hparams.from_dict({"data_dir": "/d", "epochs": 4, "lr": 0.1, "warmup_epochs": 1})
    lrs = [lr_at(step, hp, 10) for step in range(40)]
    assert lrs[0] == 0.01 and math.isclose(lrs[9], 0.1) and max(lrs) <= 0.1
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:])) and lrs[-1] < 0.001


def check_probe_separates_separable_features():
    from probe import ProbeSettings, linear_probe, stratified_split

    labels = torch.arange(10).repeat(30)
    features = (
        torch.nn.functional.one_hot(labels, 10).float() * 3
        + torch.randn(300, 10, generator=torch.Generator().manual_seed(0)) * 0.3
    )
    result = linear_probe(features, labels, ProbeSettings(steps=100))
    assert result.accuracy == 1.0 and result.n_test == 90 and result.n_train == 210, result
    noise = linear_probe(
        torch.randn(300, 10, generator=torch.Generator().manual_seed(1)), labels, ProbeSettings(steps=100)
    )
    assert noise.accuracy < 0.35, noise  # chance is 0.1: the probe does not invent signal
    a, b = stratified_split(labels, 0.3, seed=4), stratified_split(labels, 0.3, seed=4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not set(a[0].tolist()) & set(a[1].tolist())


def check_image_folder_loader():
    import numpy as np
    from data import DataError, load_image_folder
    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        for label in ("10", "2"):
            (Path(tmp) / label).mkdir()
            for i in range(3):
                Image.fromarray(np.full((8, 8), 255 * i // 2, dtype=np.uint8), mode="L").save(
                    Path(tmp) / label / f"{i}.png"
                )
        images, labels, classes = load_image_folder(tmp)
        assert classes == ["2", "10"] and images.shape == (6, 1, 8, 8) and labels.tolist() == [0, 0, 0, 1, 1, 1]
        assert images.min() == 0 and images.max() == 1
        try:
            load_image_folder(Path(tmp) / "missing")
        except DataError:
            return
        raise AssertionError("a missing data_dir was accepted")


def check_few_label_probe_separates_separable_features():
    from probe import few_label_probe

    labels = torch.arange(10).repeat(30)
    noise = torch.randn(300, 10, generator=torch.Generator().manual_seed(0))
    assert few_label_probe(torch.nn.functional.one_hot(labels, 10) * 3.0 + noise * 0.3, labels, shots=2) == 1.0
    assert few_label_probe(noise, labels, shots=2, draws=3) < 0.35  # chance is 0.1


def _png(value: int, size: int = 6) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((size, size), value, dtype=np.uint8), mode="L").save(buf, format="PNG")
    return buf.getvalue()


def write_partition(folders: Path, dest: Path, target_bytes: int) -> dict:
    """Shards of `folders` into `dest`, with their manifest, by the dataset stage's own shard writer."""
    sys.path.insert(0, str(SIMCLR.parents[1] / "plugins"))
    from pcflow.dataset.manifest import build_manifest
    from pcflow.dataset.shard import group_samples, plan_shards, write_shard
    from pcflow.dataset.sources import LocalDirectorySource

    src = LocalDirectorySource(str(folders))
    samples, classes = group_samples(src.list())
    objects = []
    for index, members in enumerate(plan_shards(samples, target_bytes=target_bytes, seed=0)):
        with open(dest / f"shard-{index:03d}.tar", "wb") as out:
            sha, size = write_shard(src, members, out)
        objects.append({"key": f"shard-{index:03d}.tar", "size": size, "sha256": sha, "samples": len(members)})
    manifest = build_manifest(
        mode="shard",
        bucket="b",
        root="p/",
        partition="p",
        source_uri=src.uri,
        objects=objects,
        extra={"classes": classes},
    )
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def check_shards_read_as_the_same_labelled_images_as_their_folders():
    """Class names that sort differently as text and as numbers ("10" < "2"): the shard writer's `.cls`
    is an index into the manifest's sorted names, the folder reader sorts numerically; the payload gives
    every image the same class name either way."""
    from data import DataError, ImageFolderDataset, open_dataset
    from shards import ShardDataset

    with tempfile.TemporaryDirectory() as tmp:
        folders, parted = Path(tmp, "folders"), Path(tmp, "shards")
        parted.mkdir()
        for i in range(60):
            cls = ("2", "10", "cat")[i % 3]
            (folders / cls).mkdir(parents=True, exist_ok=True)
            (folders / cls / f"{i:03d}.png").write_bytes(_png(4 * i))
        manifest = write_partition(folders, parted, target_bytes=8_000)
        assert len(manifest["objects"]) > 3, "several shards"
        folder, shards = open_dataset(str(folders)), open_dataset(str(parted))
        assert isinstance(folder, ImageFolderDataset) and isinstance(shards, ShardDataset) and shards.size == 60

        def named(dataset):
            images, labels = dataset.eval_set(1000)
            pairs = zip(images, labels, strict=True)
            return sorted((round(float(x.mean()) * 255), dataset.classes[y]) for x, y in pairs)

        assert named(folder) == named(shards) == sorted((4 * i, ("2", "10", "cat")[i % 3]) for i in range(60))
        assert shards.eval_set(7)[0].shape == (7, 1, 6, 6)
        (parted / "manifest.json").unlink()
        try:
            open_dataset(str(parted))
        except DataError as exc:
            assert "no manifest.json" in str(exc), exc
        else:
            raise AssertionError("shards without their manifest were read")


def check_shard_shares_are_equal_disjoint_and_seeded():
    """Each epoch, every rank gets the same number of samples, no sample twice; same seed, same shares."""
    from shards import Shard, ShardDataset

    manifest = {
        "mode": "shard",
        "classes": ["a"],
        "objects": [{"key": f"s{i}", "samples": n} for i, n in enumerate([7, 1, 30, 12, 5])],
    }
    data = ShardDataset("/d", manifest, seed=3)
    for world in (1, 2, 3, 4):
        count = data.size // world
        for epoch in range(3):
            seen = []
            for rank in range(world):
                pieces = data.share(epoch, rank, world, count)
                assert sum(p.take for p in pieces) == count
                seen += [(p.shard.url, p.skip + k) for p in pieces for k in range(p.take)]
                assert all(0 <= p.skip and p.skip + p.take <= p.shard.samples for p in pieces)
            assert len(seen) == len(set(seen)) == world * count, (world, epoch)
    assert data.share(1, 1, 2, 20) == ShardDataset("/d", manifest, seed=3).share(1, 1, 2, 20)
    assert data.share(1, 1, 2, 20) != data.share(2, 1, 2, 20) != ShardDataset("/d", manifest, seed=4).share(2, 1, 2, 20)
    one = ShardDataset("/d", {**manifest, "objects": [{"key": "only", "samples": 100}]})
    assert len({one.share(e, 0, 2, 50)[-1].skip for e in range(5)}) > 1, "one shard: split anew every epoch"
    assert isinstance(one.shards[0], Shard) and one.shards[0].url == "/d/only"


def check_shard_batches_stream_each_rank_its_share():
    from data import open_dataset

    with tempfile.TemporaryDirectory() as tmp:
        folders, parted = Path(tmp, "folders"), Path(tmp, "shards")
        parted.mkdir()
        for i in range(50):
            (folders / str(i % 2)).mkdir(parents=True, exist_ok=True)
            (folders / str(i % 2) / f"{i:03d}.png").write_bytes(_png(5 * i))
        write_partition(folders, parted, target_bytes=6_000)
        data = open_dataset(str(parted), shuffle_buffer=8, seed=1)
        ranks = [list(data.batches(0, rank, 2, 4, 6)) for rank in range(2)]
        assert [len(r) for r in ranks] == [6, 6] and all(b.shape == (4, 1, 6, 6) for r in ranks for b in r)
        values = [round(float(x.mean()) * 255) for r in ranks for b in r for x in b]
        assert len(set(values)) == 48, "ranks read disjoint shares"
        again = [round(float(x.mean()) * 255) for b in data.batches(0, 0, 2, 4, 6) for x in b]
        assert again == values[:24], "same seed, same batches"


def _ddp_worker(rank: int, job: tuple) -> None:
    world, port, z1, z2, out = job
    import torch.distributed as dist
    from loss import global_nt_xent

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    n = z1.shape[0] // world
    a = z1[rank * n : (rank + 1) * n].clone().requires_grad_()
    b = z2[rank * n : (rank + 1) * n].clone().requires_grad_()
    loss = global_nt_xent(a, b, 0.5)
    loss.backward()
    # What DDP does to parameter gradients: the mean over ranks.
    torch.save({"loss": loss.detach(), "ga": a.grad / world, "gb": b.grad / world}, f"{out}.{rank}")
    dist.destroy_process_group()


def check_gathered_loss_and_gradients_equal_single_process():
    import socket

    import torch.multiprocessing as mp
    from loss import nt_xent

    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
    a, b = z1.clone().requires_grad_(), z2.clone().requires_grad_()
    expected = nt_xent(a, b, 0.5)
    expected.backward()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_ddp_worker, args=((2, port, z1, z2, f"{tmp}/r"),), nprocs=2, join=True)
        parts = [torch.load(f"{tmp}/r.{r}") for r in range(2)]
    for part in parts:
        assert torch.allclose(part["loss"], expected.detach(), atol=1e-6), (part["loss"], expected)
    assert torch.allclose(torch.cat([p["ga"] for p in parts]), a.grad, atol=1e-6)
    assert torch.allclose(torch.cat([p["gb"] for p in parts]), b.grad, atol=1e-6)


def _ddp_step_worker(rank: int, job: tuple) -> None:
    import torch.distributed as dist
    from loss import global_nt_xent
    from model import SimCLR
    from torch.nn.parallel import DistributedDataParallel

    rendezvous, v1, v2, out = job
    torch.set_num_threads(1)
    # a file, not a free port picked in advance: another test's server could take the port before rank 0 binds it
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = SimCLR(width=8, embedding_dim=16)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    half = slice(rank * len(v1) // 2, (rank + 1) * len(v1) // 2)
    for _ in range(2):
        z1, z2 = ddp(torch.cat([v1[half], v2[half]])).chunk(2)
        loss = global_nt_xent(z1, z2, 0.2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), f"{out}.{rank}")
    dist.barrier()  # neither rank tears its gloo threads down while the other still talks to it (SIGABRT)
    dist.destroy_process_group()


def check_ddp_training_steps_equal_single_process_steps():
    """Two DDP ranks, each with half of a batch, end where one process with the whole batch ends."""
    import torch.multiprocessing as mp
    from augment import two_views
    from loss import nt_xent
    from model import SimCLR

    g = torch.Generator().manual_seed(0)
    v1, v2 = two_views(torch.rand(32, 1, 8, 8, generator=g), 12, g)
    torch.manual_seed(0)
    model = SimCLR(width=8, embedding_dim=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(2):
        z1, z2 = model(torch.cat([v1, v2])).chunk(2)
        loss = nt_xent(z1, z2, 0.2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_ddp_step_worker, args=((f"{tmp}/rendezvous", v1, v2, f"{tmp}/r"),), nprocs=2, join=True)
        ranks = [torch.load(f"{tmp}/r.{r}") for r in range(2)]
    for name, value in model.state_dict().items():
        for state in ranks:
            assert torch.allclose(state[name], value, atol=1e-5), name


def main(names: list[str]) -> int:
    checks = {name: fn for name, fn in globals().items() if name.startswith("check_") and callable(fn)}
    results = {}
    for name in names or checks:
        try:
            checks[name]()
            results[name] = None
        except Exception:
            results[name] = traceback.format_exc()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
