"""The `mlp` workload's real input pipeline (``data: loader``): a ``torch.utils.data.DataLoader`` over
a map-style dataset with a ``DistributedSampler(shuffle=True)``, ``set_epoch`` at every epoch, and
worker processes that prefetch. Its position (epoch, micro-batches trained in it) is what a
checkpoint must carry; a restore rebuilds the iterator and skips what was trained, as a job that
resumes mid-epoch does. With ``loader_state: per_rank`` each rank keeps its position under a key of
its own, as torchtitan's ``ParallelAwareDataloader`` does (``torchtitan/components/dataloader.py``):
a rank whose key is missing warns and starts its epoch over, and another world size is refused."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class IndexedExamples(Dataset):
    """(index, input, target) per example: the index travels in the batch the workers produce, so
    the data audit reads what was trained, never a position counter."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor):
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return index, self.inputs[index], self.targets[index]


class CountingSampler(DistributedSampler):
    """A ``DistributedSampler`` that counts the indices its iterator handed out in this epoch. The
    loader's workers draw ahead of training, so ``handed_out`` runs ahead of what was trained by up
    to ``num_workers * prefetch_factor`` batches: a count some resumable samplers save."""

    handed_out = 0

    def __iter__(self) -> Iterator[int]:
        self.handed_out = 0
        for index in super().__iter__():
            self.handed_out += 1
            yield index


class LoaderData:
    """This rank's micro-batches from a real DataLoader; ``rows`` are their positions in the global
    micro-batch (rank r holds positions r, r + world, ...: how DistributedSampler deals them), so
    the global micro-batch is the same set of examples at every world size."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, seed: int, rank: int, world_size: int,
                 micro_batch: int, num_workers: int, persistent_workers: bool, per_rank_state: bool = False):
        self.rank, self.world_size, self.per_rank_state = rank, world_size, per_rank_state
        self.sampler = CountingSampler(IndexedExamples(inputs, targets), num_replicas=world_size, rank=rank,
                                       shuffle=True, seed=seed, drop_last=True)
        # its own generator: an iterator's base seed must not draw from the torch RNG dropout uses.
        # Workers are forked from the rank, as a script's are under torchrun on Linux: they are the
        # rank's children, in its process group, and their watchdog sees the rank die
        self.loader = DataLoader(self.sampler.dataset, batch_size=micro_batch, sampler=self.sampler,
                                 num_workers=num_workers, persistent_workers=persistent_workers,
                                 drop_last=True, generator=torch.Generator().manual_seed(seed),
                                 multiprocessing_context="fork" if num_workers else None)
        self.batches_per_epoch = len(self.loader)
        self.epoch, self.batch = 0, 0
        self._iterator: Iterator | None = None

    def next_micro_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indices, inputs, targets, rows) of this rank's next micro-batch."""
        if self.batch == self.batches_per_epoch:
            self.epoch, self.batch, self._iterator = self.epoch + 1, 0, None
        if self._iterator is None:
            self.sampler.set_epoch(self.epoch)
            self._iterator = iter(self.loader)
            for _ in range(self.batch):  # resumed mid-epoch: the batches already trained go by
                next(self._iterator)
        indices, inputs, targets = next(self._iterator)
        self.batch += 1
        return indices, inputs, targets, torch.arange(len(indices)) * self.world_size + self.rank

    def state(self) -> dict[str, Any]:
        """(epoch, micro-batches trained in it); with ``per_rank_state``, under this rank's own key
        beside the world size, as torchtitan's ``ParallelAwareDataloader.state_dict`` keeps it."""
        position = {"epoch": self.epoch, "batch": self.batch}
        return {f"dp_rank_{self.rank}": position, "world_size": self.world_size} if self.per_rank_state else position

    def load(self, state: dict[str, Any]) -> None:
        if self.per_rank_state:  # torchtitan's ParallelAwareDataloader.load_state_dict, step by step
            key = f"dp_rank_{self.rank}"
            if key not in state:
                print(f"DataLoader state is empty for dp rank {self.rank}, expected key {key}", file=sys.stderr)
                return
            assert self.world_size == state["world_size"], (
                "dp_degree is inconsistent before and after checkpoint, dataloader resharding is not supported yet.")
            state = state[key]
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        self._iterator = None  # the next batch starts a resumed iterator (persistent workers are reused)

    def close(self) -> None:
        """Stop the worker processes (a rank ends with os._exit, which would leave them to notice)."""
        self._iterator = None
        self.loader = None
