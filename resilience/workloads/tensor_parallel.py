"""The tensor-parallel pieces of the `tp_mlp` workload (``parallel_mlp``): the row-parallel layer's
all-reduce, the module an engine wraps, and the creation of the process groups."""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist


class SumOverTensorGroup(torch.autograd.Function):
    """The row-parallel layer's all-reduce: forward sums the partial products, backward passes the
    (replicated) gradient straight to each rank's partial product."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor, group) -> torch.Tensor:
        total = partial.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class StageModule(torch.nn.Module):
    """This rank's layers; ``forward`` runs its blocks (an engine such as DeepSpeed calls it).
    Parameters keep their names (``layer1.weight``, ...). It holds its workload's ``run_blocks``
    weakly: no reference cycle, so the workload and its process groups (their gloo threads) go as
    soon as the workload does, not at the next garbage collection (a warm rank checks for them)."""

    def __init__(self, run_blocks):
        super().__init__()
        self.run_blocks = weakref.WeakMethod(run_blocks)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.run_blocks()(inputs)


def own_group(groups: list[tuple[int, ...]], rank: int):
    """Create every group in the same order on every rank (new_group is collective) and keep ours."""
    own = None
    for ranks in groups:
        group = dist.new_group(list(ranks)) if len(groups) > 1 or len(ranks) != dist.get_world_size() else None
        if rank in ranks:
            own = group if group is not None else dist.group.WORLD
    return own
