"""The contract every fault implements, on the harness side and inside the rank processes."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from ..errors import FaultUnavailable, Unavailable
from ..disk.interception import STAGING_PREFIX, InterceptedFile
from ..core.case import Case, FaultSpec, Trigger

if TYPE_CHECKING:
    from ..core.records import PhaseResult


@dataclass
class Clock:
    """Where a rank is: maintained by the worker, read by faults to decide whether they fire.

    With ``publish_to`` set, every change is also written to that file, for the helper processes
    the rank's libraries start (they see it through `FollowedClock`)."""

    phase: str = "idle"  # "train", "save" or "idle"
    step: int = 0
    save_step: int = 0  # the step of the last save this rank began (0: none yet)
    publish_to: Path | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        target = self.__dict__.get("publish_to")
        if name == "save_step" and target is not None:
            staging = target.with_name(target.name + ".tmp")
            staging.write_text(str(self.save_step))
            os.replace(staging, target)  # a reader sees the old or the new step, never half


class FollowedClock:
    """A rank's published `Clock`, read from a helper process the rank started.

    A helper writes for the save its rank began last, also after the rank's call returned (a
    background writer: the rank trains on meanwhile), so it is always "in" that save."""

    def __init__(self, path: Path):
        self.path = path

    @property
    def step(self) -> int:
        try:
            return int(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return 0

    @property
    def save_step(self) -> int:
        return self.step

    @property
    def phase(self) -> str:
        return "save" if self.step else "idle"


@dataclass(frozen=True)
class CaseEnvironment:
    """What the harness side of a fault may touch: the case's own directories."""

    case: Case
    case_dir: Path
    checkpoint_dir: Path
    object_store: Any = None  # the case's `resilience.objectstore.server.S3Store`, when it has one


@dataclass(frozen=True)
class RankEnvironment:
    """What the rank side of a fault sees in the first run's rank processes."""

    rank: int
    world_size: int
    checkpoint_dir: Path
    clock: Clock
    emit: Callable[..., None] = field(repr=False)  # emit(event_name, **fields) into the rank's event log
    case_dir: Path | None = None  # CaseEnvironment.case_dir: what the harness side left for the ranks
    process: str = "rank"  # or "helper": a process the rank's libraries started (see helper_hook)
    incarnation: str = "first_run"  # or "restart": only for faults whose ``arms_at_restart`` is true
    checkpoint_url: str | None = None  # the case's object store (``s3://...``) in place of checkpoint_dir


class Fault:
    """A fault: what goes wrong, and a trigger saying when.

    Call order.
    Harness process: ``setup(env)`` before the first run; ``heal(env)`` after the first run ended
    (the operator's repair, e.g. freeing disk space), before the restart; ``findings(env, phases)``
    then ``notes(env, phases)`` once the last phase ended (before the verdict); ``teardown(env)`` always, last, even when an
    earlier call raised.
    Rank processes of the first run (every rank; the fault checks its trigger's rank itself):
    ``arm(env)`` once, before the strategy exists; ``attach(strategy)`` once, right after it
    exists (before ``prepare``); ``at(phase, step)`` when the rank enters a train
    step or a save; ``after_save(strategy, step)`` when its save returned; the IO hooks (``on_open``, ``on_write``, ``on_fsync``, ``before_close``,
    ``after_close``) for files under the checkpoint directory. Restarted ranks get no fault,
    unless ``arms_at_restart``: then ``arm(env)`` runs there too (``env.incarnation == "restart"``),
    before the strategy exists, and the read hooks (``wants_read``, ``on_open_read``, ``on_read``)
    see the restore's reads when ``needs_read_interception()``.
    A fault that fires calls ``fired(...)`` first, so the event is on record before it acts.
    A fault whose ``explores`` is true gets the same calls in the first run, which then ends; the
    harness hands the case to `resilience.run.explore`, which runs the restarts itself.
    """

    kind: ClassVar[str] = ""
    needs_trigger: ClassVar[bool] = True
    #: whether the trigger names a rank (false: the fault hits every rank; the trigger's rank is 0)
    needs_rank: ClassVar[bool] = True
    #: whether the harness hands the case to the crash-state explorer (`resilience.run.explore`)
    explores: ClassVar[bool] = False
    #: trigger points allowed per phase; the first is the default
    points: ClassVar[dict[str, tuple[str, ...]]] = {
        "save": ("start", "open", "write", "fsync", "close"), "train": ("start",)}
    #: points at which ``after_bytes`` means something
    byte_points: ClassVar[tuple[str, ...]] = ("write",)
    #: kind-specific keys: name -> (allowed values, ``float`` for a number > 0, ``str`` for an optional
    #: name or glob, or ``object`` for any JSON value that ``check`` validates; default)
    params: ClassVar[dict[str, tuple[tuple[str, ...] | type, Any]]] = {}
    #: whether the harness calls ``supervise`` while the first run is going on
    supervises: ClassVar[bool] = False
    #: whether the restart's ranks arm the fault too (faults that act on the restore's reads)
    arms_at_restart: ClassVar[bool] = False
    #: whether the fault means something when checkpoints go to an object store (``object_store``)
    on_objects: ClassVar[bool] = False
    #: whether the fault needs one (it acts on the store's requests)
    needs_object_store: ClassVar[bool] = False

    def __init__(self, spec: FaultSpec):
        self.spec = spec
        self.trigger: Trigger | None = spec.trigger
        self.env: RankEnvironment | None = None

    @classmethod
    def check(cls, spec: FaultSpec) -> tuple[str, str, Any, Any] | None:
        """Kind-specific validation: None, or (key, problem, value, allowed) for the loader to report."""
        return None

    @classmethod
    def check_strategy(cls, strategy: type) -> tuple[str, str, Any, Any] | None:
        """Whether the fault can act on this strategy class: None, or what the loader reports."""
        return None

    def needs_interception(self) -> bool:
        """Whether the rank must route checkpoint writes through the interception layer."""
        return False

    def needs_read_interception(self) -> bool:
        """Whether the rank must route reads under the checkpoint directory through
        `resilience.disk.read_interception` (only then are reads wrapped at all)."""
        return False

    def reaches_helpers(self) -> bool:
        """Whether the fault acts in the processes a rank's libraries start on their own (a
        checkpoint writer started with the spawn method): then it is armed there too, through a
        startup hook, with ``env.process == "helper"``."""
        return False

    # -- harness side ---------------------------------------------------------------------------
    def setup(self, env: CaseEnvironment) -> None:
        pass

    def heal(self, env: CaseEnvironment) -> None:
        pass

    def teardown(self, env: CaseEnvironment) -> None:
        pass

    def findings(self, env: CaseEnvironment, phases: tuple[PhaseResult, ...]) -> tuple[str, ...]:
        """What the fault itself saw go wrong that the ranks' events cannot show (a checkpoint file
        that ran code when loaded): each finding makes the verdict SILENT. Called once every phase
        ended, before the verdict and before ``teardown``."""
        return ()

    def notes(self, env: CaseEnvironment, phases: tuple[PhaseResult, ...]) -> tuple[str, ...]:
        """What the fault did, in words, for the verdict's notes (never changes the verdict): how a
        crashed rank ended, say. Called once every phase ended, after ``findings``."""
        return ()

    def supervise(self, events: list[dict], ranks: list) -> None:
        """Only if ``supervises``: called repeatedly while the first run goes on, with every event
        the ranks emitted so far and their `RankProcess` handles (to signal them)."""

    # -- rank side ------------------------------------------------------------------------------
    def arm(self, env: RankEnvironment) -> None:
        self.env = env

    def attach(self, strategy: Any) -> None:
        """The rank's strategy, once constructed (a fault that plays a bug of the training script
        around it, e.g. a rank passing another tag, keeps it)."""

    def at(self, phase: str, step: int) -> None:
        pass

    def after_save(self, strategy: Any, step: int) -> None:
        """The rank's ``strategy.save`` for ``step`` returned (called before the next step)."""

    def wants(self, relative: str) -> bool:
        """Whether this fault needs to see the writes of the file being opened (see IOListener)."""
        return False

    def on_open(self, file: InterceptedFile) -> None:
        pass

    def on_write(self, file: InterceptedFile, data: Any, nbytes: int) -> None:
        pass

    def on_fsync(self, file: InterceptedFile) -> None:
        pass

    def before_close(self, file: InterceptedFile) -> None:
        pass

    def after_close(self, file: InterceptedFile) -> None:
        pass

    def wants_read(self, relative: str) -> bool:
        """Whether this fault needs to see the reads of the file being opened (see ReadListener)."""
        return False

    def on_open_read(self, path: Path, relative: str) -> None:
        pass

    def on_read(self, file: Any, nbytes: int) -> None:
        pass

    # -- helpers for subclasses -----------------------------------------------------------------
    def on_trigger_rank(self) -> bool:
        return self.env is not None and self.trigger is not None and self.env.rank == self.trigger.rank

    def in_trigger_window(self) -> bool:
        """This rank is at the trigger's step and phase."""
        clock = self.env.clock if self.env else None
        return (self.on_trigger_rank() and clock.phase == self.trigger.phase
                and clock.step == self.trigger.step)

    def file_matches(self, file: InterceptedFile) -> bool:
        return self.path_matches(file.relative)

    def path_matches(self, relative: str) -> bool:
        if relative.startswith(STAGING_PREFIX) and not self.trigger.file.startswith(STAGING_PREFIX):
            return False  # a staged file only when the glob names $TMPDIR itself
        return fnmatchcase(relative, self.trigger.file)

    def fired(self, **detail: Any) -> None:
        clock = self.env.clock
        self.env.emit("fault_fired", kind=self.spec.kind, step=clock.step, phase=clock.phase, **detail)
