"""examples/resnet trained for real: its train.py in the payload environment (torch, webdataset, Pillow:
what its requirements.txt pins) on the digits as pcflow's shard writer packs them, one process and two
(DDP under torchrun, then resumed from its checkpoint); its hyperparameter schema refusing bad values."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
from example_shards import digits_partition

REPO = Path(__file__).resolve().parents[2]
PROJECT = REPO / "examples" / "resnet"
PAYLOAD_PYTHON = REPO / ".venv-payload" / "bin" / "python"
#: What every metrics line holds (include/payloads/README.md, "Metrics").
LINE_KEYS = {"time", "epoch", "step", "name", "value", "split"}
#: What model.pt holds, read back by the payload environment's torch.
READ_MODEL = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from resnet import ResNet
state = torch.load(sys.argv[2], map_location="cpu", weights_only=True)
model = ResNet(**state["arch"])
model.load_state_dict(state["model"])
print(json.dumps({"keys": sorted(state), "classes": state["classes"], "accuracy": state["accuracy"]}))
"""


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """The digits in several shards (so two processes read different ones), with their manifest."""
    return digits_partition(tmp_path_factory.mktemp("digits") / "partition")


def local_hparams(data_dir: Path, **changes) -> dict:
    """The hyperparameters `make example` sends on the local profile (pcflow-runs.json), for `data_dir`."""
    runs = json.loads((PROJECT / "pcflow-runs.json").read_text())
    return {**runs["local"]["training"]["hyperparameters"], "data_dir": str(data_dir), "threads": 1, **changes}


def run_train(
    run_dir: Path, hparams: dict, *, launcher: list[str] | None = None, warm_start: Path | None = None
) -> subprocess.CompletedProcess:
    """train.py as a pcflow job runs it: the contract's variables, the run directory as working directory."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "hparams.json").write_text(json.dumps(hparams))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PCFLOW_", "RANK", "WORLD_SIZE"))},
        "PCFLOW_HPARAMS": str(run_dir / "hparams.json"),
        "PCFLOW_RUN_DIR": str(run_dir),
        "PCFLOW_METRICS_FILE": str(run_dir / "metrics.jsonl"),
        "PCFLOW_CHECKPOINT_DIR": str(run_dir / "checkpoints"),
        **({"PCFLOW_WARM_START": str(warm_start)} if warm_start else {}),
    }
    argv = [*(launcher or [str(PAYLOAD_PYTHON)]), str(PROJECT / "train.py")]
    return subprocess.run(argv, cwd=run_dir, env=env, capture_output=True, text=True, timeout=600, check=False)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def last(lines: list[dict], name: str) -> dict:
    return [line for line in lines if line["name"] == name][-1]


@pytest.mark.slow
def test_resnet_learns_the_digits_from_shards_and_leaves_the_contracts_outputs(shards: Path, tmp_path: Path):
    done = run_train(tmp_path / "run", local_hparams(shards, epochs=3))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ResNet-14 width 8 (0.13 M parameters), 10 classes, 1797 samples in" in done.stdout
    lines = metrics(tmp_path / "run")
    assert all(set(line) == LINE_KEYS for line in lines)
    accuracy = last(lines, "accuracy")
    assert accuracy["split"] == "eval" and accuracy["epoch"] == 2
    assert accuracy["value"] > 0.5, f"held-out accuracy {accuracy['value']} (chance 0.1)"
    assert [line["epoch"] for line in lines if line["name"] == "accuracy"] == [0, 1, 2]
    assert last(lines, "epoch_loss")["value"] < next(x for x in lines if x["name"] == "epoch_loss")["value"]
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    kept = [f"epoch-000{n}.pt{sidecar}" for n in (2, 3) for sidecar in ("", ".sha256.json")]
    assert checkpoints == kept, checkpoints  # keep_checkpoints: 2, each with its sidecar, no temporaries
    read = subprocess.run(
        [str(PAYLOAD_PYTHON), "-c", READ_MODEL, str(PROJECT), str(tmp_path / "run" / "model.pt")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert read.returncode == 0, read.stderr
    model = json.loads(read.stdout)
    assert model["classes"] == [str(i) for i in range(10)]
    assert model["accuracy"] == accuracy["value"]
    assert {"model", "arch", "hparams", "epochs"} <= set(model["keys"])

    # A second run warm-starts from that model.pt (read-only, as pcflow puts it): its weights, one more epoch.
    (tmp_path / "run" / "model.pt").chmod(0o440)
    warm = run_train(tmp_path / "warm", local_hparams(shards, epochs=1), warm_start=tmp_path / "run" / "model.pt")
    assert warm.returncode == 0, warm.stdout[-3000:] + warm.stderr[-3000:]
    assert (
        f"warm start: loaded {last(metrics(tmp_path / 'warm'), 'warm_start_tensors')['value']:.0f} tensors"
        in warm.stdout
    )
    assert last(metrics(tmp_path / "warm"), "accuracy")["value"] > 0.5  # after one epoch: it started trained
    # A model of another shape is refused (exit 2: retrying will not help), naming the setting.
    wider = run_train(
        tmp_path / "wider", local_hparams(shards, epochs=1, width=16), warm_start=tmp_path / "run" / "model.pt"
    )
    assert wider.returncode == 2 and "has width=8, this run 16" in wider.stdout + wider.stderr


@pytest.mark.slow
def test_two_processes_train_one_model_and_a_rerun_resumes_from_the_checkpoint(shards: Path, tmp_path: Path):
    torchrun = [str(PAYLOAD_PYTHON), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    run_dir = tmp_path / "ddp"
    first = run_train(run_dir, local_hparams(shards, epochs=2, loader_workers=1), launcher=torchrun)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "2 process(es) on cpu, 32 images each per step" in first.stdout
    # The same run directory asked for one more epoch: the newest checkpoint is resumed, not retrained.
    again = run_train(run_dir, local_hparams(shards, epochs=3, loader_workers=1), launcher=torchrun)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resumed from" in again.stdout and "2 epoch(s) done" in again.stdout
    lines = metrics(run_dir)
    assert last(lines, "resumed_from_epoch")["value"] == 2
    resumed = last(lines, "resumed_from")  # what pcflow counts the steps lost from (pcflow.metrics.resume)
    assert (resumed["step"], resumed["value"], resumed["epoch"]) == (last(lines, "resumed_from_epoch")["step"],) * 2 + (
        2,
    )
    assert [line["epoch"] for line in lines if line["name"] == "accuracy"] == [0, 1, 2], "epochs 0-1 not run twice"
    assert last(lines, "accuracy")["value"] > 0.3, "two processes trained to above chance (0.1)"
    assert (run_dir / "model.pt").is_file()


def test_bad_hyperparameters_exit_2_naming_each_value(tmp_path: Path):
    """Refused before any data is read or process group made: in the time torch takes to import."""
    done = run_train(tmp_path / "bad", local_hparams(tmp_path / "no-data", depth=42, lr=0, temperature=0.2))
    assert done.returncode == 2, done.stdout + done.stderr
    for named in (
        "depth: must be one of [14, 26, 50, 101, 152]",
        "lr: must be > 0",
        "unknown hyperparameter(s) temperature",
    ):
        assert named in done.stdout


def test_resnet50_is_the_real_one():
    """depth 50 width 64 is ResNet-50: 25.56 M parameters with ImageNet's 1,000 classes, 224 px in."""
    check = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); from resnet import ResNet; "
        "m = ResNet(depth=50, width=64, num_classes=1000).eval(); "
        "print(sum(p.numel() for p in m.parameters()), tuple(m(torch.zeros(1, 3, 224, 224)).shape))"
    )
    done = subprocess.run(
        [str(PAYLOAD_PYTHON), "-c", check, str(PROJECT)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == ["25557032", "(1, 1000)\n"]


def test_schema_file_is_what_train_py_checks():
    """Every property has a type (and a default unless pcflow sets it); refusals name the value."""
    spec = importlib.util.spec_from_file_location("resnet_example_hparams", PROJECT / "hparams.py")
    hparams = importlib.util.module_from_spec(spec)  # by path: the SimCLR payload has a module of that name
    spec.loader.exec_module(hparams)
    schema = hparams.load_schema()
    assert schema["additionalProperties"] is False and schema["required"] == ["data_dir"]
    assert all(
        "type" in rule and ("default" in rule or name == "data_dir") for name, rule in schema["properties"].items()
    )
    assert hparams.problems({"data_dir": "/d", "width": 64.0, "hflip": 1, "epochs": True}, schema) == [
        "width: must be integer, got 64.0",
        "hflip: must be boolean, got 1",
        "epochs: must be integer, got True",
    ]
    assert hparams.problems({}, schema) == ["data_dir: required"]
    hp = hparams.from_dict({"data_dir": "/d", "lr": 1})
    assert hp.lr == 1.0 and isinstance(hp.lr, float) and hp.depth == 50
    with pytest.raises(hparams.HparamError, match="warmup_epochs"):
        hparams.from_dict({"data_dir": "/d", "epochs": 2, "warmup_epochs": 3})
