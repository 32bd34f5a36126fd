"""The oracle of a script's timeline: each launch after the first run restored from the checkpoints
of the launches before it, judged as a restart is (`oracle.blackbox.judge_logs`) against the
history of those launches, each rank's steps counted from the start of the job; the verdict is
the worst launch's, and every finding names its launch (the first run is launch 1)."""
from __future__ import annotations

from dataclasses import replace

from ..core.records import Verdict
from .blackbox import RankLog, judge_logs
from .envelope import Envelope
from .rules import SEVERITY


def judge_timeline(reference: list[RankLog], launches: list[list[RankLog]], hung: str | None,
                   envelope: Envelope | None = None, complete: bool = True) -> Verdict:
    """``launches``: each launch's logs, the first run first, as far as the job went (a launch that
    failed other than by its fault, or hung, is the last); ``hung``: the part of the last launch
    past its deadline; ``complete``: the last launch is the timeline's last (it must reach the end)."""
    history, verdicts = [launches[0]], []
    for index in range(1, len(launches)):
        last = index == len(launches) - 1
        verdict = judge_logs(reference, merged(history), launches[index], hung if last else None, envelope,
                             to_the_end=last and complete)
        verdicts.append(verdict)
        history.append([log.shifted(verdict.restored_step or 0) for log in launches[index]])
    if not verdicts:  # the first run hung or failed: no launch restored
        return judge_logs(reference, launches[0], None, hung, envelope)
    worst = max(verdicts, key=lambda verdict: SEVERITY[verdict.kind])  # the first of the worst
    restores = [f"launch {number} restored step {verdict.restored_step} (newest complete "
                f"{verdict.complete_step}): {verdict.kind.value}" for number, verdict in enumerate(verdicts, 2)]
    findings = [f"launch {number}: {line}" for number, verdict in enumerate(verdicts, 2) for line in verdict.findings]
    return replace(worst, findings=tuple(findings + restores))


def merged(launches: list[list[RankLog]]) -> list[RankLog]:
    """Each rank's history over ``launches`` (steps from the start of the job): its losses and
    states, a later launch's where both trained a step, every save and file written; the errors,
    faults, restores and reads of the last launch, which the next one follows."""
    ranks = []
    for logs in zip(*launches, strict=True):
        last = logs[-1]
        ranks.append(replace(
            last, losses=_union(log.losses for log in logs), observed=_union(log.observed for log in logs),
            digests=_union(log.digests for log in logs), after=_union(log.after for log in logs),
            saved=tuple(step for log in logs for step in log.saved),
            written=tuple(item for log in logs for item in log.written)))
    return ranks


def _union(mappings) -> dict:
    """One mapping of all, a later one's value where two hold a key."""
    return {key: value for mapping in mappings for key, value in mapping.items()}
