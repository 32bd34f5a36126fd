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
    restart_s: float | None  # group start-up and strategy.load, summed (None: no case was timed,
    replay_s: float | None  # training the lost steps again, summed     a user's script's, say)
    restore_s: float | None  # strategy.load alone (slowest rank), summed
    refused_with_intact: int  # LOUD restores that left an intact older checkpoint unused

    @property
    def lost_s(self) -> float | None:
        return None if self.restart_s is None or self.replay_s is None else self.restart_s + self.replay_s


def per_strategy(cases: Iterable[Any]) -> tuple[StrategyLoss, ...]:
    """From `qualification.CaseRecord`s: one row per strategy, in the order the cases name them; cases
    that never ran are left out."""
    rows: dict[str, list[Any]] = {}
    for case in cases:
        if case.verdict is not None:
            rows.setdefault(case.strategy, []).append(case)
    return tuple(_row(name, records) for name, records in rows.items())


def _row(name: str, records: list[Any]) -> StrategyLoss:
    timed = [r for r in records if r.restart_s is not None]

    def total(attribute: str) -> float | None:
        return sum(getattr(r, attribute) or 0.0 for r in timed) if timed else None

    return StrategyLoss(
        strategy=name, cases=len(records), restored=sum(r.restored_step is not None for r in records),
        steps_lost=sum(r.steps_lost or 0 for r in records), restart_s=total("restart_s"), replay_s=total("replay_s"),
        restore_s=total("restore_s"), refused_with_intact=sum(r.intact_step is not None for r in records))


def lost_line(steps: int | None, restart_s: float | None, replay_s: float | None) -> str:
    """'3 steps, 1.24 s (restart 0.80 s + replay 0.44 s)', or '-' when nothing was restored."""
    if steps is None or restart_s is None or replay_s is None:
        return "-"
    return (f"{steps} step{'s' if steps != 1 else ''}, {restart_s + replay_s:.2f} s "
            f"(restart {restart_s:.2f} s + replay {replay_s:.2f} s)")
