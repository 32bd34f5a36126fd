"""The contract every fault implements, on the harness side and inside the rank processes.

A fault is a `Fault`: its harness side (`HarnessSide`: setup, supervise, heal, findings, notes,
teardown) and its rank side (`RankSide`: arm, attach, at, after_save, and the trigger). A fault
that acts on the files of a save also inherits `WriteListener` (wants, on_open, on_write, on_fsync,
before_close, after_close); one that acts on the reads of a restore, `ReadListener` (wants_read,
on_open_read, on_read). Each role's docstring gives its call order and the process that calls it.
This module is the stable import path of the whole contract (the environments and clocks too).
"""
from __future__ import annotations

from typing import Any, ClassVar

from ..core.capabilities import Capability
from ..core.case import Case, FaultSpec, Trigger
from ..disk.interception import STAGING_PREFIX, InterceptedFile
from ..errors import FaultUnavailable, Unavailable
from .environment import CaseEnvironment, Clock, FollowedClock, RankEnvironment
from .listeners import ReadListener, WriteListener, hooks_of
from .roles import HarnessSide, RankSide

__all__ = ["Capability", "CaseEnvironment", "Clock", "Fault", "FaultUnavailable", "FollowedClock", "HarnessSide",
           "RankEnvironment", "RankSide", "ReadListener", "Unavailable", "WriteListener",
           # importable from here before the roles were split out, and still
           "Case", "FaultSpec", "InterceptedFile", "STAGING_PREFIX", "Trigger"]


class Fault(HarnessSide, RankSide):
    """A fault: what goes wrong, and a trigger saying when (`HarnessSide` + `RankSide`; see their
    docstrings for the call order). Subclass it, add `WriteListener` or `ReadListener` to the bases
    where the fault acts on files, and name it in a scenario as ``fault.kind: package.module:Class``.

    A fault whose ``explores`` is true gets the same calls in the first run, which then ends; the
    harness hands the case to `resilience.run.explore`, which runs the restarts itself.
    """

    kind: ClassVar[str] = ""
    #: kind-specific keys: name -> (allowed values, ``float`` for a number > 0, ``str`` for an optional
    #: name or glob, or ``object`` for any JSON value that ``check`` validates; default)
    params: ClassVar[dict[str, tuple[tuple[str, ...] | type, Any]]] = {}
    #: whether the fault means something when checkpoints go to an object store (``object_store``);
    #: read by the scenario validator
    on_objects: ClassVar[bool] = False
    #: whether the fault needs one (it acts on the store's requests); read by the scenario validator
    needs_object_store: ClassVar[bool] = False
    #: the strategy capabilities the fault needs (`resilience.core.capabilities`): the scenario
    #: validator checks them once, at load, against ``CheckpointStrategy.capabilities_for(options)``
    #: and refuses a case whose strategy lacks one
    requires: ClassVar[frozenset[Capability]] = frozenset()
    #: whether a timeline may arm the fault in a launch after the first run: it acts from its
    #: trigger alone, inside that launch (no first-run-only setup, heal or findings); read by the
    #: scenario validator
    in_timelines: ClassVar[bool] = False
    #: whether the fault leaves saved files alone (it stops processes or the network, or nothing):
    #: a case then verifies its saves where they were made unless it says ``verify_saves: false``
    leaves_saves_alone: ClassVar[bool] = False

    def __init__(self, spec: FaultSpec):
        self.spec = spec
        self.trigger: Trigger | None = spec.trigger
        self.env: RankEnvironment | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A listener's hooks without the listener role would never be called: refused at once."""
        super().__init_subclass__(**kwargs)
        for role in (WriteListener, ReadListener):
            if issubclass(cls, role):
                continue
            stray = [name for name in hooks_of(role) if any(name in vars(k) for k in cls.__mro__)]
            if stray:
                raise TypeError(f"{cls.__qualname__} defines {', '.join(stray)} but does not inherit {role.__name__} "
                                f"(resilience.faults.base): add it to the class's bases, or the rank never calls them")

    @classmethod
    def check(cls, spec: FaultSpec) -> tuple[str, str, Any, Any] | None:
        """Kind-specific validation: None, or (key, problem, value, allowed) for the loader to report."""
        return None

    @classmethod
    def script_problem(cls) -> str | None:
        """Why a case on a user's own script (black-box mode) cannot take this fault, or None. Such
        a case offers no strategy (no capability, nothing to ``attach`` to), no ranks of the
        framework's own to drive (signals to the script's ranks do: ``supervises_by_signals``; a
        fault that ends its own node, ``acts_in_its_node``, needs no driving on a script's nodes); a
        fault that ``explores`` is explored through restarts of the script
        (`resilience.run.script_explore`); its harness side gets a `CaseEnvironment` without a case."""
        if cls.requires:
            return "it needs a capability a strategy declares"
        if cls.supervises and not (cls.supervises_by_signals or cls.acts_in_its_node):
            return "it drives the framework's own ranks from the harness"
        if cls.attach is not RankSide.attach and not cls.strategy_points:
            return "it acts on the strategy object"
        return None

    @classmethod
    def check_strategy(cls, strategy: type) -> tuple[str, str, Any, Any] | None:
        """Whether the fault can act on this strategy class beyond what ``requires`` says: None, or
        what the loader reports."""
        return None
