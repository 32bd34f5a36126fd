"""Human-readable rendering of a case result: verdict, evidence, per-rank tails, replay command."""
from __future__ import annotations

import shlex

from ..core.records import CaseResult, PhaseStatus
from . import launches


def replay_command(case_source: str, case_id: str, script: bool = False, tier: str = "full") -> str:
    """The command that runs the case again: ``resilience run``, or pytest for a user's script (a
    case of the deep tier runs only where ``-m`` names it)."""
    if script:
        return shlex.join(["python", "-m", "pytest", f"{case_source}::{case_id}", *(["-m", "deep"] if tier == "deep"
                                                                                     else [])])
    args = ["python", "-m", "resilience", "run", case_source]
    if case_id != "case":
        args += ["--case", case_id]
    return shlex.join(args)


def verdict_line(result: CaseResult) -> str:
    case, verdict = result.case, result.verdict
    restored = "-" if verdict.restored_step is None else verdict.restored_step
    return (f"{verdict.kind.value:<9} expected {case.expect.verdict.value:<9} {case.source}[{case.id}] "
            f"(restored step {restored}, newest complete {verdict.complete_step})")


def render(result: CaseResult, reason: str = "") -> str:
    case, verdict = result.case, result.verdict
    lines = [f"{case.name} [{case.id}]",
             f"verdict: {verdict.kind.value}   expected: {case.expect.verdict.value}"
             + (f" matching /{case.expect.error}/" if case.expect.error else "")]
    if reason:
        lines.append(f"why this fails: {reason}")
    lines.append(f"restored step: {verdict.restored_step}   newest checkpoint saved on every rank: "
                 f"{verdict.complete_step}")
    if result.restored_from is not None:
        lines.append(f"restored from: {result.restored_from}   storage bytes read: {result.storage_bytes_read}")
    lost = result.lost_s
    if lost is not None and not case.timeline:  # a timeline's are listed launch by launch
        lines.append(f"work lost: {result.steps_lost} steps, {sum(lost):.2f} s (restart {lost[0]:.2f} s + replay "
                     f"{lost[1]:.2f} s)")
    lines += launches.render(result)
    for finding in verdict.findings:
        lines.append(f"  - {finding}")
    if verdict.divergence:
        d = verdict.divergence
        lines.append(f"first diverging step: {d.step} ({d.phase}, rank {d.rank}): "
                     f"reference {d.expected!r}, got {d.got!r}")
    for phase in result.phases:
        fired = "; ".join(fault_text(e) for e in phase.fault_events)
        lines.append(f"phase {phase.name}: {phase.status} in {phase.elapsed_s:.1f} s"
                     + (f"; fault fired: {fired}" if fired else ""))
    for phase in result.phases[1:]:
        for record in phase.ranks:
            if record.stderr_tail.strip() and (phase.first_error or phase.status != PhaseStatus.COMPLETED):
                tail = "\n".join(record.stderr_tail.strip().splitlines()[-15:])
                lines.append(f"--- {phase.name} rank {record.rank} stderr (tail) ---\n{tail}")
    lines.append(f"replay: {replay_command(case.source, case.id)}")
    return "\n".join(lines)


def fault_text(event: dict) -> str:
    at = f" at byte {event['offset']}" if "offset" in event else ""  # a stalled or crashed writer has no byte
    where = f" in {event['file']}{at}" if event.get("file") else ""
    return (f"{event['kind']} on rank {event['rank']} at step {event['step']} "
            f"{event['phase']}/{event.get('point')}{where}")
