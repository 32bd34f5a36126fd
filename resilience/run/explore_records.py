"""What an exploration found and how much it may explore: the profiles, each restored crash state,
the counts and the summary, and the ``exploration.json`` report (`run.explore`)."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass

from ..core.records import PhaseResult, Verdict
from ..disk.crash_states import CrashPoint


@dataclass(frozen=True)
class Profile:
    """How much to explore: distinct disk states enumerated at most (``states`` with warm restores,
    ``restores`` with fresh ones), and beyond that Hypothesis examples and real restores."""

    states: int
    examples: int
    restores: int
    derandomize: bool  # the same crash states on every run (CI)


PROFILE_VARIABLE = "RESILIENCE_EXPLORE_PROFILE"  # overrides every case's fault.profile
PROFILES = {"ci": Profile(states=120, examples=150, restores=60, derandomize=True),
            "long": Profile(states=2000, examples=400, restores=600, derandomize=False)}


@dataclass(frozen=True)
class StateResult:
    """One restored crash state."""

    point: CrashPoint
    digest: str
    verdict: Verdict
    restart: PhaseResult
    description: tuple[str, ...]


@dataclass(frozen=True)
class Exploration:
    """What the exploration saw: every restored state, the reported one, and the counts."""

    states: tuple[StateResult, ...]
    reported: StateResult
    failing: bool  # the reported state's verdict is worse than the scenario expects
    draws: int  # crash points drawn by Hypothesis (many give the same disk state)
    swept: int  # crash points of the sweep over every op boundary
    restores: int  # distinct disk states restored by real ranks
    enumerated: int | None = None  # distinct disk states of the bounded model, when all were explored
    too_large: str = ""  # why the save was searched rather than enumerated
    restored_in: str = "fresh ranks"
    canaries: int = 0  # states restored again by fresh ranks
    canary_note: str = ""  # a warm restore the fresh ranks disagreed with

    def counts(self) -> dict[str, int]:
        return dict(Counter(state.verdict.kind.value for state in self.states))

    def summary(self, step: int) -> str:
        if self.enumerated is not None:
            how = (f"explored {self.restores} of {self.enumerated} distinct crash states (every op boundary, "
                   f"every bounded loss: docs/exploration.md)")
        else:
            how = (f"too large to enumerate ({self.too_large}): {self.swept} crash points swept (every op "
                   f"boundary, all or no volatile state lost), {self.draws} drawn by Hypothesis, "
                   f"{self.restores} distinct disk states restored")
        canary = (f"; {self.canaries} restored again by fresh ranks: same verdicts" if self.canaries and
                  not self.canary_note else "")
        return (f"power loss in the step-{step} save: {how}, in {self.restored_in}{canary}; judged "
                f"{len(self.states)} ways (which ranks' saves had returned): "
                + ", ".join(f"{kind} {n}" for kind, n in sorted(self.counts().items())))


def report(exploration: Exploration) -> dict:
    def state(s: StateResult) -> dict:
        return {"digest": s.digest, "verdict": s.verdict.kind.value, "point": asdict(s.point),
                "description": list(s.description), "findings": list(s.verdict.findings)}

    return {"time": time.time(), "swept": exploration.swept, "draws": exploration.draws,
            "restores": exploration.restores, "enumerated": exploration.enumerated,
            "too_large": exploration.too_large, "restored_in": exploration.restored_in,
            "canaries": exploration.canaries, "canary_note": exploration.canary_note,
            "counts": exploration.counts(),
            "failing": exploration.failing, "reported": state(exploration.reported),
            "states": [state(s) for s in exploration.states]}
