"""The oracle of every launch after the first run, where launches compute differently.

A launch that restores step S at the parallel layout and under the software of the launch that
saved S is judged by that launch's own oracle (the reference for the first run). A launch that
computes otherwise (another TP, PP or DP degree, other software) is judged by a continuation: the
trusted state at S (the saving launch's oracle's snapshot of it), trained on by fresh ranks at
the launch's own layout and software. A continuation that a later launch may restore from records
its states and snapshots in turn, so the chain goes on over any number of launches. Software that
went on bit for bit as the saver's oracle does needs no continuation (the job ended as it would
have).
"""
from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core.case import Case
from ..core.plan import CONTINUATION, Start
from ..core.records import PhaseResult
from ..launch.backend import backend_for_launch
from ..oracle.judge import went_on_as


@dataclass(frozen=True)
class Link:
    """One run's oracle: the phase whose states and losses it is judged by (None: none could be
    computed), which launch's layout and software that phase ran at, and its snapshots."""
    oracle: PhaseResult | None
    computed_at: int
    snapshots: Path | None


def continuation_name(index: int) -> str:
    """The continuation judging launch ``index``: ``continuation``, ``continuation_2``, ..."""
    return CONTINUATION if index == 1 else f"{CONTINUATION}_{index}"


def saver_of(step: int, runs: list[PhaseResult], index: int) -> int:
    """The last run before launch ``index`` whose save of ``step`` returned on every rank (its files
    are the ones that launch found; 0, the first run, where none did)."""
    return next((j for j in range(index - 1, -1, -1) if step in runs[j].complete_saves()), 0)


def oracles(case: Case, plan, reference: PhaseResult, snapshots: Path | None, runs: list[PhaseResult],
            run_phase: Callable[..., PhaseResult]) -> list[PhaseResult | None]:
    """The oracle of each launch in ``runs[1:]`` (``runs[0]``: the first run), running the
    continuations it needs; None for a launch that restored nothing, or whose trusted state is missing."""
    chain = [Link(reference, 0, snapshots)]
    last = len(runs) - 1
    for index in range(1, len(runs)):
        restored = runs[index].restored()
        if 0 not in restored:
            chain.append(Link(None, index, None))
            continue
        step = restored[0]["step"]
        source = chain[saver_of(step, runs, index)]
        if source.oracle is None or case.computes_alike(index, source.computed_at) or (
                case.launch_placement(index).parallel == case.launch_placement(source.computed_at).parallel
                and went_on_as(runs[index], source.oracle, step)):
            chain.append(source)
            continue
        trusted = source.snapshots / f"step_{step}" if source.snapshots else None
        if trusted is None or not trusted.is_dir():
            chain.append(Link(None, index, None))
            continue
        chained = index < last  # a later launch may restore what this one saved
        own = plan.work_dir / f"{continuation_name(index)}_snapshots"
        shutil.copytree(trusted, own / trusted.name)
        incarnation = case.incarnations[index - 1].restart
        case_file = plan.work_dir / f"case_{index}.json"  # a timeline's launch: the case as its ranks ran it
        phase = run_phase(plan.make(continuation_name(index), incarnation.world_size, Start.SNAPSHOT, snapshot_dir=own,
                                    snapshot_step=step, record_states=chained, topology=incarnation.placement,
                                    case_file=case_file if case_file.is_file() else None),
                          case, backend=backend_for_launch(case, index))
        chain.append(Link(phase, index, own if chained else None))
    return [link.oracle for link in chain[1:]]

