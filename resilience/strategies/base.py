"""The contract every checkpoint strategy (system under test) implements."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

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
         "strategy"``), the trusted snapshot (``"snapshot"``) or nothing (``"fresh"``), before the
         first step it trains;
      2. per step: ``before_step(step)`` before its batch, then ``after_step(step, loss)`` once the
         optimizer stepped (``loss``: the global loss, identical on every rank);
      3. at a checkpoint step (``step % checkpoint_every == 0``) of a phase that ``saves``:
         ``before_save(step)`` right before the library's save, ``after_save(step)`` once it returned.
    ``snapshot_due(step)`` says whether the reference run wants a trusted snapshot after that step
    (the strategy then writes one with ``workload.save_reference_snapshot``).
    """

    start: str  # "fresh", "strategy" (restore the library's checkpoint) or "snapshot"
    saves: bool  # whether this phase checkpoints
    steps: int  # train until the library's step count reaches this
    checkpoint_every: int
    snapshot_step: int | None  # start == "snapshot": the step of the trusted snapshot to start from

    @abstractmethod
    def restored(self, workload: Workload) -> None: ...

    @abstractmethod
    def before_step(self, step: int) -> None: ...

    @abstractmethod
    def after_step(self, workload: Workload, step: int, loss: float) -> None: ...

    @abstractmethod
    def before_save(self, step: int) -> None: ...

    @abstractmethod
    def after_save(self, step: int) -> None: ...

    @abstractmethod
    def snapshot_due(self, step: int) -> bool: ...

    @abstractmethod
    def snapshot_path(self, step: int) -> Path:
        """Where the trusted snapshot of ``step`` lives (written by the reference, read by the continuation)."""


class CheckpointStrategy(ABC):
    """A checkpoint system: saves a workload's state and restores it in a fresh job.

    Call order, in every rank process (``torch.distributed`` is initialised, gloo):
      1. ``__init__(context)`` then ``prepare(workload)`` on every rank, once per process, in every
         phase (the reference run and the oracle's continuation too, which never save or load).
      2. First run: ``save(workload, step)`` collectively on every rank after each checkpoint step.
         It returns once this rank considers the checkpoint saved; a checkpoint counts as complete
         when ``save`` has returned on every rank.
      3. Restart (fresh processes, maybe another world size): ``load(workload)`` (or, from a
         wrapper that picks the checkpoint, ``load_step(workload, step)``) collectively on every
         rank, once, before training resumes. It restores the newest checkpoint it trusts through
         ``workload.load_state_dict`` (training then resumes at ``workload.step``), leaves the
         workload untouched to start from scratch, or raises to refuse. Then ``save`` as in 2.
      4. ``finish(workload)`` on every rank after the last training step of a phase that saves (first
         run and restart): a strategy whose saves complete in the background commits the last one.
    A strategy whose library runs the training loop itself (``drives_training``) gets, in place of
    2-4 and of the harness's own loop, one call of ``train(workload, observer)`` on every rank: the
    library trains, restores (``observer.start``) and saves with its own mechanisms, and reports
    through the `TrainingObserver`.
    Faults reach a strategy's files through ``open``, ``torch.save`` and ``os.fsync`` on paths under
    ``context.checkpoint_dir``; a strategy needs no code of its own for that.
    """

    #: whether the library's own loop trains (``train``) instead of the harness's loop
    drives_training: ClassVar[bool] = False

    #: option names a scenario may set under ``strategy.options``
    options: ClassVar[tuple[str, ...]] = ()
    #: the allowed values of those options that take one of a fixed set
    option_values: ClassVar[Mapping[str, tuple[Any, ...]]] = {}
    #: top-level modules the strategy imports in the ranks, and how to install them
    requires: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def missing(cls) -> str | None:
        """Why this strategy cannot run on this machine, or None. Called in the harness: it finds
        modules without importing them."""
        import importlib.util

        for module, install in cls.requires.items():
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed ({install})"
        return None

    @classmethod
    def missing_for(cls, options: Mapping[str, Any]) -> str | None:
        """``missing()`` for a strategy configured with ``options`` (a wrapper: its inner's).
        Called in the harness."""
        return cls.missing()

    @classmethod
    def check_object_store(cls, options: Mapping[str, Any], store: str | None) -> tuple[str, str, Any, Any] | None:
        """Whether this strategy, so configured, can checkpoint into ``store`` (``object_store: s3``;
        it then writes under ``context.checkpoint_url``; None: a directory): None, or what the
        loader reports."""
        if store is None:
            return None
        return ("object_store", f"strategy {cls.__name__} writes files only", store, "leave object_store out")

    @classmethod
    def trained_by(cls, options: Mapping[str, Any]) -> tuple[type, ...]:
        """The classes whose source decides how the engine trains (see ``trainer``): the
        reference cache is keyed on their source. A wrapper names its inner strategy's."""
        return (cls,)

    #: whether one process may restore one checkpoint after another (each in a new process group)
    #: and give what fresh processes give: then the crash-state explorer restores in warm ranks.
    #: False where the strategy or its library keeps global state between loads (DeepSpeed's
    #: engine and its ``deepspeed.comm`` backend). Claimed, not trusted: fresh ranks re-run a share
    #: of the states and must agree (docs/exploration.md).
    warm_restores: ClassVar[bool] = False

    @classmethod
    def warm_process(cls, options: Mapping[str, Any]) -> None:
        """Start what the library keeps for a process's whole life (a helper it creates at its first
        save and reuses), so that a warm rank has it before it records the state each restore must
        leave as it found it, as a training process has it after its first save. Called once in
        each warm rank, before its first restore; nothing by default."""

    @classmethod
    def restores_warm(cls, options: Mapping[str, Any]) -> bool:
        """``warm_restores`` of the strategy configured with ``options`` (a wrapper: its inner's
        too). Called in the harness."""
        return cls.warm_restores

    def __init__(self, context: StrategyContext):
        self.context = context

    #: whether the checkpoints carry a version stamp (what wrote them) that
    #: ``rewrite_version_stamp`` can change: the version_mismatch fault needs one
    records_version: ClassVar[bool] = False

    def rewrite_version_stamp(self, step: int, claim: str) -> list[str]:
        """Make this rank's files of the step-``step`` checkpoint claim an ``older`` or ``newer``
        version of what wrote them, as an upgrade or a downgrade between save and restore would.
        Called by the version_mismatch fault on the trigger rank, after its save returned; returns
        the files changed (relative to the checkpoint directory)."""
        raise NotImplementedError(f"{type(self).__name__} records no version")

    @classmethod
    def trainer(cls, options: Mapping[str, Any]) -> str:
        """Who computes the training steps: "" when the workload trains itself, otherwise a name
        for the engine that wraps it (its reference runs are cached apart). Called in the harness,
        so it must not import the engine."""
        return ""

    def prepare(self, workload: Workload) -> Workload:
        """The workload the phase trains: ``workload`` itself, or a wrapper whose engine owns the
        model and optimizer (collective when the engine's construction is)."""
        return workload

    @abstractmethod
    def save(self, workload: Workload, step: int) -> None:
        """Save ``workload.state_dict()`` for ``step``; called on every rank."""

    def train(self, workload: Workload, observer: TrainingObserver) -> None:
        """Run the library's training loop to ``observer.steps``, restoring and saving as the library
        does and reporting to ``observer``; on every rank, once (``drives_training`` strategies)."""
        raise NotImplementedError(f"{type(self).__name__} does not run a training loop of its own")

    def finish(self, workload: Workload) -> None:
        """Commit whatever save is still in flight; called on every rank once training ended."""

    @abstractmethod
    def load(self, workload: Workload) -> None:
        """Restore the newest trusted checkpoint into ``workload``, or raise; called on every rank."""

    # -- optional: addressing one checkpoint, for wrappers that choose which one to restore -------
    def step_location(self, step: int) -> Path | None:
        """The directory that holds every rank's files of the step-``step`` checkpoint (and those
        of no other step), or None when the strategy has no such directory. Pure: it names the
        place, whether or not it exists. Called on any rank, after ``save(workload, step)``
        returned on every rank, and at restart before ``load_step``."""
        return None

    def load_step(self, workload: Workload, step: int) -> None:
        """Restore exactly the step-``step`` checkpoint into ``workload``, or raise. Collective:
        at restart every rank calls it once, in place of ``load`` (never both); a strategy that
        implements it also implements ``step_location``."""
        raise NotImplementedError(f"{type(self).__name__} cannot load a chosen step")
