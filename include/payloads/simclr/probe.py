"""Linear-probe evaluation: logistic regression on frozen encoder features, in torch.

A fixed-seed, class-stratified train/test split; features standardised with the training part's
statistics; full-batch Adam on softmax cross entropy with a little weight decay. The test-part
accuracy is the number reported as probe_accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


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


def linear_probe(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    test_fraction: float = 0.3,
    seed: int = 0,
    steps: int = 300,
    lr: float = 0.1,
    weight_decay: float = 1e-4,
) -> ProbeResult:
    features = features.detach().double()
    train_idx, test_idx = stratified_split(labels, test_fraction, seed)
    x_train, x_test = features[train_idx], features[test_idx]
    mean, std = x_train.mean(0), x_train.std(0).clamp_min(1e-6)
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    y_train, y_test = labels[train_idx], labels[test_idx]
    classes = int(labels.max()) + 1

    weight = torch.zeros(features.shape[1], classes, dtype=torch.float64, requires_grad=True)
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
    return ProbeResult(test_acc, train_acc, test_loss, len(train_idx), len(test_idx))
