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
    reduced_states: int  # with the reduction: distinct states enumerated at most (real restores: as above)


PROFILE_VARIABLE = "RESILIENCE_EXPLORE_PROFILE"  # overrides every case's fault.profile
PROFILES = {"ci": Profile(states=120, examples=150, restores=60, derandomize=True, reduced_states=1000),
            "long": Profile(states=2000, examples=400, restores=600, derandomize=False, reduced_states=5000)}


@dataclass(frozen=True)
class StateResult:
    """One restored crash state."""

    point: CrashPoint
    digest: str
    verdict: Verdict
    restart: PhaseResult
    description: tuple[str, ...]
    stand_in: str | None = None  # the restored state whose restart served this one (the reduction)


@dataclass(frozen=True)
class Exploration:
    """What the exploration saw: every restored state, the reported one, and the counts."""

    states: tuple[StateResult, ...]
    reported: StateResult
    failing: bool  # the reported state's verdict is worse than the scenario expects
    draws: int  # crash points drawn by Hypothesis (many give the same disk state)
    swept: int  # crash points of the sweep over every op boundary
    restores: int  # distinct disk states restored by real ranks, or judged with a stand-in's restart
    enumerated: int | None = None  # distinct disk states of the bounded model, when all were explored
    too_large: str = ""  # why the save was searched rather than enumerated
    restored_in: str = "fresh ranks"
    canaries: int = 0  # states restored again by fresh ranks
    canary_note: str = ""  # a warm restore the fresh ranks disagreed with
    stood_in: int = 0  # of ``restores``, those judged with another state's restart (the reduction)

    def counts(self) -> dict[str, int]:
        return dict(Counter(state.verdict.kind.value for state in self.states))

    def summary(self, step: int) -> str:
        reduced = (f" ({self.restores - self.stood_in} restored, {self.stood_in} answering every look of one "
                   f"of those restores alike)") if self.stood_in else ""
        if self.enumerated is not None:
            how = (f"explored {self.restores} of {self.enumerated} distinct crash states{reduced} (every op "
                   f"boundary, every bounded loss: docs/exploration.md)")
        else:
            how = (f"too large to enumerate ({self.too_large}): {self.swept} crash points swept (every op "
                   f"boundary, all or no volatile state lost), {self.draws} drawn by Hypothesis, "
                   f"{self.restores} distinct disk states judged{reduced}")
        canary = (f"; {self.canaries} restored again by fresh ranks: same verdicts" if self.canaries and
                  not self.canary_note else "")
        return (f"power loss in the step-{step} save: {how}, in {self.restored_in}{canary}; judged "
                f"{len(self.states)} ways (which ranks' saves had returned): "
                + ", ".join(f"{kind} {n}" for kind, n in sorted(self.counts().items())))


def report(exploration: Exploration) -> dict:
    def state(s: StateResult) -> dict:
        return {"digest": s.digest, "verdict": s.verdict.kind.value, "restored_step": s.verdict.restored_step,
                "point": asdict(s.point),
                "description": list(s.description), "findings": list(s.verdict.findings),
                "stand_in": s.stand_in}

    return {"time": time.time(), "swept": exploration.swept, "draws": exploration.draws,
            "restores": exploration.restores, "enumerated": exploration.enumerated,
            "too_large": exploration.too_large, "restored_in": exploration.restored_in,
            "canaries": exploration.canaries, "canary_note": exploration.canary_note,
            "stood_in": exploration.stood_in,
            "counts": exploration.counts(),
            "failing": exploration.failing, "reported": state(exploration.reported),
            "states": [state(s) for s in exploration.states]}
