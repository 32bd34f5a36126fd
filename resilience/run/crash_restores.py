"""Where the explorer's crash states are restored: materialised as a real directory, then restored
by warm ranks (`resilience.run.warm_pool`) where the strategy says it keeps nothing between loads
and the restart runs the first run's software (``backend`` is then that software's), else by fresh
ranks through the harness (also for the canaries). A strategy with node agents gets fresh agents
for every restore: the power cut took the first run's, and their memory, with it."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..core import registry
from ..core.case import Case
from ..core.plan import FALLBACK, RESTART, Start
from ..core.records import PhaseResult
from ..disk.state_tree import materialise, remove_tree
from ..launch.backend import ProcessBackend, backend_for_launch
from .local_case import node_agents_for
from .warm_pool import WarmPool


class CrashRestores:
    """Restores materialised crash states: in warm ranks where the strategy allows it, else (and
    for the canaries) in fresh ones through the harness."""

    def __init__(self, case: Case, plan, work_dir: Path, run_phase: Callable[..., PhaseResult],
                 backend: ProcessBackend | None, keep: bool):
        self.case, self.plan, self.work_dir, self.run_phase, self.keep = case, plan, work_dir, run_phase, keep
        self.count = 0
        self.regrouped = 0  # warm restores whose group never formed, redone in fresh ranks
        strategy = registry.resolve("strategy", case.strategy.name)
        self.with_agents = strategy.node_agent is not None
        warm = (backend is not None and not case.software_changes and not self.with_agents
                and strategy.restores_warm(case.strategy.options))
        self.pool = WarmPool(backend, work_dir / "warm", case.restart.world_size) if warm else None

    def describe(self) -> str:
        if self.pool is None:
            if self.with_agents:
                return "fresh ranks beside fresh node agents (the power cut took the first run's, and their memory)"
            return "fresh ranks (the strategy keeps state between loads, or runs under another interpreter)"
        redone = f"; {self.regrouped} whose group never formed redone in fresh ranks" if self.regrouped else ""
        return f"warm ranks ({self.pool.groups_started} rank groups for {self.pool.restores} restores{redone})"

    def restore(self, files, dirs, digest: str, fresh: bool = False) -> PhaseResult:
        warm = self.pool is not None and not fresh
        return self._in_state(files, dirs, f"{'fresh-' if fresh else ''}{digest[:12]}", RESTART, Start.STRATEGY, None,
                              lambda plan: self.pool.restore(plan, self.case.timeouts.phase_s) if warm else None)

    def restore_step(self, files, dirs, digest: str, step: int) -> PhaseResult:
        """The availability probe of a refused restore (`resilience.run.availability`): the crash
        state again, its step ``step`` restored with ``load_step`` in fresh ranks."""
        return self._in_state(files, dirs, f"{FALLBACK}-{step}-{digest[:12]}", FALLBACK, Start.STEP, step,
                              lambda plan: None)

    def _in_state(self, files, dirs, label: str, phase: str, start: Start, step: int | None, warm) -> PhaseResult:
        """Materialise the state, run ``phase`` on it (``warm(plan)``: its result from the warm pool,
        or None: in fresh ranks through the harness), remove the state unless kept."""
        name = f"{self.count:04d}-{label}"
        self.count += 1
        state_dir = self.work_dir / "crash_states" / name
        materialise(files, dirs, state_dir)
        case = self.case
        phase_dir = self.work_dir / "restores" / name
        plan = replace(self.plan.make(phase, case.restart.world_size, start, save=phase == RESTART,
                                      snapshot_step=step, rank_map=case.restart.rank_map, phase_dir=phase_dir),
                       checkpoint_dir=str(state_dir), observe_paths=phase == RESTART)  # the reduction learns
        agents = node_agents_for(case, Path(f"{phase_dir}-agents")) if self.with_agents else None
        try:
            if agents is not None:
                agents.start()
                plan = replace(plan, node_agents=str(agents.root))
            result = warm(plan)
            if result is not None and not result.every_rank_joined():
                # the warm group never formed (a rendezvous that timed out on a loaded machine): no
                # evidence about the strategy, which never ran; fresh ranks restore the state instead
                self.regrouped += 1
                retry_dir = Path(f"{plan.phase_dir}-fresh")
                plan, result = replace(plan, phase_dir=str(retry_dir), store_path=str(retry_dir / "store")), None
            return result if result is not None else self.run_phase(plan, case, backend=backend_for_launch(case, 1))
        finally:
            if agents is not None:
                agents.stop()
            if not self.keep:
                remove_tree(state_dir)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
