"""The oracle: one verdict per case from the phases' events.

Worst finding wins: SILENT > HANG > LOUD > RECOVERED. (Within a phase LOUD already beats HANG: the
harness tears the group down at the first rank failure, before anyone's deadline.)
"""
from __future__ import annotations

from ..core.records import Divergence, PhaseResult, RankError, Verdict
from ..core.case import Case, VerdictKind


def judge(case: Case, reference: PhaseResult, first_run: PhaseResult, restart: PhaseResult,
          continuation: PhaseResult | None = None, fault_findings: tuple[str, ...] = ()) -> Verdict:
    """``fault_findings``: what the fault itself found (`Fault.findings`), each one SILENT."""
    silent: list[str] = list(fault_findings)
    notes: list[str] = []
    divergence: Divergence | None = None
    state_diff: list[str] = []
    reference_losses = reference.losses(0)

    hung = next((p.name for p in (first_run, restart, continuation) if p is not None and p.status == "deadline"), None)
    first_error = next((p.first_error for p in (first_run, restart, continuation) if p is not None and p.first_error), None)

    # The first run must follow the reference until it stops: a save must not disturb training.
    for rank in range(first_run.world_size):
        found = _first_mismatch(first_run.losses(rank), reference_losses, first_run.name, rank)
        if found:
            divergence = divergence or found
            silent.append(f"first run: rank {rank} loss at step {found.step} is {found.got!r}, "
                          f"the reference has {found.expected!r}")
            break

    complete = _newest_complete_save(case, first_run)
    restored = restart.restored()
    restored_step = restored[0]["step"] if 0 in restored else None
    if restart.status == "completed" or len(restored) == restart.world_size:
        steps = {rank: event["step"] for rank, event in sorted(restored.items())}
        if len(set(steps.values())) > 1:
            silent.append(f"ranks restored different steps: {steps}")
        if restored_step is not None and restored_step < complete and not case.expect.fallback_ok:
            silent.append(f"lost checkpoint: restored step {restored_step}, but the step-{complete} save "
                          f"had returned on every rank before the fault")
        if restored_step is not None and restored_step > complete:
            notes.append(f"restored step {restored_step}, newer than the last save confirmed on every rank "
                         f"({complete}); accepted only because its state is verified below")
        oracle = continuation if case.topology_changes else reference
        for rank, event in sorted(restored.items()):
            expected = _expected_state(case, oracle, rank, event["step"])
            if expected is None:
                silent.append(f"rank {rank} restored step {event['step']}, for which no reference state "
                              f"exists (not a checkpoint step, or the oracle run failed)")
                continue
            differing = sorted(k for k in expected.keys() | event["fingerprint"].keys()
                               if expected.get(k) != event["fingerprint"].get(k))
            if differing:
                state_diff.extend(f"rank {rank}: {k}" for k in differing)
                silent.append(f"rank {rank}: state restored at step {event['step']} differs from the "
                              f"reference in {len(differing)} entries: {', '.join(differing[:6])}"
                              + (" ..." if len(differing) > 6 else ""))
        if oracle is not None and restored_step is not None:
            oracle_losses = reference_losses if oracle is reference else oracle.losses(0)
            for rank in range(restart.world_size):
                after = {s: v for s, v in restart.losses(rank).items() if s > restored_step}
                found = _first_mismatch(after, oracle_losses, restart.name, rank)
                if found:
                    divergence = divergence or found
                    silent.append(f"after restore: rank {rank} loss at step {found.step} is {found.got!r}, "
                                  f"the reference continuation has {found.expected!r}")
                    break

    kind = worst(silent, hung, first_error)
    hang_lines = next((list(p.hang_summary) for p in (first_run, restart, continuation)
                       if p is not None and p.name == hung), [])
    findings = silent + ([f"phase {hung} passed its {case.timeouts.phase_s:g} s deadline"] + hang_lines
                         if hung else []) \
        + ([f"rank {first_error.rank} failed in {first_error.phase}: {first_error.summary()}"] if first_error else []) \
        + notes
    return Verdict(kind=kind, findings=tuple(findings), first_error=first_error, restored_step=restored_step,
                   complete_step=complete, divergence=divergence, hung_phase=hung, state_diff=tuple(state_diff))


def worst(silent: list[str], hung: str | None, first_error: RankError | None) -> VerdictKind:
    """The verdict the findings add up to: SILENT > HANG > LOUD > RECOVERED."""
    if silent:
        return VerdictKind.SILENT
    if hung:
        return VerdictKind.HANG
    if first_error:
        return VerdictKind.LOUD
    return VerdictKind.RECOVERED


def _newest_complete_save(case: Case, first_run: PhaseResult) -> int:
    returned: dict[int, set[int]] = {}
    for event in first_run.events("save_returned"):
        returned.setdefault(event["step"], set()).add(event["rank"])
    done = [step for step, ranks in returned.items() if len(ranks) == first_run.world_size]
    return max(done, default=0)


def _expected_state(case: Case, oracle: PhaseResult | None, rank: int, step: int) -> dict | None:
    if oracle is None:
        return None
    if oracle.name == "continuation":
        event = oracle.restored().get(rank)
        return event["fingerprint"] if event and event["step"] == step else None
    for record in oracle.ranks:
        if record.rank != rank:
            continue
        for event in record.events:
            if event["event"] in ("restored", "state") and event["step"] == step:
                return event["fingerprint"]
    return None


def _first_mismatch(got: dict[int, float], expected: dict[int, float], phase: str, rank: int) -> Divergence | None:
    for step in sorted(got):
        if got[step] != expected.get(step):
            return Divergence(phase=phase, rank=rank, step=step, expected=expected.get(step), got=got[step])
    return None
