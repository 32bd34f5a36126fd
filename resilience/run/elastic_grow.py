"""A spare that grew a shrunk elastic job back (``--nnodes MIN:MAX``): the grown group's restore, judged.

The first restart (the survivors alone, at ``restart.world_size``) is the case's restore, judged as
always. When a spare node joins that running group, the agents restart it at the first run's size:
that later incarnation restores with the strategy at the full size again, and it is judged by the
oracle's rules too, against the oracle's continuation on its own topology. On the first run's
topology that continuation is the job's own reference (the trusted state at each step, and every
later loss), which is what the local harness judges a same-topology restore against. A checkpoint
the shrunk group wrote itself (a step after the one it restored) comes from another computation
(the continuation at the smaller size): the grown restore of such a step is reported, not judged.
"""
from __future__ import annotations

from dataclasses import replace

from ..core.case import Case, VerdictKind
from ..core.elastic_layout import Incarnation, TorchrunLayout
from ..core.events import Event, read_events
from ..core.plan import RESTART
from ..core.records import PhaseResult, Verdict
from ..oracle.judge import judge

GROWN = "grown"


def superseded(layout: TorchrunLayout, incarnation: Incarnation) -> bool:
    """A restart group the agents tore down for a membership change before it restored or failed
    (a spare joined while it started): a later group of the same launch restores instead."""
    size = layout.round_size(incarnation)
    if incarnation.is_first or not size or not any(later.launch == incarnation.launch and later > incarnation
                                                   for later in layout.incarnations()):
        return False
    outcomes = [layout.read_outcome(incarnation, rank) for rank in range(size)]
    if not all(outcome and outcome["torn_down_by"] for outcome in outcomes):
        return False
    events = [e for rank in range(size)
              for e in read_events(layout.phase_dir(incarnation, RESTART) / f"rank{rank}.events.jsonl")]
    return not any(e["event"] in (Event.RESTORED, Event.ERROR) for e in events)


def judge_job(case: Case, phases: list[PhaseResult], continuation: list[PhaseResult], found: tuple[str, ...],
              intact: int | None, noted: tuple[str, ...] = ()) -> Verdict:
    """The verdict of an elastic job: its first restore, and the restore of a group grown back
    after it; a first restore by a group already grown back (the smaller one was superseded) is
    judged at the first run's size."""
    reference, first_run, restart = phases[:3]
    if is_grown(case, restart):
        note = (f"the job grown back to {restart.world_size} ranks restored first (the smaller group was torn "
                f"down for the spare before it restored): judged against the reference at that size",)
        return judge(grown_case(case), reference, first_run, restart, fault_findings=found, fault_notes=note + noted,
                     intact_step=intact)
    grown = next((p for p in phases[3:] if is_grown(case, p)), None)
    grown_found, grown_notes = judge_grown(case, reference, first_run, restart, grown) if grown else ((), ())
    return judge(case, reference, first_run, restart, *continuation, fault_findings=found + grown_found,
                 fault_notes=grown_notes + noted, intact_step=intact)


def grown_case(case: Case) -> Case:
    """The case as the grown group runs it: its restart at the first run's size and placement."""
    size = case.workload.world_size
    return replace(case, restart=replace(case.restart, world_size=size, rank_map=tuple(range(size)),
                                         topology=case.placement))


def is_grown(case: Case, restart: PhaseResult) -> bool:
    """A restart at the first run's size where the case restarts at a smaller one (a spare grew it back)."""
    return case.topology_changes and restart.world_size == case.workload.world_size != case.restart.world_size


def judge_grown(case: Case, reference: PhaseResult, first_run: PhaseResult, shrunk: PhaseResult,
                grown: PhaseResult) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(findings, notes) of the grown group's restore: each finding makes the case's verdict SILENT
    (or LOUD words for an error are reported as findings too), the notes say what was judged."""
    restored, shrunk_restored = grown.restored(), shrunk.restored()
    if 0 not in restored or 0 not in shrunk_restored:
        error = grown.first_error.summary() if grown.first_error else grown.status
        return ((f"the job grown back to {grown.world_size} ranks ({grown.name}) restored nothing: {error}",)
                if grown.first_error else (), (f"grown back to {grown.world_size} ranks ({grown.name}): {error}",))
    step, since = restored[0]["step"], shrunk_restored[0]["step"]
    shrunk_saved = shrunk.complete_saves()
    if step > since:
        return (), (f"grown back to {grown.world_size} ranks ({grown.name}): restored step {step}, which the "
                    f"shrunk group wrote; not judged (its oracle is the smaller continuation's)",)
    newer = [s for s in shrunk_saved if s > step]
    verdict = judge(grown_case(case), reference, first_run, replace(grown, name=f"restart ({GROWN})"))
    found = [f"grown back to {grown.world_size} ranks: {line}" for line in verdict.findings
             if verdict.kind is not VerdictKind.RECOVERED]
    if newer:
        found.append(f"grown back to {grown.world_size} ranks ({grown.name}): restored step {step}, though the "
                     f"shrunk group had completed the save of step {newer[-1]}")
    note = (f"grown back to {grown.world_size} ranks ({grown.name}): restored step {step}, "
            f"{verdict.kind.name} against the reference at that size")
    return tuple(found), (note,)
