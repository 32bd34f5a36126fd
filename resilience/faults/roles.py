"""The two sides every fault has: what the harness process does around the runs (`HarnessSide`) and
what the rank processes do at the trigger (`RankSide`). `resilience.faults.base.Fault` combines
both; a fault that acts on files also takes a listener role (`resilience.faults.listeners`)."""
from __future__ import annotations

from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, ClassVar

from ..core.events import ClockPhase, Event
from ..disk.interception import STAGING_PREFIX
from .environment import CaseEnvironment, RankEnvironment

if TYPE_CHECKING:
    from ..core.case import FaultSpec, Trigger
    from ..core.records import PhaseResult
    from ..disk.interception import InterceptedFile


class HarnessSide:
    """What the fault does in the harness process (the local harness, or each node's driver under
    torchrun), around the runs rather than inside them.

    Call order, harness process: ``setup(env)`` before the first run; ``supervise(events, ranks)``
    repeatedly while the first run goes on (only with ``supervises``); ``heal(env)`` after the first
    run ended, before the restart; ``findings(env, phases)`` then ``notes(env, phases)`` once the
    last phase ended, before the verdict; ``teardown(env)`` always, last, even when an earlier call
    raised. ``env`` is the case's `CaseEnvironment`.
    """

    spec: FaultSpec
    trigger: Trigger | None

    #: whether the harness calls ``supervise`` while the first run goes on (run.harness, and the
    #: torchrun launcher, which refuses a supervising fault unless its node's driver can drive it)
    supervises: ClassVar[bool] = False
    #: whether ``supervise`` acts on the ranks only by signals to their pids, which reach any
    #: launcher's ranks: a user's own script under torchrun too (read by ``Fault.script_problem``)
    supervises_by_signals: ClassVar[bool] = False
    #: whether the harness hands the case to the crash-state explorer (`resilience.run.explore`)
    #: after the first run (run.harness and the ``explore`` command read it before the case runs)
    explores: ClassVar[bool] = False
    #: whether, with ``scope: node`` under torchrun on several nodes, the trigger node's driver runs
    #: ``supervise`` for its own ranks (read by launch.torchrun_command when it checks the case, and
    #: by run.torchrun, which then hands the fault to each launch)
    node_scoped: ClassVar[bool] = False
    #: whether the trigger rank ends its whole node itself, needing nothing from the driver (read by
    #: launch.torchrun_command: such a fault needs several nodes, and may supervise under torchrun)
    acts_in_its_node: ClassVar[bool] = False
    #: whether each first-run rank joins a network namespace of the case's own (read by the script
    #: validator, which refuses it on a script whose nodes are namespaces already)
    joins_rank_namespaces: ClassVar[bool] = False
    #: whether the node-scoped fault acts in the node's own network namespace (read by
    #: launch.torchrun_command: it refuses the case where the node is not a namespace)
    needs_node_namespace: ClassVar[bool] = False

    def setup(self, env: CaseEnvironment) -> None:
        """Before the first run: build what the fault needs (a mount, namespaces, a proxy rule);
        raise `FaultUnavailable` where this machine cannot."""

    def supervise(self, events: list[dict], ranks: list) -> None:
        """Only if ``supervises``: called repeatedly while the first run goes on, with every event
        the ranks emitted so far and their `RankProcess` handles (to signal them)."""

    def heal(self, env: CaseEnvironment) -> None:
        """After the first run ended, before the restart: the operator's repair (freeing disk
        space, lifting a rule), or the step between the runs the fault plays."""

    def findings(self, env: CaseEnvironment, phases: tuple[PhaseResult, ...]) -> tuple[str, ...]:
        """What the fault itself saw go wrong that the ranks' events cannot show (a checkpoint file
        that ran code when loaded): each finding makes the verdict SILENT. Called once every phase
        ended, before the verdict and before ``teardown``."""
        return ()

    def notes(self, env: CaseEnvironment, phases: tuple[PhaseResult, ...]) -> tuple[str, ...]:
        """What the fault did, in words, for the verdict's notes (never changes the verdict): how a
        crashed rank ended, say. Called once every phase ended, after ``findings``."""
        return ()

    def teardown(self, env: CaseEnvironment) -> None:
        """Always, last: undo ``setup`` (unmount, delete namespaces, kill what the fault started)."""


class RankSide:
    """What the fault does inside the rank processes, and the trigger that says when.

    Call order, in every rank process of the first run (the fault checks its trigger's rank
    itself): ``arm(env)`` once, before the strategy exists; ``attach(strategy)`` once, right after
    it exists (before ``prepare``); ``at(phase, step)`` each time the rank enters a train step or a
    save; ``after_save(strategy, step)`` each time its save returned. Restarted ranks get no fault
    unless ``arms_at_restart``: then the same calls run there (``env.incarnation == "restart"``).
    With ``reaches_helpers()``, ``arm`` runs in the processes the rank's libraries start too
    (``env.process == "helper"``), whose writes reach the fault's `WriteListener` hooks. A node
    agent armed with it (``process: agent``, or ``in_every_node_agent``) gets ``arm`` with
    ``env.process == "agent"``, then ``agent_persisting`` around each of its background saves.
    A fault that fires calls ``fired(...)`` first, so the event is on record before it acts.
    """

    spec: FaultSpec
    trigger: Trigger | None
    env: RankEnvironment | None

    #: whether the case needs a trigger at all (false: the fault acts from the harness side only);
    #: read by the scenario validator
    needs_trigger: ClassVar[bool] = True
    #: whether the trigger names a rank (false: the fault hits every rank; the trigger's rank is 0);
    #: read by the scenario validator
    needs_rank: ClassVar[bool] = True
    #: trigger points allowed per phase; the first is the default (the scenario validator, the catalog)
    points: ClassVar[dict[str, tuple[str, ...]]] = {
        "save": ("start", "open", "write", "fsync", "close"), "train": ("start",)}
    #: the trigger points at which ``attach`` uses the strategy object, which a user's script lacks
    #: (its validator refuses them); empty: ``attach``, if overridden, always does
    strategy_points: ClassVar[tuple[str, ...]] = ()
    #: points at which ``after_bytes`` means something (the scenario validator)
    byte_points: ClassVar[tuple[str, ...]] = ("write",)
    #: the selectors (``written_by``, ``pointer``: `resilience.disk.trace_targets`) the trigger's
    #: ``file`` may be, resolved by the rank side from its IO trace; read by the scenario validator
    #: at load, which refuses any other selector
    trace_targets: ClassVar[tuple[str, ...]] = ()
    #: whether ``after_save`` may also be called as the rank's process exits normally inside a save
    #: (a script's final save, which no backward follows: black-box mode): the fault then needs
    #: no peer, since the others may be gone already; read by the black-box startup hook
    after_save_at_exit: ClassVar[bool] = False
    #: whether every node agent of the first run is armed too, where the strategy keeps them
    #: (``env.process == "agent"``, hearing ``agent_persisting``); read by the harness as it starts them
    in_every_node_agent: ClassVar[bool] = False
    #: whether the restart's ranks arm the fault too (faults that act on the restore's reads); read
    #: by the worker when it starts a restarted rank
    arms_at_restart: ClassVar[bool] = False

    def reaches_helpers(self) -> bool:
        """Whether the fault acts in the processes a rank's libraries start on their own (a
        checkpoint writer started with the spawn method, or forked): then it is armed there too,
        through a startup hook, with ``env.process == "helper"``. Asked by the worker, before ``arm``."""
        return False

    def arm(self, env: RankEnvironment) -> None:
        """Once per rank process, before the strategy exists (the main thread)."""
        self.env = env

    def attach(self, strategy: Any) -> None:
        """The rank's strategy, once constructed (a fault that plays a bug of the training script
        around it, e.g. a rank passing another tag, keeps it). Main thread, rank processes only."""

    def at(self, phase: ClockPhase, step: int) -> None:
        """The rank enters ``phase`` (``ClockPhase.TRAIN`` or ``SAVE``) of ``step``: called by the rank's loop
        in its main thread, before the step's all-reduce or the save's first file."""

    def after_save(self, strategy: Any, step: int) -> None:
        """The rank's ``strategy.save`` for ``step`` returned (main thread, before the next step).
        ``strategy`` is None in a user's script (black-box mode): its own code saved."""

    def agent_persisting(self, step: int, returned: bool) -> None:
        """In a node agent (``env.process == "agent"``, `rank.helper_hook`): the agent's background
        save of ``step`` began (``returned`` false), or returned. Called in the agent's saver thread."""

    def between_micro_steps(self, step: int) -> None:
        """The rank finished a micro-batch of ``step`` that is not the step's last (forward and
        backward, gradients accumulated, no optimizer step yet), before the next one: called after
        ``at("train", step)``, once per such micro-batch, by a library's loop that accumulates (a
        strategy whose ``micro_steps`` is 2 or more), in the rank's main thread. A step whose
        batch runs short (an epoch's leftover micro-batch) has none."""

    # -- trigger helpers ------------------------------------------------------------------------
    def on_trigger_rank(self) -> bool:
        """This process belongs to the trigger's rank."""
        return self.env is not None and self.trigger is not None and self.env.rank == self.trigger.rank

    def in_trigger_window(self) -> bool:
        """This rank is at the trigger's step and phase."""
        clock = self.env.clock if self.env else None
        return (self.on_trigger_rank() and clock.phase == self.trigger.phase
                and clock.step == self.trigger.step)

    def file_matches(self, file: InterceptedFile) -> bool:
        """The intercepted file matches the trigger's ``file`` glob."""
        return self.path_matches(file.relative)

    def path_matches(self, relative: str) -> bool:
        """``relative`` (to the checkpoint directory, or ``$TMPDIR/...``) matches the trigger's glob."""
        if relative.startswith(STAGING_PREFIX) and not self.trigger.file.startswith(STAGING_PREFIX):
            return False  # a staged file only when the glob names $TMPDIR itself
        return fnmatchcase(relative, self.trigger.file)

    def fired(self, **detail: Any) -> None:
        """Put ``fault_fired`` on record in the rank's event log, before the fault acts."""
        clock = self.env.clock
        self.env.emit(Event.FAULT_FIRED, kind=self.spec.kind, step=clock.step, phase=clock.phase, **detail)
