"""A case on a user's own script (black-box mode): the script and its command line (`ScriptSpec`),
the launches of a timeline (`ScriptLaunch`), and the case (`ScriptCase`)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .case import Expect, FaultSpec, KnownIssue, Timeouts


@dataclass(frozen=True)
class ScriptSpec:
    """A user's own training script, run unmodified under torchrun (black-box mode)."""

    path: str  # absolute, resolved against the scenario file's directory
    args: tuple[str, ...] = ()  # ``{checkpoint_dir}`` stands for the run's checkpoint directory
    restart_args: tuple[str, ...] | None = None  # the restart's own arguments (None: ``args``)
    nproc_per_node: int = 2
    nnodes: int = 1  # nodes, each a network namespace on this machine with an agent of its own
    restart_nproc_per_node: int | None = None  # the restart's ranks per node (None: the same)
    #: resumes the job at ``restart_nproc_per_node`` ranks, uninterrupted: the oracle of the
    #: rescaled restart's losses (None: they are not judged)
    continuation_args: tuple[str, ...] | None = None
    max_restarts: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    oracle: str = "bitwise"  # or "envelope": within the spread of ``references`` uninterrupted runs
    references: int = 2  # uninterrupted runs (bitwise: two, to see that the script is reproducible)
    envelope_factor: float = 2.0  # how far the envelope widens the references' spread around its middle


@dataclass(frozen=True)
class ScriptLaunch:
    """One launch of a script's timeline: the job run again with ``args`` from the checkpoints of the
    launches before it, with ``fault`` armed in it (its trigger step counts this launch's own steps)."""

    fault: FaultSpec
    args: tuple[str, ...]


@dataclass(frozen=True)
class ScriptCase:
    """One case on a user's script: a scenario file whose ``script`` replaces strategy and workload."""

    id: str
    source: str
    name: str
    description: str
    tier: str
    script: ScriptSpec
    fault: FaultSpec
    expect: Expect
    known_issue: KnownIssue | None
    timeouts: Timeouts
    #: the launches after the first run (``timeline``), each with its fault and arguments; empty:
    #: the first run's ``fault`` and one restart
    timeline: tuple[ScriptLaunch, ...] = ()
