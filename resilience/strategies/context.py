"""What a checkpoint strategy is given: its context (`StrategyContext`) and, when its library runs
the training loop itself, the harness's observer of that loop (`TrainingObserver`)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..core.plan import Start
from ..core.topology import Topology
from ..workloads.base import Workload


@dataclass(frozen=True)
class StrategyContext:
    """What a strategy may know about the job it runs in."""

    checkpoint_dir: Path  # what this rank sees: shared by every rank, or its node's own (node-local storage)
    rank: int
    world_size: int
    previous_rank: int | None  # at restart: the rank whose place this rank takes (restart.rank_map)
    options: Mapping[str, Any] = field(default_factory=dict)
    topology: Topology | None = None  # TP x PP x DP and placement of this phase (None: one node, pure DP)
    checkpoint_url: str | None = None  # object storage (``s3://bucket/prefix``) in place of checkpoint_dir
    #: where the case's node agents live (`resilience.core.node_agents`; None: the strategy has none)
    node_agent_root: Path | None = None

    @property
    def placement(self) -> Topology:
        return self.topology or Topology.single_node(self.world_size)

    @property
    def local_rank(self) -> int:
        """This rank's index on its node, as torchrun's LOCAL_RANK."""
        return self.placement.local_rank(self.rank)

    @property
    def node(self) -> int:
        """The physical node this rank runs on."""
        return self.placement.node_of(self.rank)


class TrainingObserver(ABC):
    """The harness's side of a training loop that a library runs itself (``drives_training``).

    The strategy's ``train`` calls it from the library's own extension points (a Lightning
    ``Callback``, a step wrapped by Accelerate's loop), on every rank, in this order:
      1. ``restored(workload)`` once, after the library restored its checkpoint (``start ==
         "strategy"``), the trusted snapshot (``"snapshot"``), the one checkpoint of step
         ``snapshot_step`` that the availability probe asks for (``"step"``, strategies offering
         ``CHOSEN_STEP``) or nothing (``"fresh"``), before the first step it trains;
      2. per step: ``before_step(step)`` before its batch, then ``after_step(step, loss)`` once the
         optimizer stepped (``loss``: the global loss, identical on every rank); in between, where
         the library accumulates gradients (``micro_steps`` >= 2), ``between_micro_steps(step)``
         after each micro-batch of the step but its last;
      3. at a checkpoint step (``step % checkpoint_every == 0``) of a phase that ``saves``:
         ``before_save(step)`` right before the library's save, ``after_save(step)`` once it returned.
    ``snapshot_due(step)`` says whether the reference run wants a trusted snapshot after that step
    (the strategy then writes one with ``workload.save_reference_snapshot``).
    """

    start: Start  # how the phase begins: `core.plan.Start`
    saves: bool  # whether this phase checkpoints
    steps: int  # train until the library's step count reaches this
    checkpoint_every: int
    snapshot_step: int | None  # "snapshot": the trusted snapshot's step; "step": the checkpoint's step

    @abstractmethod
    def restored(self, workload: Workload) -> None: ...

    @abstractmethod
    def before_step(self, step: int) -> None: ...

    @abstractmethod
    def after_step(self, workload: Workload, step: int, loss: float) -> None: ...

    def between_micro_steps(self, step: int) -> None:  # noqa: B027 -- only loops that accumulate call it
        """After a micro-batch of ``step`` that is not its last, before the next."""

    @abstractmethod
    def before_save(self, step: int) -> None: ...

    @abstractmethod
    def after_save(self, step: int) -> None: ...

    @abstractmethod
    def snapshot_due(self, step: int) -> bool: ...

    @abstractmethod
    def snapshot_path(self, step: int) -> Path:
        """Where the trusted snapshot of ``step`` lives (written by the reference, read by the continuation)."""
