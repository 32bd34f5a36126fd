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
import os
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core.elastic_layout import Incarnation
from ..core.records import Verdict
from ..disk.crash_states import CrashModel, CrashPoint, check_fidelity
from ..disk.enumeration import distinct_states
from ..disk.state_tree import materialise, state_hash
from ..errors import HarnessError
from ..faults.write_path.power_loss import trace_dir
from ..oracle.blackbox import RankLog, judge_logs
from ..oracle.envelope import Envelope
from ..oracle.rules import SEVERITY
from .blackbox_records import BlackBoxResult
from .explore_records import PROFILE_VARIABLE

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


def explore_job(run, job_dir: Path, reference: list[RankLog], envelope: Envelope | None) -> BlackBoxResult:
    """``run`` (`run.blackbox`)'s power loss: the traced first run (it ends once the traced save
    returned), then `explore_script`."""
    hung = run.launch(job_dir, fault=run.fault, launch=0, args=run.job.args, restarts=0)
    first = run.logs(job_dir, Incarnation(0, 0))
    if hung or not any(log.fault_events for log in first):
        verdict = judge_logs(reference, first, None, hung, envelope)
        return BlackBoxResult(verdict, tuple(reference), tuple(first), None, None, run.work_dir)
    model = CrashModel(trace_dir(job_dir), run.ranks(0), run.fault["trigger"]["step"])
    check_fidelity(model, job_dir / "checkpoints")

    def restore(files: dict[str, bytes], dirs: set[str], label: str):
        run_dir = run.work_dir / "crash_states" / label
        materialise(files, dirs, run_dir / "checkpoints")
        hung = run.launch(run_dir, fault=None, launch=1, args=run.job.restart_args or run.job.args,
                            restarts=0)
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        return run.logs(run_dir, Incarnation(1, 0)), hung

    profile = os.environ.get(PROFILE_VARIABLE) or run.fault["params"].get("profile", "ci")
    verdict, state = explore_script(model, reference, first, restore, profile, envelope, run.rescaled)
    return BlackBoxResult(verdict, tuple(reference), tuple(first), state.restart, None, run.work_dir)
