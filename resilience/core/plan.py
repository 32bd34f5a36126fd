"""The plan of one phase, handed from the harness to every rank process as a JSON file."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .wire import WireName

REFERENCE, FIRST_RUN, RESTART, CONTINUATION = "reference", "first_run", "restart", "continuation"
SAVED_CHECK = "saved_check"  # fresh ranks restore every earlier save of the first run: lost at save time?
FALLBACK = "fallback"  # after a refused restore: an older checkpoint restored with load_step in fresh ranks


class Start(WireName):
    """How a phase's ranks begin (`PhasePlan.start`), as strategies read it (`TrainingObserver.start`)."""

    FRESH = "fresh"  # from the workload's initial state
    STRATEGY = "strategy"  # strategy.load: the library's own checkpoint, as a restart restores it
    STEP = "step"  # strategy.load_step(snapshot_step): exactly that checkpoint (the availability probe)
    SNAPSHOT = "snapshot"  # the trusted reference snapshot of snapshot_step (the oracle's continuation)
    VERIFY = "verify"  # each of verify_steps with load_step, reported, no training (the saved check)


RESTORING_STARTS = (Start.STRATEGY, Start.STEP, Start.VERIFY)  # the starts that restore from the checkpoint


def launch_name(index: int) -> str:
    """The phase name of launch ``index`` after the first run: ``restart``, ``restart_2``, ..."""
    return RESTART if index == 1 else f"{RESTART}_{index}"


def events_file(phase_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` of the phase in ``phase_dir`` writes its events."""
    return phase_dir / f"rank{rank}.events.jsonl"


@dataclass(frozen=True)
class PhasePlan:
    name: str
    case_file: str  # the validated case (`Case.write`), which the ranks read back with `Case.read`
    world_size: int
    store_path: str  # FileStore rendezvous: no port, nothing listening
    checkpoint_dir: str
    phase_dir: str  # events and logs of each rank
    start: Start
    save: bool  # call strategy.save after each checkpoint step
    inject: bool  # arm the case's fault
    record_states: bool  # emit the state fingerprint at step 0 and after every step
    snapshot_dir: str | None  # reference: where to write trusted snapshots; continuation: where to read
    snapshot_step: int | None  # continuation: the step to start from; fallback: the checkpoint step to load
    rank_map: tuple[int, ...]
    collective_timeout_s: float
    topology: dict | None = None  # `Topology.as_dict()` of this phase (None: one node, pure DP)
    object_store: dict | None = None  # {"url": "s3://bucket/prefix", "endpoint": ...} (None: checkpoint_dir)
    # directories a restoring phase must not need (the first run's phase directory): what its ranks
    # open there is a finding (`resilience.rank.working_dir`)
    foreign_roots: tuple[str, ...] = ()
    # start "verify": the checkpoint steps to restore one after the other with load_step, each
    # reported (a ``verified`` event), no training: saves checked where they were made
    verify_steps: tuple[int, ...] = ()
    node_agents: str | None = None  # the root of the case's node agents (`resilience.core.node_agents`)
    # every path under checkpoint_dir the ranks look at, reported (the explorer's reduction)
    observe_paths: bool = False

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> "PhasePlan":
        data = json.loads(Path(path).read_text())
        data["start"] = Start(data["start"])
        data["rank_map"] = tuple(data["rank_map"])
        data["foreign_roots"] = tuple(data.get("foreign_roots", ()))
        data["verify_steps"] = tuple(data.get("verify_steps", ()))
        return cls(**data)

    def placement(self):
        from .topology import Topology

        return Topology.from_dict(self.topology) if self.topology else Topology.single_node(self.world_size)

    def events_path(self, rank: int) -> Path:
        return events_file(Path(self.phase_dir), rank)

    def log_paths(self, rank: int) -> tuple[Path, Path]:
        return Path(self.phase_dir) / f"rank{rank}.out", Path(self.phase_dir) / f"rank{rank}.err"
