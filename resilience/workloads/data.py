"""The training data of the built-in workloads: a fixed synthetic dataset and the sampler whose
position a checkpoint must carry (the `mlp` workload's ``data: loader`` is in `.loader`)."""
from __future__ import annotations

from typing import Any

import torch


class ShuffledSampler:
    """Global batches of dataset indices, reshuffled every epoch from the seed; ``state()`` (epoch
    and position) is what a checkpoint must carry to resume the same data order."""

    def __init__(self, seed: int, dataset_size: int, global_batch: int):
        self.seed, self.dataset_size, self.global_batch = seed, dataset_size, global_batch
        self.epoch, self.position = 0, 0
        self._permutation = self._epoch_permutation(0)

    def _epoch_permutation(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.dataset_size, generator=generator)

    def next_indices(self) -> torch.Tensor:
        if self.position + self.global_batch > self.dataset_size:
            self.epoch, self.position = self.epoch + 1, 0
            self._permutation = self._epoch_permutation(self.epoch)
        indices = self._permutation[self.position:self.position + self.global_batch]
        self.position += self.global_batch
        return indices

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._permutation = self._epoch_permutation(self.epoch)


class SamplerData:
    """This rank's micro-batches from the global batches of a `ShuffledSampler`: micro-batch k of a
    step is the k-th slice of the global batch, and rank r holds a contiguous run of its rows."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, seed: int, rank: int, world_size: int,
                 micro_batch: int, global_batch: int):
        self.inputs, self.targets = inputs, targets
        self.sampler = ShuffledSampler(seed, len(inputs), global_batch)
        self.micro_batch, self.global_micro = micro_batch, micro_batch * world_size
        self.rows = torch.arange(micro_batch) + rank * micro_batch
        self._pending: list[torch.Tensor] = []

    def next_micro_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indices, inputs, targets, rows) of this rank's next micro-batch."""
        if not self._pending:  # the step's first micro-batch: the sampler moves one global batch on
            self._pending = list(self.sampler.next_indices().split(self.global_micro))
        indices = self._pending.pop(0)[self.rows]
        return indices, self.inputs[indices], self.targets[indices], self.rows

    def state(self) -> dict[str, int]:
        return self.sampler.state()

    def load(self, state: dict[str, Any]) -> None:
        self.sampler.load(state)
        self._pending = []

    def close(self) -> None:
        """Nothing runs beside the sampler."""


def synthetic_dataset(seed: int, size: int, input_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and the targets a fixed random tanh teacher gives them."""
    generator = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randn(size, input_dim, generator=generator)
    teacher = torch.randn(input_dim, 1, generator=generator)
    return inputs, torch.tanh(inputs @ teacher)
