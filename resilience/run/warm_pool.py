"""Restores in warm ranks: one group of live rank processes restores crash state after crash state.

A fresh rank group costs a fork (or an interpreter) per rank, a rendezvous, and the strategy's and
workload's first-use costs; a warm rank (`resilience.rank.warm_rank`) pays them once and joins a
new process group per restore (a PrefixStore over one TCPStore on 127.0.0.1). Each restore is
supervised by `resilience.run.supervisor.supervise` like any phase (deadline, stack dump, grace),
as a `WarmRanks` group: a restore in which a rank dies, hangs or leaves state in its process
(threads, child processes, signal handlers) retires the whole group (a rank that raised answers
and stays), and the next restore starts new ranks. Caching inside a strategy cannot be seen from
outside: the explorer re-runs a share of the states in fresh ranks and compares
(`resilience.run.explore`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..core.plan import PhasePlan
from ..core.records import PhaseResult
from ..disk.state_tree import remove_tree
from ..launch.backend import ProcessBackend, RankProcess
from ..rank.warm_rank import answer, job_path, left_behind
from .supervisor import WarmRanks, collect, deadline_after, supervise


class WarmPool:
    """Call order (controller process): `restore` any number of times, one at a time, every plan
    at ``world_size``; `close` exactly once at the end, whatever happened."""

    def __init__(self, backend: ProcessBackend, root: Path, world_size: int):
        self.backend, self.root, self.world_size = backend, root, world_size
        self.groups_started = 0  # warm groups started so far (the replacements and a standby too)
        self.restores = 0
        self._members: list[RankProcess] | None = None
        self._dir: Path | None = None
        self._job = 0
        # a second group, started while the first restores: a restore that retires its group (any
        # LOUD one) goes on with ranks that have already booted
        self._standby: tuple[list[RankProcess], Path] | None = None

    def restore(self, plan: PhasePlan, timeout_s: float) -> PhaseResult:
        """Run one restart plan in the warm ranks (starting them first when there are none)."""
        if plan.world_size != self.world_size:
            raise ValueError(f"a pool of {self.world_size} ranks cannot run a phase of {plan.world_size}")
        expired = deadline_after(timeout_s)  # the start of a new group counts against the restore
        if self._members is None:
            self._activate()
        if self._standby is None:
            self._standby = self._start()
        phase_dir = Path(plan.phase_dir)
        phase_dir.mkdir(parents=True)
        plan_path = phase_dir / "plan.json"
        plan.write(plan_path)
        pool_dir, job = self._dir, self._job
        partial = pool_dir / f"job{job}.tmp"
        partial.write_text(json.dumps({"plan": str(plan_path)}))
        os.replace(partial, job_path(pool_dir, job))
        group = WarmRanks(self._members, lambda rank: answer(pool_dir, job, rank),
                          lambda rank: left_behind(pool_dir, job, rank))
        result = collect(plan, supervise(group, expired))
        self._job += 1
        self.restores += 1
        if group.spent:
            self._retire()
        return result

    def close(self) -> None:
        if self._members is not None:
            (self._dir / "stop").touch()
            self._retire()
        if self._standby is not None:
            self._members, self._dir = self._standby
            self._standby = None
            self._retire()

    def _start(self) -> tuple[list[RankProcess], Path]:
        directory = self.root / f"warm{self.groups_started}"
        directory.mkdir(parents=True)
        self.groups_started += 1
        return self.backend.start_warm(directory, self.world_size), directory

    def _activate(self) -> None:
        self._members, self._dir = self._standby or self._start()
        self._standby = None
        self._job = 0

    def _retire(self) -> None:
        for member in self._members or ():
            member.destroy()
        self._members = None
        remove_tree(self._dir)
