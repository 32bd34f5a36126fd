"""What black-box mode takes and gives: the user's command (`BlackBoxJob`), the run's logs and
verdict (`BlackBoxResult`), and the verdict in words (`describe`)."""
from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.case import FaultSpec
from ..core.elastic_layout import Incarnation
from ..core.records import Verdict
from ..oracle.blackbox import RankLog


@dataclass(frozen=True)
class BlackBoxJob:
    """The user's command: ``torchrun --nproc-per-node N SCRIPT ARGS...``; ``restart_args``: the
    restart's own arguments (``--resume``), None: the same as the first run's. ``oracle``:
    ``bitwise`` (two uninterrupted runs must agree first) or ``envelope`` (``references`` runs
    give the spread, widened ``envelope_factor`` times)."""

    script: Path
    args: tuple[str, ...] = ()
    restart_args: tuple[str, ...] | None = None
    nproc_per_node: int = 2
    nnodes: int = 1  # nodes on this machine, each a network namespace with its own agent
    restart_nproc_per_node: int | None = None  # the restart at another world size
    continuation_args: tuple[str, ...] | None = None  # resumes it there uninterrupted: its losses' oracle
    max_restarts: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    launch_timeout_s: float = 300.0  # one torchrun launch still running after this long: HANG
    python: str = sys.executable
    oracle: str = "bitwise"
    references: int = 2
    envelope_factor: float = 2.0


@dataclass(frozen=True)
class BlackBoxResult:
    verdict: Verdict
    reference: tuple[RankLog, ...]
    first_run: tuple[RankLog, ...]
    restart: tuple[RankLog, ...] | None
    restart_incarnation: Incarnation | None
    work_dir: Path
    later: tuple[tuple[RankLog, ...], ...] = ()  # a timeline's launches after the restart
    # each torchrun launch of the faulted job (not of the references): (launch, wall seconds)
    job_launches_s: tuple[tuple[int, float], ...] = ()

    @property
    def fault_fired(self) -> bool:
        return any(log.fault_events for log in self.first_run + (self.restart or ()) + sum(self.later, ()))

    @property
    def timeline_logs(self) -> tuple[RankLog, ...]:
        """Every rank's log of a timeline's launches after the first run (none without a timeline)."""
        return (self.restart or ()) + sum(self.later, ()) if self.later else ()

    @property
    def reference_losses(self) -> dict[int, float]:
        """Rank 0's losses in the uninterrupted run."""
        return self.reference[0].step_losses()


def fault_document(fault: FaultSpec) -> dict[str, Any] | None:
    """``fault`` as the rank hook reads it from its configuration (None: no fault)."""
    if fault.kind == "none":
        return None
    return {"kind": fault.kind, "trigger": dataclasses.asdict(fault.trigger) if fault.trigger else None,
            "params": dict(fault.params)}


def describe(result: BlackBoxResult) -> str:
    """Verdict, findings and where the restart came from, for people."""
    verdict = result.verdict
    lines = [(f"verdict: {verdict.kind.value}   restored step: {verdict.restored_step}   "
              f"newest checkpoint logged as saved on every rank: {verdict.complete_step}")]
    lines += [f"  - {finding}" for finding in verdict.findings]
    if result.restart_incarnation:
        lines.append(f"restore in {result.restart_incarnation.name} "
                     f"(restart {result.restart_incarnation.restart} of launch {result.restart_incarnation.launch})")
    # a timeline's later launches fire faults of their own
    fired = [e for log in result.first_run + result.timeline_logs for e in log.fault_events]
    lines += [f"fault: {json.dumps({k: v for k, v in e.items() if k != 'event'})}" for e in fired]
    return "\n".join(lines)

