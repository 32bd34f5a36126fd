"""The workload contract (`Workload`, `TrainableWorkload`) and the state digests a fingerprint is
made of: what a plug-in workload implements, apart from any one model."""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..core.case import WorkloadSpec
from ..core.topology import Topology


class Workload(ABC):
    """A training job on one rank.

    Call order in a rank (``rank.worker``), on every rank of a phase, after the process group exists:
      1. ``__init__(spec, rank, world_size)`` (plus ``topology=`` when ``model_parallel``) builds
         model, optimizer and data deterministically from ``spec.seed``: every rank gets the same
         initial state. Collective: a model-parallel workload creates its process groups here.
         The strategy's ``prepare`` may then wrap it (an engine that owns model and optimizer).
      2. zero or one restore, on every rank together: ``load_state_dict`` (called by the strategy's
         ``load``) or ``load_reference_snapshot`` (the oracle's restart from a trusted snapshot).
      3. ``fingerprint()`` on every rank after the restore, and after each step when states are recorded.
      4. ``train_step()`` once per step, collectively on all ranks, until ``step`` reaches
         ``spec.steps``; it advances ``step`` by one.
      5. at a checkpoint step: ``save_reference_snapshot`` on every rank (the reference run), then
         ``state_dict`` through the strategy's ``save`` (every rank).
      6. ``close()`` once, after the last step of the phase.
    ``state_dict``, ``load_state_dict`` and ``fingerprint`` may be called between steps; a
    model-parallel workload's are collective. ``topology_problem`` is called in the harness (the
    scenario loader), before any rank exists; ``rank_local_state`` by one rank alone.
    ``resilience verify`` (``rank.checkpoint_check``) calls 1, the strategy's load, ``fingerprint``
    and one ``train_step``.
    """

    #: keys of ``state_dict()`` whose values differ between ranks (the rest are replicated)
    rank_local_keys: tuple[str, ...] = ()
    #: whether the model is split over ranks (tensor or pipeline parallel): such a workload is built
    #: with ``topology=`` and its ``fingerprint`` digests the gathered, unsharded state
    model_parallel: ClassVar[bool] = False
    #: the global dataset indices of the batch this rank trained in its last step, set where the
    #: batch is built or received (never computed from a position counter); None: not known
    last_samples: list[int] | None = None
    #: a wrapper's inner workload (an engine's wrapper trains it: ``prepare`` of DeepSpeed, DCP's
    #: FSDP2, Accelerate), set by the wrapper's ``__init__``; None: no wrapper. Read on its rank
    #: by ``consumed_samples`` and by the strategy that made the wrapper
    inner: Workload | None = None
    #: called between the micro-batches of one step with the step's number, by a workload that
    #: accumulates; set on every rank by the training loop before the first step (None: nobody listens)
    micro_step_listener: Callable[[int], None] | None = None

    @classmethod
    def check_options(cls, options: Mapping[str, Any], world_size: int,
                      global_batch: int) -> tuple[str, str, Any, Any] | None:
        """``workload.options`` of a scenario: None, or (key, problem, value, allowed). Called in the
        harness (the scenario loader). A workload that takes options overrides it; this one takes none."""
        if not options:
            return None
        key = next(iter(options))
        return (f"workload.options.{key}", f"workload {cls.__name__} takes no options", key, "no options")

    @classmethod
    def topology_problem(cls, spec: WorkloadSpec, tp: int, pp: int) -> str | None:
        """Why this model cannot be split ``tp`` x ``pp`` ways (a model-parallel workload), or None.
        Called in the harness, when the scenario is loaded."""
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

    def close(self) -> None:
        """Stop what the workload runs beside training (a DataLoader's worker processes). Called on
        every rank once its phase trained its last step; a wrapper closes its inner workload."""
        if self.inner is not None:
            self.inner.close()

    def consumed_samples(self) -> list[int] | None:
        """The dataset indices this rank trained in its last step (the data audit); a wrapper that
        trains an inner workload answers with the inner one's."""
        return self.inner.consumed_samples() if self.inner is not None else self.last_samples

    def evaluation_loss(self, parameters: dict[str, torch.Tensor] | None = None) -> float | None:
        """The loss on a fixed evaluation batch under the current parameters (``parameters``: these,
        by name, in place of the model's own), or None when the workload has none (the default).
        Changes no state and makes no collective. Called by a strategy's ``save`` on the ranks that
        write (the torch schemes, DeepSpeed: recorded in the checkpoint) and by `resilience verify
        --step-check` on every rank after the load, to compare with what the checkpoint recorded."""
        return None

    def fingerprint(self) -> dict[str, str]:
        """A digest per leaf of ``state_dict()``: equal digests mean bitwise-equal state."""
        return {key: tensor_digest(value) for key, value in flatten_state(self.state_dict())}

    def save_reference_snapshot(self, directory: Path) -> None:
        """Trusted copy of this rank's state, used to compute the oracle on another topology.
        Called on every rank of a run that records states, after a fresh start and at every
        checkpoint step."""
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), directory / f"rank_{self.rank}.pt")

    def rank_local_state(self) -> dict[str, Any]:
        """This rank's own state, holding at least ``rank_local_keys``; called by one rank alone."""
        return self.state_dict()

    def load_reference_snapshot(self, directory: Path) -> None:
        """Restore from a trusted snapshot saved at any world size; called on every rank together.

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

    The engine's owner (the strategy's ``prepare``, on every rank) then replaces ``train_step`` with,
    once per step on every rank: ``next_local_batch()`` -> forward through the engine ->
    ``local_loss`` -> the engine's backward and step -> ``count_step()``. The workload keeps what the
    engine does not own: the step count, the data position and the randomness (``progress_state``),
    which travel as the engine's client state.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    @abstractmethod
    def next_local_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (inputs, targets) for the next step; advances the data position and rng."""

    def micro_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This step's micro-batches, (inputs, targets) each, for a loop that accumulates their
        gradients into one optimizer step; by default one, ``next_local_batch()``."""
        yield self.next_local_batch()

    @abstractmethod
    def local_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """This rank's loss: its mean over ranks is the global loss."""

    def training_examples(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole training set (inputs, targets), for a library that loads the data itself
        through its own ``DataLoader`` and sampler (Lightning, Accelerate): no input noise then."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its training set")

    @abstractmethod
    def count_step(self) -> None:
        """The engine finished one step."""

    @abstractmethod
    def progress_state(self) -> dict[str, Any]:
        """The part of ``state_dict`` an engine does not own: the step, data position, randomness."""

    @abstractmethod
    def load_progress_state(self, state: dict[str, Any]) -> None:
        """Restore what ``progress_state`` returned."""


def flatten_state(value: Any, prefix: str = ""):
    """(dotted key, leaf) of every leaf of a state dict, in a fixed order: what a fingerprint digests."""
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from flatten_state(value[key], f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from flatten_state(item, f"{prefix}[{index}]")
    else:
        yield prefix, value


def tensor_digest(value: Any) -> str:
    """A short digest of a leaf's bits (dtype and shape too, for a tensor)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest = hashlib.sha256(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
        return digest.hexdigest()[:20]
    return hashlib.sha256(repr(value).encode()).hexdigest()[:20]
