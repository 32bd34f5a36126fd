"""What the faults cost an operator, per strategy: steps trained twice and seconds spent getting
back (restart, then replay), beside the time to restore, summed over a qualification's cases."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StrategyLoss:
    strategy: str
    cases: int  # cases of this strategy that ran
    restored: int  # of which the restart restored something (the others lost the job, not steps)
    steps_lost: int
    restart_s: float  # group start-up and strategy.load, summed
    replay_s: float  # training the lost steps again, summed
    restore_s: float  # strategy.load alone (slowest rank), summed
    refused_with_intact: int  # LOUD restores that left an intact older checkpoint unused

    @property
    def lost_s(self) -> float:
        return self.restart_s + self.replay_s


def per_strategy(cases: Iterable[Any]) -> tuple[StrategyLoss, ...]:
    """From `qualification.CaseRecord`s: one row per strategy, in the order the cases name them; cases
    that never ran are left out."""
    rows: dict[str, list[Any]] = {}
    for case in cases:
        if case.verdict is not None:
            rows.setdefault(case.strategy, []).append(case)
    return tuple(StrategyLoss(
        strategy=name, cases=len(records), restored=sum(r.restored_step is not None for r in records),
        steps_lost=sum(r.steps_lost or 0 for r in records), restart_s=sum(r.restart_s or 0.0 for r in records),
        replay_s=sum(r.replay_s or 0.0 for r in records), restore_s=sum(r.restore_s or 0.0 for r in records),
        refused_with_intact=sum(r.intact_step is not None for r in records)) for name, records in rows.items())


def lost_line(steps: int | None, restart_s: float | None, replay_s: float | None) -> str:
    """'3 steps, 1.24 s (restart 0.80 s + replay 0.44 s)', or '-' when nothing was restored."""
    if steps is None or restart_s is None or replay_s is None:
        return "-"
    return (f"{steps} step{'s' if steps != 1 else ''}, {restart_s + replay_s:.2f} s "
            f"(restart {restart_s:.2f} s + replay {replay_s:.2f} s)")
