"""Evaluation of frozen encoder features: logistic regression probes, in torch.

A fixed-seed, class-stratified train/test split; features standardised with the training part's
statistics; full-batch Adam on softmax cross entropy with a little weight decay.

- `linear_probe`: fitted on the whole training part (probe_accuracy). On the digits even a random
  encoder scores about 0.96 this way, so it cannot tell training from no training.
- `few_label_probe`: fitted on `shots` labelled images per class, drawn `draws` times from the
  training part, scored on the same test part, averaged (fewshot_accuracy): what a representation is
  for when labels are scarce, and where pretraining shows (examples/simclr/README.md has the numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ProbeSettings:
    test_fraction: float = 0.3  #: held-out share of each class
    seed: int = 0  #: of the split (and of the few-label draws)
    steps: int = 300  #: full-batch Adam steps
    lr: float = 0.1
    weight_decay: float = 1e-4


@dataclass(frozen=True)
class ProbeResult:
    accuracy: float
    train_accuracy: float
    loss: float
    n_train: int
    n_test: int


def stratified_split(labels: torch.Tensor, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (train, test): in every class, a seeded shuffle, the first `test_fraction` to test."""
    generator = torch.Generator().manual_seed(seed)
    train, test = [], []
    for cls in torch.unique(labels):
        members = torch.nonzero(labels == cls).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        n_test = max(1, round(len(members) * test_fraction))
        test.append(members[:n_test])
        train.append(members[n_test:])
    return torch.cat(train).sort().values, torch.cat(test).sort().values


def _standardised(features: torch.Tensor, train_idx: torch.Tensor) -> torch.Tensor:
    features = features.detach().double()
    train = features[train_idx]
    return (features - train.mean(0)) / train.std(0).clamp_min(1e-6)


def fit_and_score(x_train, y_train, x_test, y_test, classes: int, *, steps: int, lr: float, weight_decay: float):
    """Logistic regression on (x_train, y_train); ProbeResult on (x_test, y_test)."""
    weight = torch.zeros(x_train.shape[1], classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(x_train @ weight + bias, y_train) + weight_decay * weight.pow(2).sum()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        train_acc = ((x_train @ weight + bias).argmax(1) == y_train).double().mean().item()
        test_logits = x_test @ weight + bias
        test_acc = (test_logits.argmax(1) == y_test).double().mean().item()
        test_loss = F.cross_entropy(test_logits, y_test).item()
    return ProbeResult(test_acc, train_acc, test_loss, len(y_train), len(y_test))


def linear_probe(features: torch.Tensor, labels: torch.Tensor, settings: ProbeSettings = ProbeSettings()):
    train_idx, test_idx = stratified_split(labels, settings.test_fraction, settings.seed)
    x = _standardised(features, train_idx)
    classes = int(labels.max()) + 1
    return fit_and_score(
        x[train_idx],
        labels[train_idx],
        x[test_idx],
        labels[test_idx],
        classes,
        steps=settings.steps,
        lr=settings.lr,
        weight_decay=settings.weight_decay,
    )


def few_label_probe(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    shots: int = 1,
    draws: int = 10,
    settings: ProbeSettings = ProbeSettings(),
) -> float:
    """Mean test accuracy of `draws` probes, each fitted on `shots` seeded picks per class (fewer when
    a class has fewer in its training part). The features of the whole training part, labels unused,
    set the standardisation, as unlabelled data would in practice. The draws are fitted together, as
    one batch of independent problems (Adam is elementwise: the same as fitting them one by one)."""
    train_idx, test_idx = stratified_split(labels, settings.test_fraction, settings.seed)
    x = _standardised(features, train_idx)
    classes = int(labels.max()) + 1
    members = [train_idx[labels[train_idx] == cls] for cls in torch.unique(labels[train_idx])]
    shots = min(shots, *(len(m) for m in members))
    chosen = []
    for draw in range(draws):
        generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + draw + 1)
        chosen.append(torch.cat([m[torch.randperm(len(m), generator=generator)[:shots]] for m in members]))
    picks = torch.stack(chosen)  # (draws, shots x classes)
    x_train, y_train = x[picks], labels[picks]
    weight = torch.zeros(draws, x.shape[1], classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(draws, 1, classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=settings.lr)
    for _ in range(settings.steps):
        optimizer.zero_grad()
        logits = torch.bmm(x_train, weight) + bias
        per_draw = F.cross_entropy(logits.transpose(1, 2), y_train, reduction="none").mean(1)
        loss = (per_draw + settings.weight_decay * weight.pow(2).sum((1, 2))).sum()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        predicted = (torch.einsum("nd,kdc->knc", x[test_idx], weight) + bias).argmax(2)
        return (predicted == labels[test_idx]).double().mean().item()
