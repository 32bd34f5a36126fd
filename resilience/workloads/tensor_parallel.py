"""The tensor-parallel pieces of the `tp_mlp` workload (``parallel_mlp``): the row-parallel layer's
all-reduce, the module an engine wraps, a micro-batch's pass through the pipeline, and the creation
of the process groups."""
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


def pipeline_pass(workload, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """One micro-batch of ``workload`` (`tp_mlp`) forward and backward through its rank's stage
    (activations from the stage before, gradients from the stage after); the last stage's loss,
    zero elsewhere."""
    stage, stages = workload.coords.pp, workload.topology.pp
    if stage == 0:
        received = None
        activation = inputs
    else:  # this rank's tensor-parallel slice (after block 0) or the full width (after block 1)
        width = workload.hidden // workload.topology.tp if workload.blocks[0] == 1 else workload.hidden
        received = torch.empty(workload.micro_batch, width, device=workload.device)
        dist.recv(received, src=workload.pipeline_ranks[stage - 1])
        activation = received.requires_grad_()
    activation = workload.run_blocks(activation)
    if stage == stages - 1:
        loss = ((activation - targets) ** 2).sum() / workload.spec.global_batch
        loss.backward()
        local_loss = loss.detach().reshape(1)
    else:
        dist.send(activation.detach().contiguous(), dst=workload.pipeline_ranks[stage + 1])
        grad = torch.empty_like(activation)
        dist.recv(grad, src=workload.pipeline_ranks[stage + 1])
        activation.backward(grad)
        local_loss = torch.zeros(1, device=workload.device)
    if received is not None:
        dist.send(received.grad.contiguous(), dst=workload.pipeline_ranks[stage - 1])
    return local_loss
