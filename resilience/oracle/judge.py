"""The oracle: one verdict per case from the phases' events (rules in `rules`).

Worst finding wins: SILENT > HANG > LOUD > RECOVERED. (Within a phase LOUD already beats HANG: the
harness tears the group down at the first rank failure, before anyone's deadline.)
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.case import Case
from ..core.events import Event
from ..core.records import Divergence, PhaseResult, PhaseStatus, RankError, Verdict
from . import data_audit, rules
from .saved_check import findings as saved_check_findings


def judge(case: Case, reference: PhaseResult, first_run: PhaseResult, restart: PhaseResult,
          continuation: PhaseResult | None = None, fault_findings: tuple[str, ...] = (),
          fault_notes: tuple[str, ...] = (), intact_step: int | None = None,
          later: tuple[PhaseResult, ...] = (),
          saved_check: tuple[PhaseResult, tuple[int, ...]] | None = None,
          oracles: tuple[PhaseResult | None, ...] | None = None) -> Verdict:
    """``fault_findings``: what the fault itself found (`Fault.findings`), each one SILENT;
    ``fault_notes``: what it did, in words (`Fault.notes`), listed last; ``intact_step``: after a
    refused restore, an older checkpoint proven intact (`resilience.run.availability`); ``later``:
    a timeline's launches after the restart, each judged as the restart is, against its oracle;
    ``saved_check``: the phase that restored the first run's earlier saves, and their steps
    (`oracle.saved_check`: its errors are evidence of a lost save, never the job's own LOUD);
    ``oracles``: the phase judging each launch after the first run, the restart first (the
    reference, a continuation, or None where no trusted state exists: `run.oracle_chain`); without
    it the restart is judged by ``continuation`` where its topology or software changed, every
    later launch by the reference."""
    silent: list[str] = list(fault_findings)
    reference_losses = reference.losses(0)
    runs = [first_run, restart, *later]
    judged = [p for p in (first_run, restart, continuation, *later) if p is not None]
    checked = [saved_check[0]] if saved_check is not None else []
    hung = next((p.name for p in judged + checked if p.status == PhaseStatus.DEADLINE), None)
    first_error = next((p.first_error for p in judged if p.first_error), None)

    divergence, found = rules.first_run_divergence(
        {rank: first_run.losses(rank) for rank in range(first_run.world_size)}, reference_losses)
    silent += found
    if oracles is None:
        oracles = (restart_oracle(case, reference, restart, continuation),) + (reference,) * len(later)
    hops = [_restore_hop(case, reference, oracles[index - 1], runs[:index], runs[index])
            for index in range(1, len(runs))]
    for number, hop in enumerate(hops, 2):  # the first run is launch 1
        silent += [f"launch {number} ({hop.phase}): {line}" for line in hop.silent] if later else hop.silent
        divergence = divergence or hop.divergence
    if saved_check is not None:
        silent += saved_check_findings(*saved_check, reference, expected_state)
    # a lost last save the job's log reported is LOUD: the log is the evidence
    first_error = first_error or next((hop.logged for hop in hops if hop.logged is not None), None)
    restored_steps = [hop.restored_step for hop in hops]
    if None not in restored_steps:  # which samples the job trained, against the reference's epochs
        silent += data_audit.audit(reference, runs, restored_steps)
    notes = [line for hop in hops for line in hop.notes]
    wrong = next((hop for hop in hops if hop.silent), hops[0])
    hang_lines = next(([f"phase {hung} passed its {case.timeouts.phase_s:g} s deadline", *p.hang_summary]
                       for p in judged + checked if p.name == hung), [])
    return Verdict(kind=rules.worst(silent, hung, first_error),
                   findings=rules.findings(silent, hang_lines, first_error, rules.intact_notes(intact_step) + notes
                                           + list(fault_notes)), first_error=first_error, intact_step=intact_step,
                   restored_step=wrong.restored_step, complete_step=wrong.complete, divergence=divergence,
                   hung_phase=hung, state_diff=tuple(d for hop in hops for d in hop.state_diff))


@dataclass(frozen=True)
class RestoreHop:
    """What one launch's restore says: its SILENT findings and notes, the state entries that differ,
    the first loss that diverged after it, the step it restored and the newest complete one."""
    phase: str
    silent: tuple[str, ...]
    notes: tuple[str, ...]
    state_diff: tuple[str, ...]
    divergence: Divergence | None
    restored_step: int | None
    complete: int
    logged: RankError | None = None  # the error the launch that ended logged about its last save


def restart_oracle(case: Case, reference: PhaseResult, restart: PhaseResult,
                   continuation: PhaseResult | None) -> PhaseResult | None:
    """What judges the restart: the continuation where its topology or software changed (None
    where none could run), unless other software went on bit for bit as the reference did."""
    if not case.continuation_is_oracle:
        return reference
    if case.software_changes and ended_as_reference(case, reference, restart):
        return reference  # other software that went on bit for bit as the saving one: the reference's end
    return continuation


def _restore_hop(case: Case, reference: PhaseResult, oracle: PhaseResult | None,
                 before: list[PhaseResult], run: PhaseResult) -> RestoreHop:
    """``run``'s restore from what the launches ``before`` it saved: the newest save that returned
    on every rank of one launch, the state restored against ``oracle``'s, every later loss."""
    silent: list[str] = []
    notes: list[str] = []
    state_diff: list[str] = []
    divergence = None
    complete, ended, saver = 0, False, None
    for earlier in before:
        newest = max(earlier.complete_saves(), default=0)
        if newest and newest >= complete:
            complete, ended, saver = newest, earlier.status == PhaseStatus.COMPLETED, earlier
    restored = run.restored()
    restored_step = restored[0]["step"] if 0 in restored else None
    logged = rules.logged_error(saver) if ended and restored_step is not None and restored_step < complete else None
    if run.status == PhaseStatus.COMPLETED or len(restored) == run.world_size:
        found, notes = rules.restore_findings({rank: e["step"] for rank, e in restored.items()}, complete,
                                              case.expect.fallback_ok, "its state is verified below", ended, logged)
        silent += found + rules.tier_findings(restored)
        for rank, event in sorted(restored.items()):
            expected = expected_state(oracle, rank, event["step"])
            if expected is None:
                silent.append(f"rank {rank} restored step {event['step']}, for which no reference state "
                              f"exists (not a checkpoint step, or the oracle run failed)")
                continue
            differing = rules.differing_entries(expected, event["fingerprint"])
            if differing:
                state_diff.extend(f"rank {rank}: {k}" for k in differing)
                silent.append(f"rank {rank}: state restored at step {event['step']} differs from the "
                              f"reference in {len(differing)} entries: {', '.join(differing[:6])}"
                              + (" ..." if len(differing) > 6 else ""))
        if oracle is not None and restored_step is not None:
            oracle_losses = reference.losses(0) if oracle is reference else oracle.losses(0)
            divergence, found = rules.after_restore_divergence(
                {rank: run.losses(rank) for rank in range(run.world_size)}, oracle_losses, restored_step, run.name)
            silent += found
    silent += rules.foreign_reads(run)
    return RestoreHop(phase=run.name, silent=tuple(silent), notes=tuple(notes), state_diff=tuple(state_diff),
                      divergence=divergence, restored_step=restored_step, complete=complete,
                      logged=logged)


def ended_as_reference(case: Case, reference: PhaseResult, restart: PhaseResult) -> bool:
    """Whether a restart on the first run's topology completed with every loss after its restore
    equal, bit for bit, to the reference's: then the reference is its oracle (the job ended as the
    reference does) and no continuation is needed, whatever software it ran."""
    restored = restart.restored()
    return not case.topology_changes and 0 in restored and went_on_as(restart, reference, restored[0]["step"])


def went_on_as(run: PhaseResult, oracle: PhaseResult, step: int) -> bool:
    """Whether ``run`` completed with every loss after its restore of ``step`` equal, bit for bit,
    to ``oracle``'s (and trained at least one step after it)."""
    losses = {rank: run.losses(rank) for rank in range(run.world_size)}
    if run.status != PhaseStatus.COMPLETED or not any(s > step for by_step in losses.values() for s in by_step):
        return False
    return not rules.after_restore_divergence(losses, oracle.losses(0), step, run.name)[1]


def expected_state(oracle: PhaseResult | None, rank: int, step: int) -> dict | None:
    """The oracle's fingerprint of ``rank``'s state at ``step``: the reference's per-step states,
    or a continuation's restore of the trusted state (and, where it records them, its later states)."""
    if oracle is None:
        return None
    for record in oracle.ranks:
        if record.rank != rank:
            continue
        for event in record.events:
            if event["event"] in (Event.RESTORED, Event.STATE) and event["step"] == step:
                return event["fingerprint"]
    return None
