"""The contract every checkpoint strategy (system under test) implements."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Mapping

from ..core.capabilities import Capability
from ..workloads.base import Workload
from .context import StrategyContext, TrainingObserver  # re-exported: part of the contract
from .declarations import OPTIONS_KEY, declaration_problems, option_problem


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
    Everything else a strategy may offer is declared here, with a default: optional capabilities
    (`Capability`: a class lists those it offers in ``capabilities`` and overrides their methods,
    checked when the class is created), ``saves_on_sigterm``, ``check_options``, ``restore_model``,
    ``inner``, ``recorded_check_loss``. Callers read them directly, never by name.
    """

    #: whether the library's own loop trains (``train``) instead of the harness's loop
    drives_training: ClassVar[bool] = False

    #: option names a scenario may set under ``strategy.options``
    options: ClassVar[tuple[str, ...]] = ()
    #: the allowed values of those options that take one of a fixed set (``int``: a count, 1..64)
    option_values: ClassVar[Mapping[str, tuple[Any, ...] | type]] = {}
    #: top-level modules the strategy imports in the ranks, and how to install them
    requires: ClassVar[Mapping[str, str]] = {}
    #: pip requirements layered over this environment for every phase of a case on this strategy,
    #: for a library that cannot share the environment with the other extras (`Case.software`);
    #: read in the harness by the scenario validator
    layered_packages: ClassVar[tuple[str, ...]] = ()
    #: a module the harness runs (``python -m``, with the case's software) as one process per node for
    #: the whole case, which the library's code in the ranks talks to: a launcher's agent that
    #: outlives its workers (`resilience.core.node_agents` says its protocol; the ranks find it
    #: through ``context.node_agent_root``). None: the strategy needs none. Read in the harness.
    node_agent: ClassVar[str | None] = None
    #: how long the survivors of a failed rank may run on before the harness SIGKILLs them (None: one
    #: second, enough to finish a write): a library that persists at a failed process's exit
    #: (``at_exit``) needs its launcher's grace (torchrun's agent waits 30 s). Read in the harness.
    failure_grace_s: ClassVar[float | None] = None
    #: the optional capabilities the class offers (`Capability`); it overrides each one's methods
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    #: a `resilience.fuzz.models.RestoreModel` subclass replaying this strategy's placement for the
    #: topology fuzzer's fast tier; read in the harness by ``fuzz.models.model_for`` (None: process tier only)
    restore_model: ClassVar[type | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse, when the class is created, capabilities declared and not implemented, or
        implemented and not declared (a misspelt method or declaration)."""
        super().__init_subclass__(**kwargs)
        problems = declaration_problems(cls, CheckpointStrategy)
        if problems:
            raise TypeError(f"strategy {cls.__module__}.{cls.__qualname__}: " + "; ".join(problems))

    @classmethod
    def capabilities_for(cls, options: Mapping[str, Any]) -> frozenset[Capability]:
        """The capabilities of this strategy configured with ``options``: ``capabilities``, less
        those its options turn off; a wrapper answers with what it forwards of its inner's. Called
        in the harness by the scenario validator (against the fault's ``requires``), and through
        ``offers`` on any rank."""
        return cls.capabilities

    def offers(self, capability: Capability) -> bool:
        """Whether this strategy, as configured (``context.options``), offers ``capability``.
        Called by faults on any rank once the strategy exists."""
        return capability in type(self).capabilities_for(self.context.options)

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> tuple[str, str, Any, Any] | None:
        """What ``option_values`` cannot say about ``options`` (already of the declared names and
        values): None, or ``(key, problem, value, allowed)`` with keys under ``strategy.options``.
        Called in the harness by ``check_option_values``, when a scenario is loaded."""
        return None

    @classmethod
    def check_option_values(cls, options: Any, key_prefix: str = OPTIONS_KEY) -> tuple[str, str, Any, Any] | None:
        """The one validation of a strategy's options: declared names, ``option_values`` (``int``:
        a count), then ``check_options``; the first problem as ``(key, problem, value, allowed)``
        with keys under ``key_prefix``, or None. Called in the harness by the scenario validator,
        and by a wrapper for its inner strategy's options."""
        return option_problem(cls, options, key_prefix)

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

    @classmethod  # noqa: B027 -- optional: nothing by default
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

    #: a wrapper's inner strategy (the one that writes the files), set by the wrapper's
    #: ``__init__``; None: no wrapper. Read on any rank by faults that act on whoever saves
    inner: CheckpointStrategy | None = None
    #: the evaluation loss the restored checkpoint recorded at save time (None: nothing restored, or
    #: none recorded), set by ``load``; read by `resilience verify --step-check` on every rank after it
    recorded_check_loss: float | None = None

    def __init__(self, context: StrategyContext):
        self.context = context

    def saves_on_sigterm(self) -> bool:
        """Whether the ranks save an emergency checkpoint on SIGTERM (`resilience.core.preemption`);
        by default the option ``save_on_sigterm``. Called on every rank of a phase that saves,
        after the restore and before the first step."""
        return bool(self.context.options.get("save_on_sigterm", False))

    # -- optional capabilities (`Capability`): declared in ``capabilities`` where overridden ----------
    def tag_for(self, step: int) -> str:
        """(``TAGS``) The tag (the directory name) this rank passes its library for the step-``step``
        save; every rank must pass the same. Called by the strategy's own ``save`` on every rank;
        the tag_mismatch fault replaces it on its trigger rank's instance at that save's start."""
        raise NotImplementedError(f"{type(self).__name__} names no tag per step")

    def in_flight_steps(self) -> list[int]:
        """(``IN_FLIGHT_STEPS``) The steps whose save returned and whose background write has not
        finished, oldest first; never waits. Called by the overlapping_async fault on its trigger
        rank, at the start of every train step from the trigger's save on."""
        raise NotImplementedError(f"{type(self).__name__} saves in the foreground only")

    def rewrite_version_stamp(self, step: int, claim: str) -> list[str]:
        """(``VERSION_STAMP``) Make this rank's files of the step-``step`` checkpoint claim an
        ``older`` or ``newer`` version of what wrote them, as an upgrade or a downgrade between save
        and restore would. Called by the version_mismatch fault on every rank, after its save
        returned; returns the files changed (relative to the checkpoint directory)."""
        raise NotImplementedError(f"{type(self).__name__} records no version")

    def during_memory_copy(self, callback) -> None:
        """(``MEMORY_COPY``) Have ``callback()`` called in the middle of every copy of this rank's state
        into the node's memory (an in-memory tier): after the copy is marked in progress and its first
        tensor is written, before the rest; ranks that copy nothing never call it. Called by the kill
        fault at point ``memory_copy`` on its trigger rank, once, right after the strategy exists."""
        raise NotImplementedError(f"{type(self).__name__} copies no state into memory")

    def restored_tier(self) -> str | None:
        """(``RESTORE_TIERS``) The tier this rank's last ``load`` restored from ("memory",
        "storage"), or None when it restored nothing. Called on every rank right after ``load``
        returned; the rank reports it with the restored step, and the oracle finds a restart whose
        ranks restored from different tiers SILENT, even where each rank's own state is valid."""
        raise NotImplementedError(f"{type(self).__name__} restores from one tier")

    @classmethod
    def micro_steps(cls, options: Mapping[str, Any]) -> int:
        """How many micro-batches one optimizer step of this strategy, configured with ``options``,
        accumulates, its loop calling ``TrainingObserver.between_micro_steps`` after each but the
        last (1: no such call). Called in the harness by the scenario validator, which refuses a
        fault at point ``micro_step`` where it is 1."""
        return 1

    @classmethod
    def workload_options(cls, options: Mapping[str, Any]) -> frozenset[str] | None:
        """The ``workload.options`` this strategy, configured with ``options``, trains with and
        saves: None, every one (the harness's loop trains the workload, and the strategy saves its
        whole ``state_dict``). A library that trains its own model (``drives_training``) takes none;
        an engine that wraps the workload names those its loop supports. Called in the harness by
        the scenario validator, which refuses the others by name."""
        return frozenset() if cls.drives_training else None

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

    def finish(self, workload: Workload) -> None:  # noqa: B027 -- optional: nothing by default
        """Commit whatever save is still in flight; called on every rank once training ended."""

    def at_exit(self, failed: bool) -> None:  # noqa: B027 -- optional: nothing by default
        """What the library's own exit handlers do as the process ends (``atexit``: a rank ends with
        ``os._exit``, which skips them). Called on every rank once, last: after its phase ended
        (``failed`` false), or after it raised and reported its error (``failed`` true; a peer's
        death reaching it in a collective included: the survivors get ``failure_grace_s``)."""

    def wait_persisted(self, step: int, timeout_s: float) -> bool:
        """Return once the step-``step`` save is in storage as a restore from storage would read
        it (True), or False after ``timeout_s``. Called on every rank once its ``save(workload,
        step)`` returned, by a fault that acts on the files at rest. A strategy whose ``save``
        writes storage before it returns answers at once (the default); one whose agent persists
        in the background waits for it."""
        return True

    @abstractmethod
    def load(self, workload: Workload) -> None:
        """Restore the newest trusted checkpoint into ``workload``, or raise; called on every rank."""

    # -- (``CHOSEN_STEP``) addressing one checkpoint, for wrappers and probes that choose one -----
    def step_location(self, step: int) -> Path | None:
        """(``CHOSEN_STEP``) The directory that holds every rank's files of the step-``step``
        checkpoint (and those of no other step), or None when the strategy has no such directory.
        Pure: it names the place, whether or not it exists. Called on any rank, after ``save(workload, step)``
        returned on every rank, and at restart before ``load_step``."""
        return None

    def load_step(self, workload: Workload, step: int) -> None:
        """(``CHOSEN_STEP``) Restore exactly the step-``step`` checkpoint into ``workload``, or
        raise. Collective: at restart every rank calls it once, in place of ``load`` (never both):
        a wrapper that picks the checkpoint (manifest) or the harness's fallback probe. A
        ``drives_training`` strategy gets the probe's step through ``train`` instead
        (``observer.start == "step"``, ``observer.snapshot_step``) and never has this called."""
        raise NotImplementedError(f"{type(self).__name__} cannot load a chosen step")
