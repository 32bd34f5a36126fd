"""Availability inside LOUD: after a restore that refused, was an older checkpoint intact?

Proven, not guessed from files existing: each candidate step (newest first) is restored with the
strategy's own ``load_step`` in fresh ranks at the restart's topology and under its interpreter and
packages, which then train to the end;
its state must equal the reference state at that step and every later loss the reference's, bitwise
(the oracle's own rules). Candidates are the checkpoints whose save returned on every rank before
the fault, at most ``MAX_PROBES`` of them; a strategy without ``load_step`` or a restart on another
topology is not probed.
"""
from __future__ import annotations

from collections.abc import Callable

from ..core import registry
from ..core.capabilities import Capability
from ..core.case import Case
from ..core.plan import FALLBACK, RESTART
from ..core.records import PhaseResult, PhaseStatus
from ..oracle import rules
from ..oracle.judge import expected_state

MAX_PROBES = 4


def refused(restart: PhaseResult) -> bool:
    """The restart failed loudly inside ``strategy.load``: no rank reported a restored state."""
    return restart.first_error is not None and restart.first_error.phase == RESTART and not restart.restored()


def candidates(case: Case, first_run: PhaseResult) -> list[int]:
    return first_run.complete_saves()[::-1][:MAX_PROBES]


def probe(case: Case, first_run: PhaseResult, restart: PhaseResult, reference: PhaseResult,
          run_step: Callable[[int], PhaseResult]) -> tuple[int | None, tuple[PhaseResult, ...]]:
    """The newest intact older checkpoint (None: none found or not probed) and the probe phases.
    ``run_step(step)`` runs a `FALLBACK` phase restoring ``step`` with ``load_step``."""
    strategy = registry.resolve("strategy", case.strategy.name)
    if not refused(restart) or case.topology_changes \
            or Capability.CHOSEN_STEP not in strategy.capabilities_for(case.strategy.options):
        return None, ()
    phases = []
    for step in candidates(case, first_run):
        phase = run_step(step)
        phases.append(phase)
        if intact(phase, reference, step):
            return step, tuple(phases)
    return None, tuple(phases)


def intact(phase: PhaseResult, reference: PhaseResult, step: int) -> bool:
    """Every rank restored ``step`` with the reference's state, and trained on to the end with the
    reference's losses."""
    restored = phase.restored()
    if phase.status != PhaseStatus.COMPLETED or len(restored) != phase.world_size:
        return False
    for rank, event in restored.items():
        if event["step"] != step or expected_state(reference, rank, step) != event["fingerprint"]:
            return False
    divergence, _ = rules.after_restore_divergence(
        {rank: phase.losses(rank) for rank in range(phase.world_size)}, reference.losses(0), step, FALLBACK)
    return divergence is None

