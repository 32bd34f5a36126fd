"""The explorer's reduction: a crash state whose every answer to a restore's looks equals a
restored state's is judged with that state's restart, not restored again (`resilience.disk.observed`
says why that is sound, and docs/exploration.md what it cannot see). The claim is checked, not
trusted: the reported state, if it stood in, and a few of the others are restored for real, and a
disagreement turns the reduction off for the case (`run.explore`)."""
from __future__ import annotations

from collections.abc import Callable

from ..core.events import Event
from ..core.records import PhaseResult
from ..disk.enumeration import Enumeration
from ..disk.observed import Observed, TreeIndex


class Reduction:
    """Learns from each real restore what it looked at; answers which restored state another one
    stands for. ``stand_ins``: state digest -> the digest of the restored state that served it."""

    def __init__(self) -> None:
        self.learned: list[tuple[Observed, tuple, str]] = []
        self.stand_ins: dict[str, str] = {}

    def stand_in(self, index: TreeIndex) -> str | None:
        """The restored state whose every look ``index`` answers alike, or None."""
        return next((digest for looks, answers, digest in self.learned if looks.answers(index) == answers), None)

    def learn(self, index: TreeIndex, digest: str, restart: PhaseResult) -> None:
        """What the real restore of ``index`` looked at. A restore whose group never formed on every
        rank, or that looked at nothing, stands for no other state."""
        if not restart.every_rank_joined():
            return
        looks = [(e["path"], e["how"]) for e in sorted(restart.events(Event.PATH_OBSERVED), key=lambda e: e["time"])]
        if looks:
            observed = Observed.of(looks)
            self.learned.append((observed, observed.answers(index), digest))


def enumerate_within(enumeration: Enumeration, evaluate: Callable[..., object], budget: int, most: int) -> bool:
    """Evaluate every point of every distinct state (``evaluate(point, limit=, index=)``, None once
    its restores reach ``limit``); whether all were. The restores stop at ``budget``, or go on to
    ``most`` (what a search may restore once it shrinks a failure: half again) where the states
    covered so far say the rest fit: the search that replaces a whole enumeration costs as much."""
    limit, states = budget, enumeration.states
    for done, distinct in enumerate(states):
        for point in distinct.points:
            if evaluate(point, limit=limit, index=distinct.index) is not None:
                continue
            if limit == most or budget * len(states) > most * max(done, 1):
                return False
            limit = most  # the states so far needed ``budget`` restores: at that rate the rest fit
            if evaluate(point, limit=limit, index=distinct.index) is None:
                return False
    return True
