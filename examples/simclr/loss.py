"""NT-Xent, SimCLR's normalized temperature-scaled cross entropy, over the global batch.

With several DDP ranks the embeddings are gathered with gradients (`gather` below), so every
rank sees all 2N views as candidates: the loss equals the single-process loss on the global batch.
Its backward sums each rank's share of the gradient into the rank that owns the view, and DDP then
averages over ranks, which yields exactly the single-process gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over all 2N views of -log softmax(similarity to its positive) among the other 2N - 1."""
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    logits = z @ z.T / temperature
    logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(logits, targets)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward hands each rank the sum, over ranks, of the gradient of its rows."""

    @staticmethod
    def forward(ctx, z: torch.Tensor) -> torch.Tensor:
        ctx.rank, ctx.rows = dist.get_rank(), z.shape[0]
        parts = [torch.empty_like(z) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, z.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


def gather(z: torch.Tensor) -> torch.Tensor:
    """All ranks' rows (same count on every rank), in rank order, differentiable; `z` alone without DDP."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return z
    return _GatherWithGrad.apply(z)


def global_nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    return nt_xent(gather(z1), gather(z2), temperature)
