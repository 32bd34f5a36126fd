"""Power loss on a user's script (black-box mode): the first run traces every rank's IO up to the
save of the fault's step and ends there (`resilience.faults.write_path.power_loss`); each distinct
disk state a power cut inside that save could leave (`resilience.disk.enumeration`) becomes the
checkpoint directory of a real restart of the script, judged by the black-box oracle against the
first run as it stood at the cut (a rank's save counts as returned only where the cut reached the
op that says so), as `resilience.run.explore` does for the built-in strategies.

A script's restore is a cold torchrun launch (about 10 s here) where a built-in strategy's is a
warm rank's load, so the budget counts restarts (``SCRIPT_RESTORES``): a save with more distinct
states than that is sampled along its op boundaries (every instant with all volatile state kept,
then all of it lost), evenly, the first and the last included, and the verdict says so.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from ..core.records import Verdict
from ..disk.crash_states import CrashModel, CrashPoint
from ..disk.enumeration import distinct_states
from ..disk.state_tree import state_hash
from ..errors import HarnessError
from ..oracle.blackbox import RankLog, judge_logs
from ..oracle.envelope import Envelope
from .explore import SEVERITY

SCRIPT_RESTORES = {"ci": 10, "long": 200}  # restarts of the script per power_loss case
#: restore(files, dirs, label) -> the restart's logs and the part that hung (None: none)
Restore = Callable[[dict[str, bytes], set[str], str], tuple[list[RankLog], str | None]]


@dataclass(frozen=True)
class ScriptState:
    """One restored crash state, judged for one set of ranks whose save had returned."""

    digest: str
    verdict: Verdict
    description: tuple[str, ...]
    restart: tuple[RankLog, ...]


def spread(items: list, count: int) -> list:
    """At most ``count`` of ``items``, evenly apart, the first and the last included."""
    count = min(count, len(items))
    return [items[i] for i in sorted({round(i * (len(items) - 1) / max(1, count - 1)) for i in range(count)})]


def explore_script(model: CrashModel, reference: list[RankLog], first_run: list[RankLog], restore: Restore,
                   profile: str, envelope: Envelope | None = None, rescaled: str | None = None
                   ) -> tuple[Verdict, ScriptState]:
    """The worst crash state's verdict, its findings led by what was explored, and that state."""
    if profile not in SCRIPT_RESTORES:
        raise HarnessError(f"exploration profile {profile!r} unknown; allowed: {', '.join(SCRIPT_RESTORES)}")
    budget = SCRIPT_RESTORES[profile]
    enumeration = distinct_states(model, budget)
    if enumeration.complete:
        chosen = [(state.digest, state.points) for state in enumeration.states]
        how = (f"explored {len(chosen)} of {len(chosen)} distinct crash states (every op boundary, every "
               f"bounded loss: docs/exploration.md), each restored by a restart of the script")
    else:
        swept: dict[str, list[CrashPoint]] = {}
        for point in model.sweep():
            swept.setdefault(state_hash(*model.disk(point)), []).append(point)
        every = list(swept.items())
        chosen = spread(every, budget)
        how = (f"sampled {len(chosen)} of the {len(every)} distinct crash states at its op boundaries "
               f"({enumeration.too_large}; a restart of the script each)")
    judged: list[ScriptState] = []
    for index, (digest, points) in enumerate(chosen):
        restart, hung = restore(*model.disk(points[0]), f"{index:03d}-{digest[:12]}")
        for returned in dict.fromkeys(model.returned(point) for point in points):
            point = next(p for p in points if model.returned(p) == returned)
            as_of = [dataclasses.replace(log, saved=tuple(s for s in log.saved if s != model.step
                                                          or log.rank in returned)) for log in first_run]
            verdict = judge_logs(reference, as_of, restart, hung, envelope, rescaled=rescaled,
                                 reads_from_run=False)
            judged.append(ScriptState(digest, verdict, tuple(model.describe(point)), tuple(restart)))
    reported = max(judged, key=lambda s: (SEVERITY[s.verdict.kind], s.verdict.restored_step or -1,
                                          -judged.index(s)))
    counts = Counter(state.verdict.kind.value for state in judged)
    summary = (f"power loss in the step-{model.step} save: {how}; judged {len(judged)} ways (which ranks' saves "
               "had returned): " + ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items())))
    findings = (summary, "worst crash state found:") + tuple(f"  {line}" for line in reported.description)
    verdict = dataclasses.replace(reported.verdict, findings=findings + reported.verdict.findings)
    return verdict, reported
