"""The files of one case run under torchrun, shared by the driver and the ranks (on several nodes the
case directory must be on a filesystem every node sees, as the checkpoint directory must anyway).

    CASE_DIR/
      case.json                    the case every rank reads
      checkpoints/                 the strategy's directory
      tmp/                         TMPDIR of torchrun (its torchelastic_* directories) and of the ranks
      plans/<phase>.json           the driver's plan of each phase; a rank sets its incarnation's directory
      plans/<phase>.size<N>.json   the plan for a group of N ranks (elastic: a spare grew the job back)
      launch<L>.restart<R>/        one incarnation: the driver's launch L, TORCHELASTIC_RESTART_COUNT R
        <phase>/                   plan.json, rank<r>.events.jsonl, rank<r>.out, rank<r>.err
        outcome.rank<r>.json       how the rank process ended, written by its supervisor
      torchrun.launch<L>[.<addr>].log  torchrun's own output (one per node with --local-addr)
      driver.<addr>/               a node's driver's own local phases (continuation, probes)

Imports nothing heavy: the supervisor torchrun starts reads it before forking its rank.
"""
from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

from .case import Case
from .plan import FIRST_RUN, REFERENCE, RESTART, PhasePlan, Start

LAUNCH_ENV = "RESILIENCE_TORCHRUN_LAUNCH"  # which launch of torchrun by the driver this process belongs to
_INCARNATION = re.compile(r"^launch(\d+)\.restart(\d+)$")


@dataclass(frozen=True, order=True)
class Incarnation:
    """One start of the rank group: the driver's ``launch`` of torchrun and the elastic agent's
    ``restart`` count within it (TORCHELASTIC_RESTART_COUNT)."""

    launch: int
    restart: int

    @property
    def name(self) -> str:
        return f"launch{self.launch}.restart{self.restart}"

    @property
    def is_first(self) -> bool:
        return self.launch == 0 and self.restart == 0

    @classmethod
    def from_environment(cls, environ) -> Incarnation:
        return cls(launch=int(environ.get(LAUNCH_ENV, "0")),
                   restart=int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")))


@dataclass(frozen=True)
class TorchrunLayout:
    case_dir: Path

    @property
    def case_file(self) -> Path:
        return self.case_dir / "case.json"

    @property
    def checkpoint_dir(self) -> Path:
        return self.case_dir / "checkpoints"

    @property
    def temp_dir(self) -> Path:
        return self.case_dir / "tmp"

    @property
    def snapshots_dir(self) -> Path:
        """The reference's snapshots, where an elastic restart at another size is continued by the oracle."""
        return self.case_dir / "snapshots"

    def write_plans(self, case: Case, may_grow: bool) -> None:
        """The case and the plans of its reference, first run and restart, read by every incarnation's
        ranks; ``may_grow``: also the restart's at the first run's size, for a shrunk job a spare grows back."""
        for directory in (self.checkpoint_dir, self.temp_dir, self.template(REFERENCE).parent):
            directory.mkdir(parents=True, exist_ok=True)
        case.write(self.case_file)
        size, later = case.workload.world_size, case.restart.world_size
        common = dict(case_file=str(self.case_file), store_path="", phase_dir="", snapshot_step=None,
                      checkpoint_dir=str(self.checkpoint_dir), collective_timeout_s=case.timeouts.collective_s)
        first = dict(world_size=size, rank_map=tuple(range(size)), topology=case.placement.as_dict(), **common)
        # node-local storage follows the topology; an elastic restart at another size is continued by the oracle
        snapshots = str(self.snapshots_dir) if case.topology_changes else None
        for plan in (PhasePlan(name=REFERENCE, start=Start.FRESH, save=False, inject=False, record_states=True,
                               snapshot_dir=snapshots, **first),
                     PhasePlan(name=FIRST_RUN, start=Start.FRESH, save=True, inject=True, record_states=False,
                               snapshot_dir=None, **first),
                     PhasePlan(name=RESTART, start=Start.STRATEGY, save=True, inject=False, record_states=False,
                               snapshot_dir=None, world_size=later, rank_map=tuple(range(later)),
                               topology=case.restart.placement.as_dict(), **common)):
            plan.write(self.template(plan.name))
        if case.topology_changes and may_grow:
            grown = PhasePlan(name=RESTART, start=Start.STRATEGY, save=True, inject=False, record_states=False,
                              snapshot_dir=None, **first)
            grown.write(self.template(RESTART, size))

    def template(self, phase: str, world_size: int | None = None) -> Path:
        """The driver's plan of ``phase``; with ``world_size``, the one for a group of that size."""
        return self.case_dir / "plans" / (f"{phase}.json" if world_size is None else f"{phase}.size{world_size}.json")

    def incarnation_dir(self, incarnation: Incarnation) -> Path:
        return self.case_dir / incarnation.name

    def phase_dir(self, incarnation: Incarnation, phase: str) -> Path:
        return self.incarnation_dir(incarnation) / phase

    def outcome_path(self, incarnation: Incarnation, rank: int) -> Path:
        return self.incarnation_dir(incarnation) / f"outcome.rank{rank}.json"

    def driver_dir(self, node: str | None = None) -> Path:
        """Where a driver runs its own local phases (the oracle's continuation, availability probes):
        the case directory, or with several drivers sharing it (``node``: its address) one of its own."""
        return self.case_dir if node is None else self.case_dir / f"driver.{node}"

    def torchrun_log(self, launch: int, node: str | None = None) -> Path:
        """torchrun's output on one node (``node``: its address, when several share the directory)."""
        suffix = "" if node is None else f".{node}"
        return self.case_dir / f"torchrun.launch{launch}{suffix}.log"

    def plan(self, incarnation: Incarnation, phase: str) -> PhasePlan:
        """The phase's plan in this incarnation: the driver's template for a group of the
        incarnation's size where it wrote one (an elastic job grown back), else its plain
        template; in the incarnation's directory."""
        sized = self.template(phase, self.round_size(incarnation))
        template = PhasePlan.read(sized if sized.is_file() else self.template(phase))
        return replace(template, phase_dir=str(self.phase_dir(incarnation, phase)))

    def round_size(self, incarnation: Incarnation) -> int | None:
        """How many ranks the incarnation's group had (`claim_incarnation`'s record), or None."""
        records = _rounds(self.case_dir / f"launch{incarnation.launch}.rounds")
        counted = [size for _, size, early in records if not early]
        return counted[incarnation.restart] if 0 <= incarnation.restart < len(counted) else None

    def first_run_size(self) -> int | None:
        """The first run's world size, from the driver's plan (None where it wrote none)."""
        template = self.template(FIRST_RUN)
        return PhasePlan.read(template).world_size if template.is_file() else None

    def incarnations(self) -> list[Incarnation]:
        return incarnations_in(self.case_dir)

    def read_outcome(self, incarnation: Incarnation, rank: int) -> dict | None:
        try:
            return json.loads(self.outcome_path(incarnation, rank).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None


def incarnations_in(directory: Path) -> list[Incarnation]:
    """The incarnations that left a directory under ``directory``, oldest first."""
    found = []
    for path in directory.iterdir() if directory.is_dir() else ():
        match = _INCARNATION.match(path.name)
        if match and path.is_dir():
            found.append(Incarnation(int(match[1]), int(match[2])))
    return sorted(found)


EARLY = -1  # the restart index of a group formed before every node of the first run joined


def claim_incarnation(case_dir: Path, launch: int, world_size: int, first_size: int | None = None) -> Incarnation:
    """Which start of the rank group this rank process belongs to, agreed by every rank of every
    node through the shared case directory (called once per process, as it starts).

    TORCHELASTIC_RESTART_COUNT cannot say it with several agents: an agent counts only the
    restarts its own workers' failures caused (torch 2.13 `SimpleElasticAgent._invoke_run`: a
    restart for a node waiting to join decrements nothing), and a spare node's new agent starts at
    0. The starts of one launch are strictly sequential (an agent stops its workers before the next
    rendezvous round, and no round's workers start before every agent joined it), so each process
    takes the next ticket (1, 2, ...) and round ``i`` holds the tickets ``base < t <= base + size``;
    the first process of a new round records it (``launch<L>.rounds/<i>``: "base size").

    With ``--nnodes MIN:MAX`` a round closes once MIN nodes joined and the last call passed: an
    agent slower to start than that misses the first round, joins the next, and the agents start
    again at the full size. A round of launch 0 smaller than ``first_size`` (the first run's
    world size) before any full one is such an early round: recorded "base size early", its
    processes get the restart index `EARLY` and the rounds after it are counted without it."""
    starts, rounds = case_dir / f"launch{launch}.starts", case_dir / f"launch{launch}.rounds"
    starts.mkdir(parents=True, exist_ok=True)
    rounds.mkdir(parents=True, exist_ok=True)
    ticket = len(os.listdir(starts)) + 1
    while True:
        try:
            os.close(os.open(starts / str(ticket), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break
        except FileExistsError:
            ticket += 1
    while True:
        records = _rounds(rounds)
        base, size, early = records[-1] if records else (0, 0, False)
        if base < ticket <= base + size:
            return Incarnation(launch, EARLY if early else sum(not e for _, _, e in records) - 1)
        early = (launch == 0 and first_size is not None and world_size < first_size
                 and all(e for _, _, e in records))
        staging = rounds / f".{len(records)}.{os.getpid()}.{secrets.token_hex(4)}"
        staging.write_text(f"{base + size} {world_size}{' early' if early else ''}")
        try:
            os.link(staging, rounds / str(len(records)))  # atomic, and refused when another rank was first
        except FileExistsError:
            pass
        finally:
            staging.unlink()


def _rounds(rounds: Path) -> list[tuple[int, int, bool]]:
    """(base, size, early) of every round recorded, oldest first."""
    records = []
    for index in sorted(int(name) for name in os.listdir(rounds) if name.isdigit()) if rounds.is_dir() else ():
        fields = (rounds / str(index)).read_text().split()
        records.append((int(fields[0]), int(fields[1]), fields[2:] == ["early"]))
    return records


NODE_ENV = "RESILIENCE_NODE"  # the node a process runs on (0, 1, ...), set for a node's launcher
NODE_NAMESPACE_ENV = "RESILIENCE_NODE_NAMESPACE"  # the network namespace that node is (nodes on one machine)
