"""What a qualification run found, as frozen records the report writers render (HTML, JSON, JUnit).

`CaseRecord.of(result, outcome)` keeps from a `CaseResult` only what a reader needs: the verdict
against the expectation, the loss series of the reference, first and restored runs, steps lost,
time to restore, and the per-rank logs of a failed case.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.case import Case, FaultSpec
from ..core.records import CaseResult, Verdict
from ..core.script_case import ScriptCase
from ..measure.environment import Environment
from ..measure.fsprobe import BandwidthProbe
from ..measure.objprobe import ObjectBandwidthProbe
from ..measure.throughput import StrategyThroughput
from ..oracle.outcome import CaseOutcome, CaseStatus
from .launches import launches, timeline_cost
from .lost_work import per_strategy
from .text import replay_command

PASSING = (CaseStatus.PASSED, CaseStatus.XFAILED)
FAILING = (CaseStatus.FAILED, CaseStatus.ERROR)  # a skip fails only under CI=true (the caller decides)


@dataclass(frozen=True)
class RankOutputTail:
    """How one rank of one phase ended: its exit code and the tails of its stdout and stderr."""

    phase: str
    rank: int
    returncode: int | None
    stdout_tail: str
    stderr_tail: str


@dataclass(frozen=True)
class CaseRecord:
    source: str
    case_id: str
    name: str
    strategy: str  # the name and options, e.g. "torch.per_rank {stagger: 1}"
    fault: str  # the kind and its trigger in words
    status: CaseStatus
    reason: str
    verdict: str | None  # None when the case could not run (skipped, harness error)
    expected: str
    elapsed_s: float
    replay: str
    restored_step: int | None = None
    complete_step: int | None = None
    steps_lost: int | None = None
    restore_s: float | None = None
    restart_s: float | None = None  # lost work: group start-up and restore, then replay of the lost steps
    replay_s: float | None = None
    intact_step: int | None = None  # LOUD: an older checkpoint that was intact but never used
    restored_from: str | None = None  # a strategy with several tiers: the tier that served the restart
    storage_bytes_read: int | None = None  # ... and the bytes its restore read from storage
    save_s: tuple[tuple[int, float], ...] = ()
    reference_losses: tuple[tuple[int, float], ...] = ()
    first_run_losses: tuple[tuple[int, float], ...] = ()
    restored_losses: tuple[tuple[int, float], ...] = ()
    findings: tuple[str, ...] = ()
    logs: tuple[RankOutputTail, ...] = ()  # only for a case that did not pass

    @property
    def label(self) -> str:
        return f"{self.source}[{self.case_id}]"

    @property
    def lost_s(self) -> float | None:
        return None if self.restart_s is None or self.replay_s is None else self.restart_s + self.replay_s

    @property
    def passed(self) -> bool:
        return self.status in PASSING

    @classmethod
    def not_run(cls, case: Case | ScriptCase, status: CaseStatus, reason: str, elapsed_s: float) -> CaseRecord:
        return cls(source=case.source, case_id=case.id, name=case.name, strategy=strategy_label(case),
                   fault=fault_label(case), status=status, reason=reason, verdict=None,
                   expected=case.expect.verdict.value, elapsed_s=elapsed_s,
                   replay=replay_command(case.source, case.id, script=isinstance(case, ScriptCase), tier=case.tier))

    @classmethod
    def of_script(cls, case: ScriptCase, verdict: Verdict, outcome: CaseOutcome, elapsed_s: float,
                  losses: dict[str, dict[int, float]]) -> CaseRecord:
        """A case on a user's script; ``losses``: rank 0's, per run (reference, first_run, restart).
        Steps lost: those the first run trained past the restored step (no timings: the script's
        restart is torchrun's, not measured in parts)."""
        trained, restored = losses.get("first_run"), verdict.restored_step
        return cls(source=case.source, case_id=case.id, name=case.name, strategy=strategy_label(case),
                   fault=fault_label(case), status=outcome.status, reason=outcome.reason,
                   verdict=verdict.kind.value, expected=case.expect.verdict.value, elapsed_s=elapsed_s,
                   replay=replay_command(case.source, case.id, script=True, tier=case.tier),
                   restored_step=verdict.restored_step, complete_step=verdict.complete_step,
                   intact_step=verdict.intact_step,
                   steps_lost=max(trained) - restored if trained and restored is not None else None,
                   reference_losses=tuple(losses.get("reference", {}).items()),
                   first_run_losses=tuple(losses.get("first_run", {}).items()),
                   restored_losses=tuple(losses.get("restart", {}).items()), findings=verdict.findings)

    @classmethod
    def of(cls, result: CaseResult, outcome: CaseOutcome, elapsed_s: float) -> CaseRecord:
        case, verdict = result.case, result.verdict
        restart_s, replay_s = result.lost_s or (None, None)
        steps_lost, restored_losses = result.steps_lost, result.loss_series("restart")
        if case.timeline:  # summed over every restore, and the losses of every launch after the first
            cost = timeline_cost(result)
            steps_lost = cost.steps_lost
            restart_s = sum(loss.restart_s or 0.0 for loss in cost.losses)
            replay_s = sum(loss.replay_s or 0.0 for loss in cost.losses)
            restored_losses = {step: loss for phase in launches(result)[1:]
                               for step, loss in result.loss_series(phase.name).items()}
        logs = () if outcome.status in PASSING else tuple(
            RankOutputTail(phase=phase.name, rank=r.rank, returncode=r.returncode, stdout_tail=r.stdout_tail,
                           stderr_tail=r.stderr_tail)
            for phase in result.phases[1:] for r in phase.ranks)
        return cls(source=case.source, case_id=case.id, name=case.name, strategy=strategy_label(case),
                   fault=fault_label(case), status=outcome.status, reason=outcome.reason,
                   verdict=verdict.kind.value, expected=case.expect.verdict.value, elapsed_s=elapsed_s,
                   replay=replay_command(case.source, case.id), restored_step=verdict.restored_step,
                   complete_step=verdict.complete_step, steps_lost=steps_lost,
                   restore_s=result.restore_s, restart_s=restart_s, replay_s=replay_s,
                   intact_step=verdict.intact_step, save_s=tuple(result.save_s.items()),
                   restored_from=result.restored_from, storage_bytes_read=result.storage_bytes_read,
                   reference_losses=tuple(result.loss_series("reference").items()),
                   first_run_losses=tuple(result.loss_series("first_run").items()),
                   restored_losses=tuple(sorted(restored_losses.items())),
                   findings=verdict.findings, logs=logs)


@dataclass(frozen=True)
class Qualification:
    started: str  # ISO 8601, UTC
    elapsed_s: float
    launcher: str
    command: str
    environment: Environment
    cases: tuple[CaseRecord, ...]
    bandwidth: BandwidthProbe | None = None
    throughput: tuple[StrategyThroughput, ...] = ()
    notes: tuple[str, ...] = field(default=())  # what could not be measured, and why
    object_bandwidth: ObjectBandwidthProbe | None = None  # an S3 work directory: PUT and GET in place of bandwidth

    @property
    def failed(self) -> tuple[CaseRecord, ...]:
        return tuple(c for c in self.cases if c.status in FAILING)

    def to_json(self) -> str:
        data: dict[str, Any] = asdict(self)
        data["summary"] = summary(self.cases)
        if self.bandwidth:
            data["bandwidth"]["bytes_per_s"] = self.bandwidth.bytes_per_s
        if self.object_bandwidth:
            data["object_bandwidth"].update(put_bytes_per_s=self.object_bandwidth.put_bytes_per_s,
                                            get_bytes_per_s=self.object_bandwidth.get_bytes_per_s)
        for entry, figure in zip(data["throughput"], self.throughput, strict=True):
            entry.update(save_bytes_per_s=figure.save_bytes_per_s, restore_bytes_per_s=figure.restore_bytes_per_s,
                         save_fraction=figure.save_fraction, restore_fraction=figure.restore_fraction)
        for entry, record in zip(data["cases"], self.cases, strict=True):
            entry.update(passed=record.passed, lost_s=record.lost_s)
        data["lost_work"] = [{**asdict(row), "lost_s": row.lost_s} for row in per_strategy(self.cases)]
        return json.dumps(data, indent=1)


def summary(cases: tuple[CaseRecord, ...]) -> dict[str, int]:
    counts: dict[str, int] = {"total": len(cases)}
    for case in cases:
        counts[case.status] = counts.get(case.status, 0) + 1
    return counts


def strategy_label(case: Case | ScriptCase) -> str:
    if isinstance(case, ScriptCase):
        return shlex.join(["script", Path(case.script.path).name, *case.script.args])
    options = ", ".join(f"{k}: {json.dumps(v)}" for k, v in sorted(case.strategy.options.items()))
    return case.strategy.name + (f" {{{options}}}" if options else "")


def fault_label(case: Case | ScriptCase) -> str:
    fault = case.fault
    later = [i.fault for i in case.timeline if i.fault.kind != "none"] if isinstance(case, Case) else []
    if later:  # a timeline: every launch's fault, in order
        return "; ".join(_one_fault(f) for f in (fault, *later))
    return _one_fault(fault)


def _one_fault(fault: FaultSpec) -> str:
    trigger = fault.trigger
    if trigger is None:
        return fault.kind
    where = f"{trigger.phase}/{trigger.point} of step {trigger.step} on rank {trigger.rank}"
    if trigger.after_bytes is not None:
        where += f" after {trigger.after_bytes} B"
    params = ", ".join(f"{k}={v}" for k, v in sorted(fault.params.items()) if v is not None)
    return f"{fault.kind} at {where}" + (f" ({params})" if params else "")
