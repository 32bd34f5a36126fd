"""What a fault sees of the world: the case's directories on the harness side (`CaseEnvironment`),
the rank, its clock and its event log inside a rank process (`RankEnvironment`, `Clock`), and a
rank's published clock inside a helper process the rank's libraries started (`FollowedClock`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..core.case import Case
from ..core.events import ClockPhase
from ..core.node_agents import NodeAgentControl


@dataclass
class Clock:
    """Where a rank is: maintained by the worker, read by faults to decide whether they fire.

    With ``publish_to`` set, every change is also written to that file, for the helper processes
    the rank's libraries start (they see it through `FollowedClock`)."""

    phase: ClockPhase = ClockPhase.IDLE
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
        return ClockPhase.SAVE if self.step else ClockPhase.IDLE


@dataclass(frozen=True)
class CaseEnvironment:
    """What the harness side of a fault may touch: the case's own directories. ``case`` is None for
    a user's own script (black-box mode), which has no workload to size a fault by."""

    case: Case | None
    case_dir: Path
    checkpoint_dir: Path
    object_store: Any = None  # the case's `resilience.objectstore.server.S3Store`, when it has one
    node_agents: NodeAgentControl | None = None  # the case's node agents, when its strategy keeps them
    script_ranks: int = 0  # a user's script: the first run's world size (a case's is its workload's)

    @property
    def world_size(self) -> int:
        """The first run's world size, of the case's workload or of the script."""
        return self.case.workload.world_size if self.case is not None else self.script_ranks


@dataclass(frozen=True)
class RankEnvironment:
    """What the rank side of a fault sees in the first run's rank processes."""

    rank: int
    world_size: int
    checkpoint_dir: Path
    clock: Clock
    emit: Callable[..., None] = field(repr=False)  # emit(event_name, **fields) into the rank's event log
    case_dir: Path | None = None  # CaseEnvironment.case_dir: what the harness side left for the ranks
    process: str = "rank"  # or "helper" (a child of the rank's libraries) or "agent" (its node's): helper_hook
    node_index: int = 0  # an agent: its node's place among the case's nodes
    incarnation: str = "first_run"  # or "restart": only for faults whose ``arms_at_restart`` is true
    checkpoint_url: str | None = None  # the case's object store (``s3://...``) in place of checkpoint_dir
