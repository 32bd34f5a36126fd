"""Deterministic training jobs whose checkpointed state is tensors and ints (loadable with weights_only).

The trajectory does not depend on how the fixed global batch is split: every rank takes its slice of
the same global batch, the loss is normalized by the global batch, and gradients are summed with one
all-reduce. Only the bits of that sum depend on the world size, which is why the verifier computes
its oracle on the restart's own topology instead of using a tolerance.
"""
from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from ..core.device import rank_device
from ..core.case import WorkloadSpec
from ..core.topology import Topology


class Workload(ABC):
    """A training job on one rank.

    Call order, on every rank of a phase, after the process group exists:
      1. ``__init__(spec, rank, world_size)`` builds model, optimizer and data deterministically from
         ``spec.seed``: every rank gets the same initial state.
      2. zero or one restore: ``load_state_dict`` (called by a strategy) or ``load_reference_snapshot``.
      3. ``train_step()`` once per step, collectively on all ranks; it advances ``step`` by one.
    ``state_dict``, ``load_state_dict`` and ``fingerprint`` may be called between steps.
    """

    #: keys of ``state_dict()`` whose values differ between ranks (the rest are replicated)
    rank_local_keys: tuple[str, ...] = ()
    #: whether the model is split over ranks (tensor or pipeline parallel): such a workload is built
    #: with ``topology=`` and its ``fingerprint`` digests the gathered, unsharded state
    model_parallel: ClassVar[bool] = False

    @classmethod
    def topology_problem(cls, spec: WorkloadSpec, tp: int, pp: int) -> str | None:
        """Why this model cannot be split ``tp`` x ``pp`` ways (a model-parallel workload), or None."""
        return None

    def __init__(self, spec: WorkloadSpec, rank: int, world_size: int, topology: Topology | None = None):
        self.spec, self.rank, self.world_size = spec, rank, world_size
        self.topology = topology or Topology.single_node(world_size)

    @property
    @abstractmethod
    def step(self) -> int:
        """Number of training steps done (0 before the first)."""

    @abstractmethod
    def train_step(self) -> float:
        """One collective training step; returns the global loss, identical on every rank."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything that must survive a restart on this rank: tensors, ints, floats, lists, dicts."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; raises on a missing key."""

    def fingerprint(self) -> dict[str, str]:
        """A digest per leaf of ``state_dict()``: equal digests mean bitwise-equal state."""
        return {key: tensor_digest(value) for key, value in flatten_state(self.state_dict())}

    def save_reference_snapshot(self, directory: Path) -> None:
        """Trusted copy of this rank's state, used to compute the oracle on another topology."""
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), directory / f"rank_{self.rank}.pt")

    def rank_local_state(self) -> dict[str, Any]:
        """This rank's own state, holding at least ``rank_local_keys``; called by one rank alone."""
        return self.state_dict()

    def load_reference_snapshot(self, directory: Path) -> None:
        """Restore from a trusted snapshot saved at any world size.

        Replicated state comes from rank 0; each rank-local key from this rank's own snapshot when
        one exists, otherwise this rank keeps what ``__init__`` gave it (a rank new to the job).
        """
        state = torch.load(directory / "rank_0.pt", weights_only=True)
        own_path = directory / f"rank_{self.rank}.pt"
        own = torch.load(own_path, weights_only=True) if own_path.exists() else self.rank_local_state()
        for key in self.rank_local_keys:
            state[key] = own[key]
        self.load_state_dict(state)


class TrainableWorkload(Workload):
    """A workload a training engine can drive (DeepSpeed wraps its model, optimizer and scheduler).

    The engine's owner then replaces ``train_step`` with, once per step on every rank:
    ``next_local_batch()`` -> forward through the engine -> ``local_loss`` -> the engine's backward
    and step -> ``count_step()``. The workload keeps what the engine does not own: the step count,
    the data position and the randomness (``progress_state``), which travel as the engine's client
    state.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    @abstractmethod
    def next_local_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (inputs, targets) for the next step; advances the data position and rng."""

    @abstractmethod
    def local_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """This rank's loss: its mean over ranks is the global loss."""

    @abstractmethod
    def count_step(self) -> None:
        """The engine finished one step."""

    @abstractmethod
    def progress_state(self) -> dict[str, Any]:
        """The part of ``state_dict`` an engine does not own: the step, data position, randomness."""

    @abstractmethod
    def load_progress_state(self, state: dict[str, Any]) -> None:
        """Restore what ``progress_state`` returned."""


class MLPWorkload(TrainableWorkload):
    """A tanh MLP regressing a fixed synthetic dataset with Adam and a warm-up/decay LR schedule.

    Checkpointed state: ``step``, ``model``, ``optimizer`` (Adam moments), ``scheduler``, ``data``
    (epoch and position of the shuffled sampler) and ``rng`` (this rank's input-noise generator).
    With ``rank_rng: same`` every rank draws the noise of the whole global batch from an identical
    stream and keeps its slice (so the trajectory is independent of the split); with ``distinct``
    each rank has its own stream, as real per-rank dropout does, and a restore that hands every rank
    rank 0's stream changes the losses.
    """

    input_dim = 32
    dataset_size = 512
    noise_scale = 0.05
    evaluation_examples = 64
    base_lr = 1e-3

    def __init__(self, spec: WorkloadSpec, rank: int, world_size: int, topology: Topology | None = None):
        super().__init__(spec, rank, world_size, topology)
        if spec.global_batch % world_size:
            raise ValueError(f"global batch {spec.global_batch} is not divisible by world size {world_size}")
        self.local_batch = spec.global_batch // world_size
        hidden = hidden_width(spec.size_bytes, self.input_dim)
        self.device = torch.device(rank_device())  # cuda:LOCAL_RANK under NCCL, else the CPU
        torch.manual_seed(spec.seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(self.input_dim, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, 1)).to(self.device)  # built on the CPU: the same initial bits
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.base_lr, foreach=False)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor)
        inputs, targets = synthetic_dataset(spec.seed, self.dataset_size, self.input_dim)
        self.inputs, self.targets = inputs.to(self.device), targets.to(self.device)
        stream_seed = spec.seed + 2 + (rank + 1) * 7919 if spec.rank_rng == "distinct" else spec.seed + 2
        self.rng = torch.Generator().manual_seed(stream_seed)
        # with one stream shared by all ranks, the stream is replicated state like the model
        self.rank_local_keys = ("rng",) if spec.rank_rng == "distinct" else ()
        self._step = 0
        self.sampler = ShuffledSampler(spec.seed, self.dataset_size, spec.global_batch)

    @property
    def step(self) -> int:
        return self._step

    def next_local_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's slice of the next global batch, (inputs, targets); advances data and noise."""
        indices = self.sampler.next_indices()
        start = self.rank * self.local_batch
        local = indices[start:start + self.local_batch]
        if self.spec.rank_rng == "same":
            noise = torch.randn(self.spec.global_batch, self.input_dim, generator=self.rng)[start:start + self.local_batch]
        else:
            noise = torch.randn(self.local_batch, self.input_dim, generator=self.rng)
        local = local.to(self.device)  # the data order and the noise stream stay on the CPU
        return self.inputs[local] + self.noise_scale * noise.to(self.device), self.targets[local]

    def local_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean squared error over this rank's examples (an engine averages it over ranks)."""
        return ((outputs - targets) ** 2).mean()

    def count_step(self) -> None:
        """An engine that drives this workload finished one step."""
        self._step += 1

    def train_step(self) -> float:
        inputs, targets = self.next_local_batch()
        self.optimizer.zero_grad(set_to_none=False)
        local_loss = ((self.model(inputs) - targets) ** 2).sum() / self.spec.global_batch
        local_loss.backward()
        loss = sum_gradients(self.model.parameters(), local_loss.detach().reshape(1))
        self.optimizer.step()
        self.scheduler.step()
        self._step += 1
        return float(loss)

    def evaluation_loss(self, parameters: dict[str, torch.Tensor] | None = None) -> float:
        """The loss on a fixed evaluation batch (the first ``evaluation_examples`` examples, no noise)
        under the current parameters, whatever the world size or batch. Changes no state and needs no
        collective, so a strategy can record it at save time and a check after loading can recompute
        it (bitwise equal if the model was restored). ``parameters``: use these (by name) instead of
        the model's own, for an engine that keeps the model partitioned."""
        count = self.evaluation_examples
        if parameters is None:
            parameters = dict(self.model.named_parameters())
        with torch.no_grad():  # by hand, not through the module: an engine may have hooked it
            hidden = self.inputs[:count]
            layers = [name[:-len(".weight")] for name in parameters if name.endswith(".weight")]
            for index, layer in enumerate(layers):
                hidden = torch.nn.functional.linear(hidden, parameters[f"{layer}.weight"], parameters[f"{layer}.bias"])
                if index < len(layers) - 1:
                    hidden = torch.tanh(hidden)
            errors = (hidden - self.targets[:count]) ** 2
        return float(errors.sum() / count)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            **self.progress_state(),
        }

    def progress_state(self) -> dict[str, Any]:
        return {"step": self._step, "data": self.sampler.state(),
                "rng": self.rng.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.load_progress_state(state)

    def load_progress_state(self, state: dict[str, Any]) -> None:
        self.sampler.load(state["data"])
        self.rng.set_state(state["rng"])
        self._step = int(state["step"])


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


def synthetic_dataset(seed: int, size: int, input_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and the targets a fixed random tanh teacher gives them."""
    generator = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randn(size, input_dim, generator=generator)
    teacher = torch.randn(input_dim, 1, generator=generator)
    return inputs, torch.tanh(inputs @ teacher)


def sum_gradients(parameters, extra: torch.Tensor, group=None, reduce: bool = True) -> torch.Tensor:
    """Sum every parameter's gradient and ``extra`` over ``group`` in one flat all-reduce (one
    reduction order for all of them), write the sums back, and return the summed ``extra``."""
    grads = [p.grad for p in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads] + [extra])
    if reduce:
        dist.all_reduce(flat, group=group)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()
    return flat[offset:].clone()


def lr_factor(step: int) -> float:
    return min(1.0, (step + 1) / 3) * 0.97 ** step


def hidden_width(size_bytes: int, input_dim: int) -> int:
    """Hidden width whose fp32 parameters take about ``size_bytes``: h*h + (input_dim + 3)*h + 1 params."""
    params = max(size_bytes // 4, 64)
    b = input_dim + 3
    return max(4, int((-b + math.sqrt(b * b + 4 * params)) / 2))


def flatten_state(value: Any, prefix: str = ""):
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from flatten_state(value[key], f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from flatten_state(item, f"{prefix}[{index}]")
    else:
        yield prefix, value


def tensor_digest(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest = hashlib.sha256(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
        return digest.hexdigest()[:20]
    return hashlib.sha256(repr(value).encode()).hexdigest()[:20]
