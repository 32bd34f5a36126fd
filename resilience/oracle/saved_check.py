"""Every checkpoint verified where it was made (``verify_saves``): after the first run, fresh ranks
at its own topology restore each of its saves that returned on every rank, older than the newest
(the restart restores that one), and report each state. A save that returned everywhere but cannot
be restored, or restores another state than the reference's at its step, was lost when it was
written, whatever a later fault does: SILENT, named as such."""
from __future__ import annotations

from ..core.events import Event
from ..core.records import PhaseResult, PhaseStatus
from . import rules


def steps_to_check(first_run: PhaseResult) -> tuple[int, ...]:
    """The first run's saves that returned on every rank, oldest first, without the newest."""
    return tuple(first_run.complete_saves()[:-1])


def findings(check: PhaseResult, steps: tuple[int, ...], reference: PhaseResult, expected_state) -> list[str]:
    """SILENT findings of the check phase; ``expected_state(reference, rank, step)``: the oracle's
    fingerprint (`judge.expected_state`)."""
    found: list[str] = []
    if check.status == PhaseStatus.DEADLINE:  # a restore that never ends is a HANG, which the judge reports
        return found
    for step in steps:
        by_rank = {e["rank"]: e for e in check.events(Event.VERIFIED) if e["checked"] == step}
        if len(by_rank) < check.world_size:
            why = check.first_error.summary() if check.first_error else f"the check phase {check.status}"
            found.append(f"saved check: the step-{step} save returned on every rank, but fresh ranks cannot restore "
                         f"it ({why}): a checkpoint lost at save time")
            break  # the steps after it were never tried
        for rank, event in sorted(by_rank.items()):
            expected = expected_state(reference, rank, step) or {}
            differing = rules.differing_entries(expected, event["fingerprint"])
            if event["step"] != step or differing:
                found.append(f"saved check: rank {rank} restoring the step-{step} save in fresh ranks gets step "
                             f"{event['step']}, {len(differing)} state entries differing from the reference "
                             f"({', '.join(differing[:6])}{' ...' if len(differing) > 6 else ''}): a checkpoint "
                             f"lost at save time")
    return found
