"""Is a user's script reproducible at all, and the weaker oracle for one that is not.

Two uninterrupted runs of a bitwise-reproducible script log the same losses and state digests on
every rank (`first_difference` finds where they do not). A script that is not (GPU kernels with
atomics, data-loader workers that race) cannot be judged bitwise; ``oracle: envelope`` judges it
against the spread N uninterrupted runs show themselves: per rank and step, the band between their
lowest and highest loss, widened around its middle by a stated factor (`Envelope`). The verdict
names it as the weaker guarantee it is.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..core.plan import FIRST_RUN
from ..core.records import Divergence


class StepLog(Protocol):
    """What the envelope reads of one rank's run (`oracle.blackbox.RankLog`)."""

    rank: int
    digests: dict[int, dict[str, str]]

    def step_losses(self, restored: int = 0) -> dict[int, float]: ...


def first_difference(one: Sequence[StepLog], other: Sequence[StepLog]) -> str | None:
    """Where two uninterrupted runs part (the first step, then the lowest rank), in words; None
    when every rank logged the same losses and state digests."""
    found = []
    for a, b in zip(one, other, strict=False):
        losses_a, losses_b = a.step_losses(), b.step_losses()
        for step in sorted(set(losses_a) | set(losses_b)):
            if losses_a.get(step) != losses_b.get(step):
                found.append((step, a.rank, f"its loss is {losses_a.get(step)!r} in one and {losses_b.get(step)!r} "
                                            "in the other"))
                break
            parts = sorted(part for part in _moving_parts(a) | _moving_parts(b)
                           if a.digests.get(step, {}).get(part) != b.digests.get(step, {}).get(part))
            if parts:
                found.append((step, a.rank, f"its state before the step differs ({', '.join(parts)})"))
                break
    if not found:
        return None
    step, rank, what = min(found)
    return f"two uninterrupted runs part at step {step} on rank {rank}: {what}"


def _moving_parts(log: StepLog) -> set[str]:
    """The digest parts that change during the run: a stream that never moves is one the script
    does not use (Python's and NumPy's are seeded afresh in every process), and says nothing."""
    values: dict[str, set[str]] = {}
    for digest in log.digests.values():
        for part, value in digest.items():
            values.setdefault(part, set()).add(value)
    return {part for part, seen in values.items() if len(seen) > 1 or part in ("parameters", "optimizer")}


@dataclass(frozen=True)
class Envelope:
    """Per rank and step the band (low, high) a faulted run's loss must stay within."""

    runs: int
    factor: float
    bands: Mapping[int, Mapping[int, tuple[float, float]]]

    @classmethod
    def of(cls, references: Sequence[Sequence[StepLog]], factor: float) -> Envelope:
        """``references``: each uninterrupted run's logs, one per rank."""
        bands: dict[int, dict[int, tuple[float, float]]] = {}
        for run in references:
            for log in run:
                for step, loss in log.step_losses().items():
                    low, high = bands.setdefault(log.rank, {}).get(step, (loss, loss))
                    bands[log.rank][step] = (min(low, loss), max(high, loss))
        widened = {rank: {step: _widen(low, high, factor) for step, (low, high) in steps.items()}
                   for rank, steps in bands.items()}
        return cls(runs=len(references), factor=factor, bands=widened)

    def miss(self, rank: int, losses: Mapping[int, float], phase: str, after: int = 0
             ) -> tuple[Divergence | None, list[str]]:
        """The first step after ``after`` whose loss leaves the band (or that no reference reached)."""
        band = self.bands.get(rank, {})
        for step in sorted(s for s in losses if s > after):
            low, high = band.get(step, (None, None))
            if low is None or not low <= losses[step] <= high:
                where = f"[{low!r}, {high!r}]" if low is not None else "(no uninterrupted run reached it)"
                middle = None if low is None else (low + high) / 2
                return (Divergence(phase=phase, rank=rank, step=step, expected=middle, got=losses[step]),
                        [f"{'first run' if phase == FIRST_RUN else 'after restore'}: rank {rank} loss at step "
                         f"{step} is {losses[step]!r}, outside the envelope {where}"])
        return None, []

    def describe(self) -> str:
        return (f"judged within the envelope of {self.runs} uninterrupted runs (their spread per step, widened "
                f"{self.factor:g} times), not bitwise: a weaker guarantee than a bitwise oracle")


def _widen(low: float, high: float, factor: float) -> tuple[float, float]:
    middle, half = (low + high) / 2, (high - low) / 2 * factor
    return (middle - half, middle + half) if half else (low, high)
