"""Frozen data passed between layers: what one scenario file asks for, expanded into cases."""
from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

from .record_json import from_json, to_json
from .topology import Topology


class Outcome(str, enum.Enum):
    RECOVERS = "recovers"
    FAILS_LOUDLY = "fails_loudly"


class VerdictKind(str, enum.Enum):
    RECOVERED = "RECOVERED"
    LOUD = "LOUD"
    SILENT = "SILENT"
    HANG = "HANG"


EXPECTED_VERDICT = {Outcome.RECOVERS: VerdictKind.RECOVERED, Outcome.FAILS_LOUDLY: VerdictKind.LOUD}


@dataclass(frozen=True)
class WorkloadSpec:
    world_size_key: ClassVar[str] = "workload.world_size"  # where an error points for a rank's range
    model: str
    world_size: int
    steps: int
    checkpoint_every: int
    seed: int
    global_batch: int
    size_bytes: int
    rank_rng: str  # "same": identical stream on every rank; "distinct": one stream per rank
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def checkpoint_steps(self) -> tuple[int, ...]:
        return tuple(range(self.checkpoint_every, self.steps + 1, self.checkpoint_every))


@dataclass(frozen=True)
class StrategySpec:
    name: str
    options: Mapping[str, Any] = field(default_factory=dict)


MICRO_STEP = "micro_step"  # a train point: between two micro-batches of one optimizer step
MEMORY_COPY = "memory_copy"  # a save point: in the middle of a copy into the node's memory (an in-memory tier)


@dataclass(frozen=True)
class Trigger:
    """Where a fault fires: on `rank`, in `phase` of `step`, at `point`, optionally inside `file`."""

    rank: int
    step: int
    phase: str  # "save" or "train"
    point: str  # "start", "micro_step" (train), "open", "write", "fsync", "close"
    file: str  # glob relative to the checkpoint directory
    after_bytes: int | None


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    trigger: Trigger | None
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Software:
    """What ranks run under: this environment as it is (neither field), another Python interpreter,
    or this one with some packages' releases layered first on the import path."""
    python: str | None = None
    packages: tuple[str, ...] = ()  # pip requirements, installed without their dependencies

    def __bool__(self) -> bool:
        return bool(self.python or self.packages)

    def as_dict(self) -> dict[str, Any]:
        return {"python": self.python, "packages": list(self.packages)}

    @property
    def package_names(self) -> tuple[str, ...]:
        """The distribution names of ``packages`` (``deepspeed`` of ``deepspeed==0.17.6``)."""
        return tuple(re.split(r"[\[=<>!~\s]", requirement, maxsplit=1)[0] for requirement in self.packages)


THIS_ENVIRONMENT = Software()


@dataclass(frozen=True)
class RestartSpec:
    world_size: int
    rank_map: tuple[int, ...]  # rank_map[new_rank] = the rank whose place the new rank takes
    python: str | None = None  # the restart runs under this interpreter (another environment)
    packages: tuple[str, ...] = ()  # or under this one with these requirements layered over it
    topology: Topology | None = None  # TP x PP x DP and placement at restart (None: one node, pure DP)

    @property
    def placement(self) -> Topology:
        return self.topology or Topology.single_node(self.world_size)

    @property
    def software(self) -> Software:
        """The restart's own software (empty: the case's)."""
        return Software(python=self.python, packages=self.packages)


@dataclass(frozen=True)
class Incarnation:
    """One launch of the job after the first run, restoring from what the launches before it
    saved: where it runs (``restart``) and the fault armed in it (kind ``none``: it runs on)."""
    restart: RestartSpec
    fault: FaultSpec


NO_FAULT = FaultSpec(kind="none", trigger=None)


@dataclass(frozen=True)
class Expect:
    outcome: Outcome
    error: str | None  # regex searched in "Type: message" of the first loud error
    fallback_ok: bool  # restoring an older checkpoint than the newest complete one is acceptable
    fallback_required: bool = False  # a LOUD refusal fails when an older checkpoint was intact

    @property
    def verdict(self) -> VerdictKind:
        return EXPECTED_VERDICT[self.outcome]


@dataclass(frozen=True)
class KnownIssue:
    reason: str
    link: str
    verdict: VerdictKind  # the verdict the real library gives today


@dataclass(frozen=True)
class Timeouts:
    collective_s: float  # process group timeout: a collective waiting longer raises
    phase_s: float  # a phase still running after this long is a HANG


@dataclass(frozen=True)
class Case:
    """One runnable case: a scenario file with one combination of its matrix applied."""

    id: str
    source: str
    name: str
    description: str
    tier: str
    strategy: StrategySpec
    workload: WorkloadSpec
    fault: FaultSpec
    restart: RestartSpec
    expect: Expect
    known_issue: KnownIssue | None
    timeouts: Timeouts
    document: Mapping[str, Any]  # the case as a plain scenario document, for replay and for workers
    topology: Topology | None = None  # of the reference and the first run (None: one node, pure DP)
    object_store: str | None = None  # "s3": checkpoints go to a bucket of the case's own (None: a directory)
    # a scenario's ``timeline``: every launch after the first run (``restart`` is the first of them);
    # empty: the one restart, with no fault of its own
    timeline: tuple[Incarnation, ...] = ()
    # fresh ranks restore the first run's earlier saves right after it (`oracle.saved_check`)
    verify_saves: bool = False
    # every phase's software (the reference's too) unless the restart names its own
    software: Software = THIS_ENVIRONMENT

    @property
    def incarnations(self) -> tuple[Incarnation, ...]:
        """The launches after the first run, in order: the timeline's, or the one restart."""
        return self.timeline or (Incarnation(restart=self.restart, fault=NO_FAULT),)

    def incarnation_document(self, index: int) -> dict[str, Any]:
        """The case as launch ``index`` of its timeline (0: the first run) runs it: a plain case
        document with that launch's fault, and its placement as the restart, for its ranks to read.
        A launch at another world size runs as a job of that size (its fault names its ranks)."""
        entries = self.document["timeline"]
        doc = {key: value for key, value in self.document.items() if key != "timeline"}
        # the restart keeps a first-run fault that acts there too (`Fault.arms_at_restart`)
        doc["fault"] = entries[index].get("fault", entries[0].get("fault", "none") if index == 1 else "none")
        doc["restart"] = {key: value for key, value in entries[max(index, 1)].items() if key != "fault"}
        size = doc["restart"].get("world_size", self.workload.world_size)
        if index >= 1 and size != self.workload.world_size:  # its ranks, its fault's ranks: its own size
            doc["workload"] = {**doc["workload"], "world_size": size}
            doc.pop("topology", None)
            if "topology" in doc["restart"]:
                doc["topology"] = doc["restart"]["topology"]
        return doc

    @property
    def placement(self) -> Topology:
        return self.topology or Topology.single_node(self.workload.world_size)

    @property
    def topology_changes(self) -> bool:
        """Whether the restart computes differently (another TP, PP or DP degree), so the oracle is
        a continuation on the restart's topology. A new placement alone changes only who sees
        which files; the reference stays the oracle."""
        return self.restart.placement.parallel != self.placement.parallel

    @property
    def restart_software(self) -> Software:
        """The software the restart and every later launch run under: the restart's own, else the case's."""
        return self.restart.software or self.software

    @property
    def software_changes(self) -> bool:
        """Whether the restart runs other software than the first run (another interpreter, other
        packages layered first), which may compute other bits from the same state."""
        return self.restart_software != self.software

    def launch_software(self, index: int) -> Software:
        """What launch ``index`` runs under (0: the first run; 1: the restart; then the timeline's)."""
        return self.software if index == 0 else self.incarnations[index - 1].restart.software or self.software

    def launch_placement(self, index: int) -> Topology:
        """Where launch ``index`` runs (0: the first run)."""
        return self.placement if index == 0 else self.incarnations[index - 1].restart.placement

    def computes_alike(self, one: int, other: int) -> bool:
        """Whether launches ``one`` and ``other`` compute the same bits from the same state: the same
        parallel layout (TP, PP, DP) and the same software."""
        return (self.launch_placement(one).parallel == self.launch_placement(other).parallel
                and self.launch_software(one) == self.launch_software(other))

    @property
    def keeps_snapshots(self) -> bool:
        """Whether some launch computes otherwise than the first run, so that the reference keeps
        trusted snapshots for the continuations that judge it."""
        return any(not self.computes_alike(0, index) for index in range(1, len(self.incarnations) + 1))

    @property
    def continuation_is_oracle(self) -> bool:
        """Whether the restart is judged against a continuation: the trusted reference state at the
        restored step, trained on by the restart's own topology and software."""
        return self.topology_changes or self.software_changes

    def write(self, path: Path) -> None:
        """The case file every rank reads back (`read`): the validated records themselves, so the
        ranks run exactly what the controller validated, and validate nothing again."""
        path.write_text(json.dumps(to_json(self)))

    @classmethod
    def read(cls, path: Path) -> Case:
        """The case the controller wrote with `write`."""
        return from_json(cls, json.loads(Path(path).read_text()))


@dataclass(frozen=True)
class Scenario:
    path: str
    name: str
    cases: tuple[Case, ...]
