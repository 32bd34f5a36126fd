"""Crash-state exploration: a power cut at every point of one save, restored by real ranks.

One case with ``fault: {kind: power_loss, step: S}``:

1. the reference run (cached, as for every case);
2. the first run, every rank tracing its IO (`resilience.faults.power_loss`), ending once the
   step-S save returned; the trace must rebuild the checkpoint directory byte for byte, or the
   case is a harness error (something wrote past the interception layer);
3. Hypothesis draws crash points (`resilience.disk.crash_states`): per-rank cuts, lost metadata, what
   became of each file's unsynced data. Each distinct disk state (by content hash) is materialised
   as a real directory and restored by fresh real ranks (the case's restart), then judged by the
   same oracle as every case. A verdict worse than the scenario expects is a failure, and
   Hypothesis shrinks it to the smallest crash state that still gives it.

What counts as saved: the step-S save counts as complete only where the cut lets every rank's
``save`` return (a power cut after the save returned everywhere); otherwise the newest complete
checkpoint is the one before, and restoring it is RECOVERED: the save in progress never returned.
Restoring step S from a state that differs from the reference is SILENT, as is falling back past a
save that had returned on every rank.
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from collections.abc import Callable

from ..disk.crash_states import BLOCK, HOW, CrashModel, CrashPoint, Loss
from ..disk.state_tree import materialise, read_tree, remove_tree, state_hash
from ..errors import HarnessError
from ..faults.power_loss import trace_dir
from ..core.plan import FIRST_RUN, RESTART
from ..core.case import Case, VerdictKind
from ..core.records import CaseResult, PhaseResult, Verdict
from ..launch.backend import backend_for_restart
from ..oracle.judge import judge


# A lost writeback is drawn as one or two 4 KiB blocks: wider holes hit a zip header more often,
# which torch.load refuses, and tell less about whether a reader notices a hole.
MAX_ZERO_BLOCKS = 2
SEVERITY = {VerdictKind.RECOVERED: 0, VerdictKind.LOUD: 1, VerdictKind.HANG: 2, VerdictKind.SILENT: 3}


@dataclass(frozen=True)
class Profile:
    """How much to explore: Hypothesis examples, and real restores (distinct disk states) at most."""

    examples: int
    restores: int
    derandomize: bool  # the same crash states on every run (CI)


PROFILE_VARIABLE = "RESILIENCE_EXPLORE_PROFILE"  # overrides every case's fault.profile
PROFILES = {"ci": Profile(examples=150, restores=60, derandomize=True),
            "long": Profile(examples=400, restores=600, derandomize=False)}


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

    def counts(self) -> dict[str, int]:
        return dict(Counter(state.verdict.kind.value for state in self.states))


class _WorseThanExpected(Exception):
    def __init__(self, state: StateResult):
        super().__init__(state.verdict.kind.value)
        self.state = state


def crash_points(model: CrashModel):
    """The Hypothesis strategy of crash points of ``model``'s save; simplest first (shrinks to
    early cuts, nothing lost)."""
    from hypothesis import strategies as st

    boundaries = model.boundaries()

    @st.composite
    def draw_point(draw) -> CrashPoint:
        # integers, not sampled_from: Hypothesis draws the ends (no op done, every op done) often
        cuts = model.cuts_at(boundaries[draw(st.integers(0, len(boundaries) - 1))])
        volatile = model.volatile(cuts)
        lost_metadata = draw(st.integers(0, len(volatile.metadata)))
        dirty = {path: (unsynced, size) for path, unsynced, size in volatile.dirty}
        if draw(st.booleans()):  # every file draws its own fate, as after a real power cut
            fates = [(path, draw(st.sampled_from(HOW))) for path in dirty]
        else:  # one or two files lose data, the rest reach the disk: what shrinking ends on
            lossy = draw(st.lists(st.sampled_from(list(dirty)), unique=True, max_size=2)) if dirty else []
            fates = [(path, draw(st.sampled_from(HOW[1:]))) for path in dirty if path in lossy]
        losses = []
        for path, how in fates:
            unsynced, size = dirty[path]
            if how == "prefix" and unsynced:
                losses.append(Loss(path, how, keep_bytes=draw(st.integers(0, unsynced - 1))))
            elif how == "zeros" and size:
                blocks = (size + BLOCK - 1) // BLOCK
                first = draw(st.integers(0, blocks - 1))
                count = draw(st.integers(1, min(MAX_ZERO_BLOCKS, blocks - first)))
                losses.append(Loss(path, how, zero_from=first * BLOCK, zero_to=min(size, (first + count) * BLOCK)))
            elif how == "drop":
                losses.append(Loss(path, how))
        return CrashPoint(cuts=cuts, lost_metadata=lost_metadata, losses=tuple(losses))

    return draw_point()


class Explorer:
    """Runs one power_loss case. ``run_phase(plan, case, backend=None)`` runs one phase of real
    ranks (the harness's `Harness.run_phase`); ``keep``: keep each materialised crash state."""

    def __init__(self, run_phase: Callable[..., PhaseResult], keep: bool = False, profile: str | None = None,
                 max_restores: int | None = None):
        self.run_phase, self.keep = run_phase, keep
        self.profile_name = profile
        self.max_restores = max_restores

    def run(self, case: Case, work_dir: Path, checkpoint_dir: Path, plan, reference: PhaseResult) -> CaseResult:
        if case.topology_changes:
            raise HarnessError(f"{case.source}: a power_loss case restores at the world size it saved with "
                               f"(restart.world_size {case.restart.world_size} != {case.workload.world_size})")
        first_run = self.run_phase(plan.make(FIRST_RUN, case.workload.world_size, "fresh", save=True,
                                                  inject=True), case)
        if first_run.status != "completed":
            raise HarnessError(f"the traced first run did not complete ({first_run.status}): "
                               f"{first_run.first_error.summary() if first_run.first_error else ''}")
        step = case.fault.trigger.step
        model = CrashModel(trace_dir(work_dir), case.workload.world_size, step)
        _check_fidelity(model, checkpoint_dir)
        name = (self.profile_name or os.environ.get(PROFILE_VARIABLE) or case.fault.params.get("profile", "ci"))
        if name not in PROFILES:
            raise HarnessError(f"${PROFILE_VARIABLE}: unknown exploration profile {name!r}; "
                               f"allowed: {', '.join(PROFILES)}")
        profile = PROFILES[name]
        exploration = self._explore(case, model, work_dir, plan, reference, first_run, profile)
        reported = exploration.reported
        summary = (f"power loss in the step-{step} save: {exploration.swept} crash points swept (every op "
                   f"boundary, all or no volatile state lost), {exploration.draws} drawn by Hypothesis, "
                   f"{exploration.restores} distinct disk states restored by real ranks, judged "
                   f"{len(exploration.states)} ways (which ranks' saves had returned): "
                   + ", ".join(f"{kind} {n}" for kind, n in sorted(exploration.counts().items())))
        heading = ("crash state with this verdict (the smallest Hypothesis shrank to, or the sweep's "
                   "earliest):" if exploration.failing else "worst crash state found:")
        verdict = replace(reported.verdict, findings=(summary, heading) + tuple(
            f"  {line}" for line in reported.description) + reported.verdict.findings)
        (work_dir / "exploration.json").write_text(json.dumps(_report(exploration), indent=1))
        return CaseResult(case=case, verdict=verdict,
                          phases=(reference, _as_of(first_run, reported.point, model), reported.restart),
                          work_dir=work_dir)

    def _explore(self, case: Case, model: CrashModel, work_dir: Path, plan, reference, first_run,
                 profile: Profile) -> Exploration:
        from hypothesis import HealthCheck, Phase, assume, given, settings, target
        from hypothesis.errors import Unsatisfiable

        budget = self.max_restores if self.max_restores is not None else profile.restores
        restarts: dict[str, PhaseResult] = {}  # disk state -> its restore
        judged: dict[tuple, StateResult] = {}  # (disk state, ranks whose save returned) -> result
        order: list[StateResult] = []
        draws = [0]
        failed = [False]
        expected = case.expect.verdict

        def evaluate(point: CrashPoint) -> StateResult | None:
            """The state's result (restored once per distinct disk state), or None past the
            budget; shrinking a failure gets half the budget again."""
            files, dirs = model.disk(point)
            digest = state_hash(files, dirs)
            if digest not in restarts:
                if len(restarts) >= (budget + budget // 2 if failed[0] else budget):
                    return None
                restarts[digest] = self._restore(case, files, dirs, work_dir, plan, f"{len(restarts):04d}-{digest[:12]}")
            # the same disk state is judged apart for each set of ranks whose save had returned
            key = (digest, model.returned(point))
            if key not in judged:
                verdict = judge(case, reference, _as_of(first_run, point, model), restarts[digest])
                judged[key] = StateResult(point=point, digest=digest, verdict=verdict, restart=restarts[digest],
                                          description=tuple(model.describe(point)))
                order.append(judged[key])
            return replace(judged[key], point=point, description=tuple(model.describe(point)))

        def worse(state: StateResult) -> bool:
            return SEVERITY[state.verdict.kind] > SEVERITY[expected]

        # Every instant at which an op ends, twice: all volatile state reached the disk (what
        # killing every rank leaves), and none of it did. Cheap: many give the same disk state.
        swept = [state for state in map(evaluate, model.sweep()) if state is not None]

        @settings(max_examples=profile.examples, deadline=None, database=None, derandomize=profile.derandomize,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                  phases=(Phase.generate, Phase.target, Phase.shrink), print_blob=False)
        @given(crash_points(model))
        def property_holds(point: CrashPoint) -> None:
            draws[0] += 1
            state = evaluate(point)
            assume(state is not None)
            # Steer towards states the restore takes for the newest save: there a torn file
            # is either noticed or loaded as if whole.
            target(float(state.verdict.restored_step or 0), label="restored step")
            if worse(state):
                failed[0] = True
                raise _WorseThanExpected(state)

        shrunk = None
        try:
            property_holds()
        except _WorseThanExpected as failure:
            shrunk = failure.state
        except Unsatisfiable:  # the budget was spent before Hypothesis drew a state of its own
            pass
        if not order:
            raise HarnessError("the exploration restored no crash state")
        # The worst failure: Hypothesis's shrunk one, or else the earliest of the sweep's.
        failures = ([shrunk] if shrunk else []) + [state for state in swept if worse(state)]
        if failures:
            reported = max(failures, key=lambda state: SEVERITY[state.verdict.kind])
            return Exploration(states=tuple(order), reported=reported, failing=True, draws=draws[0],
                               swept=len(swept), restores=len(restarts))
        worst = max(order, key=lambda state: SEVERITY[state.verdict.kind])
        return Exploration(states=tuple(order), reported=worst, failing=False, draws=draws[0], swept=len(swept),
                           restores=len(restarts))

    def _restore(self, case: Case, files, dirs, work_dir: Path, plan, name: str) -> PhaseResult:
        """Fresh real ranks restore one materialised disk state (the case's restart phase)."""
        state_dir = work_dir / "crash_states" / name
        materialise(files, dirs, state_dir)
        restart_plan = replace(plan.make(RESTART, case.restart.world_size, "strategy", save=True,
                                         rank_map=case.restart.rank_map, phase_dir=work_dir / "restores" / name),
                               checkpoint_dir=str(state_dir))
        try:
            return self.run_phase(restart_plan, case, backend=backend_for_restart(case))
        finally:
            if not self.keep:
                remove_tree(state_dir)


def _as_of(first_run: PhaseResult, point: CrashPoint, model: CrashModel) -> PhaseResult:
    """The first run as it stood at the power cut: a rank's step-S save returned only if its cut
    reached the op that says so."""
    returned = model.returned(point)
    records = tuple(replace(record, events=tuple(
        event for event in record.events
        if not (event["event"] == "save_returned" and event["step"] == model.step and record.rank not in returned)))
        for record in first_run.ranks)
    return replace(first_run, ranks=records)


def _check_fidelity(model: CrashModel, checkpoint_dir: Path) -> None:
    """The trace, replayed in full, must give the checkpoint directory the first run left."""
    files, dirs = model.disk(model.complete())
    real_files, real_dirs = read_tree(checkpoint_dir)
    if state_hash(files, dirs) == state_hash(real_files, real_dirs):
        return
    differing = sorted(path for path in files.keys() | real_files.keys() if files.get(path) != real_files.get(path))
    differing += sorted(f"{d}/" for d in dirs ^ real_dirs)
    raise HarnessError("the IO trace does not rebuild the checkpoint directory (something wrote past the "
                       f"interception layer: os.write on a raw descriptor, another process); differing: "
                       f"{', '.join(differing[:10])}")


def _report(exploration: Exploration) -> dict:
    def state(s: StateResult) -> dict:
        return {"digest": s.digest, "verdict": s.verdict.kind.value, "point": asdict(s.point),
                "description": list(s.description), "findings": list(s.verdict.findings)}

    return {"time": time.time(), "swept": exploration.swept, "draws": exploration.draws,
            "restores": exploration.restores,
            "counts": exploration.counts(),
            "failing": exploration.failing, "reported": state(exploration.reported),
            "states": [state(s) for s in exploration.states]}
