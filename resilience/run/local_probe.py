"""Phases run by fresh local ranks for a job the harness did not start (torchrun): availability
inside LOUD (after a refused restore, each older step restored with ``load_step``,
`run.availability`), and the oracle's continuation on the restart's topology."""
from __future__ import annotations

from pathlib import Path

from ..core.case import Case
from ..core.plan import CONTINUATION, FALLBACK, PhasePlan, Start
from ..core.records import PhaseResult
from ..launch.backend import backend_for_launch
from . import availability
from .supervisor import run_local_phase


def probe_in_local_ranks(case: Case, case_file: Path, checkpoint_dir: Path, work_dir: Path,
                         phases: list[PhaseResult]) -> tuple[int | None, tuple[PhaseResult, ...]]:
    """``phases``: the job's reference, first run and restart. The newest intact older step (None:
    none, or not probed) and the probe phases, each in ``work_dir/fallback_step_<N>``."""
    def run_step(step: int) -> PhaseResult:
        phase_dir = work_dir / f"{FALLBACK}_step_{step}"
        plan = PhasePlan(name=FALLBACK, case_file=str(case_file), world_size=case.restart.world_size,
                         store_path=str(phase_dir / "store"), checkpoint_dir=str(checkpoint_dir),
                         phase_dir=str(phase_dir), start=Start.STEP, save=False, inject=False, record_states=False,
                         snapshot_dir=None, snapshot_step=step, rank_map=case.restart.rank_map,
                         collective_timeout_s=case.timeouts.collective_s)
        return run_local_phase(plan, case, backend=backend_for_launch(case, 1))

    reference, first_run, restart = phases[:3]
    return availability.probe(case, first_run, restart, reference, run_step)


def continue_in_local_ranks(case: Case, case_file: Path, checkpoint_dir: Path, work_dir: Path, snapshots: Path,
                            step: int) -> PhaseResult:
    """The oracle's continuation, as the local harness computes it: the reference's trusted snapshot
    of ``step`` (written by the job's own reference ranks into ``snapshots``) trained on to the end
    at the restart's topology, in ``work_dir/continuation``."""
    phase_dir = work_dir / CONTINUATION
    plan = PhasePlan(name=CONTINUATION, case_file=str(case_file), world_size=case.restart.world_size,
                     store_path=str(phase_dir / "store"), checkpoint_dir=str(checkpoint_dir), phase_dir=str(phase_dir),
                     start=Start.SNAPSHOT, save=False, inject=False, record_states=False, snapshot_dir=str(snapshots),
                     snapshot_step=step, rank_map=tuple(range(case.restart.world_size)),
                     collective_timeout_s=case.timeouts.collective_s, topology=case.restart.placement.as_dict())
    return run_local_phase(plan, case)
