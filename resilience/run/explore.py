"""Crash-state exploration: a power cut at every point of one save, restored by real ranks.

One case with ``fault: {kind: power_loss, step: S}``:

1. the reference run (cached, as for every case);
2. the first run, every rank tracing its IO (`resilience.faults.write_path.power_loss`), ending once the
   step-S save returned; the trace must rebuild the checkpoint directory byte for byte, or the
   case is a harness error (something wrote past the interception layer);
3. every distinct disk state of the bounded crash model (`resilience.disk.enumeration`) is
   materialised as a real directory and restored by real ranks (the case's restart), then judged
   by the same oracle as every case; beyond the profile's budget, Hypothesis draws crash points
   instead (`resilience.run.explore_search`) and shrinks a failure to the smallest crash state that
   still gives it. Restores run in warm ranks (`resilience.run.warm_pool`) where the strategy says
   it keeps nothing between loads; one state in ``CANARY_EVERY``, and the reported one, is restored
   again by fresh ranks, and a disagreement discards every warm result (all restored afresh).

What counts as saved: the step-S save counts as complete only where the cut lets every rank's
``save`` return (a power cut after the save returned everywhere); otherwise the newest complete
checkpoint is the one before, and restoring it is RECOVERED: the save in progress never returned.
Restoring step S from a state that differs from the reference is SILENT, as is falling back past a
save that had returned on every rank.
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from ..core.case import Case
from ..core.events import Event
from ..core.records import CaseResult, PhaseResult, PhaseStatus
from ..disk.crash_states import CrashModel, CrashPoint, check_fidelity
from ..disk.enumeration import distinct_states
from ..disk.observed import TreeIndex
from ..errors import HarnessError
from ..faults.write_path.power_loss import trace_dir
from ..launch.backend import ProcessBackend
from ..oracle.judge import judge
from ..oracle.rules import SEVERITY
from . import availability
from .case_sequence import Progress, Step
from .crash_restores import CrashRestores
from .explore_records import PROFILE_VARIABLE, PROFILES, Exploration, Profile, StateResult, report
from .explore_reduction import Reduction, enumerate_within
from .explore_search import search
from .local_case import LocalCase, PhaseRunner

CANARY_EVERY = 10  # one warm-restored state in ten (the last one first) and the reported one: again in fresh ranks
STAND_IN_CANARIES = 3  # besides the reported one, states judged with a stand-in's restart restored for real


class Explorer(LocalCase):
    """Runs one power_loss case through the phase sequence (`run.case_sequence`): the reference and
    the first run as `LocalCase` takes them (the first run traced), the restart step restores every
    crash state, the probe checks the reported one's older checkpoints. ``warm_backend``: the
    harness's, for warm ranks (None: fresh ranks only); ``keep``: keep each materialised crash state;
    ``reduce``: judge a state that answers every look of a restored one's restore alike with that
    restore (`run.explore_reduction`)."""

    first_run_ends_agents = True  # the power cut takes the node agents and their memory

    skips = frozenset({
        Step.CHECK_SAVES,  # every crash state's restore checks the saves
        Step.ORACLES,  # the restart runs at the first run's world size: the reference is the oracle
        Step.FINDINGS,  # what the exploration found is its summary (judge)
    })

    def __init__(self, case: Case, work_dir: Path, run_phase: PhaseRunner, cache, keep: bool = False,
                 profile: str | None = None, max_restores: int | None = None,
                 warm_backend: ProcessBackend | None = None, reduce: bool = True):
        if case.topology_changes:
            raise HarnessError(f"{case.source}: a power_loss case restores at the world size it saved with "
                               f"(restart.world_size {case.restart.world_size} != {case.workload.world_size})")
        super().__init__(case, work_dir, run_phase, cache)
        self.store = None  # crash states are files: no object store takes part
        self.work_dir, self.keep = work_dir, keep
        self.profile_name = profile
        self.max_restores = max_restores
        self.warm_backend = warm_backend
        self.reduce = reduce  # False: every distinct crash state restored by real ranks (no stand-ins)
        self.restores: CrashRestores | None = None
        self.model: CrashModel | None = None
        self.exploration: Exploration | None = None

    def first_run(self, progress: Progress) -> Progress:
        progress = super().first_run(progress)
        first_run = progress.first_run
        if first_run.status != PhaseStatus.COMPLETED:
            raise HarnessError(f"the traced first run did not complete ({first_run.status}): "
                               f"{first_run.first_error.summary() if first_run.first_error else ''}")
        self.model = CrashModel(trace_dir(self.work_dir), self.case.workload.world_size, self.case.fault.trigger.step)
        check_fidelity(self.model, self.plan.checkpoint_dir)
        return progress

    def restart(self, progress: Progress) -> Progress:
        """Every distinct crash state (or Hypothesis's draws), each restored by real ranks."""
        case = self.case
        name = (self.profile_name or os.environ.get(PROFILE_VARIABLE) or case.fault.params.get("profile", "ci"))
        if name not in PROFILES:
            raise HarnessError(f"${PROFILE_VARIABLE}: unknown exploration profile {name!r}; "
                               f"allowed: {', '.join(PROFILES)}")
        self.restores = CrashRestores(case, self.plan, self.work_dir, self.run_phase, self.warm_backend, self.keep)
        self.exploration = _explore(case, self.model, self.restores, progress.reference, progress.first_run,
                                    PROFILES[name], self.max_restores, self.reduce)
        return replace(progress, restart=self.exploration.reported.restart)

    def probe(self, progress: Progress) -> Progress:
        reported = _with_availability(self.case, self.model, self.restores, progress.reference, progress.first_run,
                                      self.exploration.reported)
        self.exploration = replace(self.exploration, reported=reported)
        return progress

    def teardown(self) -> None:
        try:
            if self.restores is not None:
                self.restores.close()
        finally:
            super().teardown()

    def judge(self, progress: Progress) -> CaseResult:
        exploration, model, step = self.exploration, self.model, self.case.fault.trigger.step
        reported = exploration.reported
        heading = ("crash state with this verdict (the first enumerated, or the smallest Hypothesis shrank to):"
                   if exploration.failing else "worst crash state found:")
        notes = tuple(note for note in (model.order_note, exploration.canary_note) if note)
        verdict = replace(reported.verdict, findings=(exploration.summary(step),) + notes + (heading,) + tuple(
            f"  {line}" for line in reported.description) + reported.verdict.findings)
        (self.work_dir / "exploration.json").write_text(json.dumps(report(exploration), indent=1))
        return CaseResult(case=self.case, verdict=verdict,
                          phases=(progress.reference, _as_of(progress.first_run, reported.point, model),
                                  reported.restart),
                          work_dir=self.work_dir, sampled=exploration.enumerated is None)


def _explore(case: Case, model: CrashModel, restores: CrashRestores, reference, first_run, profile: Profile,
             max_restores: int | None, reduce: bool = True) -> Exploration:
    exploration = _explore_once(case, model, restores, reference, first_run, profile, max_restores,
                                Reduction() if reduce else None)
    # Canaries: warm restores are claimed equal to fresh ones, and a stand-in's restart equal to
    # the state's own, not trusted to be; the warm claim first, as a stand-in may stand for a warm restore
    by_digest: dict[str, list[StateResult]] = {}
    for state in exploration.states:
        by_digest.setdefault(state.digest, []).append(state)
    reported = exploration.reported.digest
    restored = [d for d in by_digest if not by_digest[d][0].stand_in]
    stood = [d for d in by_digest if by_digest[d][0].stand_in]
    chosen = []
    if restores.pool is not None:  # the last restored (what most restores ran before) and every CANARY_EVERY-th
        chosen += [reported] * (reported in restored) + [d for d in restored[::-1][::CANARY_EVERY] if d != reported]
    chosen += [reported] * (reported in stood) + [d for d in stood[::CANARY_EVERY] if d != reported][
        :STAND_IN_CANARIES]
    fresh_restart: dict[str, PhaseResult] = {}

    def disagreement(digest: str) -> tuple[StateResult, str] | None:
        """The first state of ``digest`` whose fresh restore judges otherwise, and how."""
        if digest not in fresh_restart:
            fresh_restart[digest] = restores.restore(*model.disk(by_digest[digest][0].point), digest, fresh=True)
        for state in by_digest[digest]:
            fresh = judge(case, reference, _as_of(first_run, state.point, model), fresh_restart[digest])
            if fresh.kind != state.verdict.kind or fresh.restored_step != state.verdict.restored_step:
                return state, (f"{state.verdict.kind.value} step {state.verdict.restored_step}, fresh: "
                               f"{fresh.kind.value} step {fresh.restored_step}")
        return None

    for digest in chosen:
        found = disagreement(digest)
        if found is None:
            continue
        state, seen = found
        if state.stand_in and (restores.pool is None or disagreement(state.stand_in) is None):
            note = (f"crash state {digest[:12]} answered every look of the restore of {state.stand_in[:12]} "
                    f"alike but restored otherwise (with that restore: {seen}): its restore depends on something "
                    "the reduction does not see, so every state was explored again without it")
            again = _explore_once(case, model, restores, reference, first_run, profile, max_restores, None)
            return replace(again, canary_note=note)
        note = (f"warm ranks and fresh ranks disagreed on crash state {(state.stand_in or digest)[:12]} (warm: "
                f"{seen}): {case.strategy.name} keeps state between restores in one process, so every state was "
                f"restored again by fresh ranks"
                + (f"; the warm restore's error: {state.restart.first_error.summary()[:300]}"
                   if state.restart.first_error else ""))
        restores.pool.close()
        restores.pool = None
        return replace(_explore(case, model, restores, reference, first_run, profile, max_restores, reduce),
                       canary_note=note)
    if reported in fresh_restart:
        exploration = replace(exploration, reported=replace(exploration.reported, restart=fresh_restart[reported]))
    return replace(exploration, canaries=len(chosen))


def _explore_once(case: Case, model: CrashModel, restores: CrashRestores, reference, first_run, profile: Profile,
                  max_restores: int | None, reduction: Reduction | None) -> Exploration:
    budget = max_restores if max_restores is not None else profile.restores
    states_budget = max_restores if max_restores is not None else (
        profile.states if restores.pool is not None else profile.restores)
    restarts: dict[str, PhaseResult] = {}  # disk state -> its restore (a stand-in's, with the reduction)
    stand_ins = reduction.stand_ins if reduction is not None else {}
    judged: dict[tuple, StateResult] = {}  # (disk state, ranks whose save returned) -> result
    order: list[StateResult] = []
    failed = [False]
    expected = case.expect.verdict

    def evaluate(point: CrashPoint, limit: int | None = None, index: TreeIndex | None = None) -> StateResult | None:
        """The state's result (restored once per distinct disk state), or None past the budget;
        shrinking a failure gets half the budget again. ``index``: the state's, when known."""
        disk = None if index is not None else model.disk(point)
        index = index if index is not None else TreeIndex.of(*disk)
        digest = index.digest()
        if digest not in restarts:
            same = reduction.stand_in(index) if reduction is not None else None
            if same is not None:
                restarts[digest], stand_ins[digest] = restarts[same], same
            else:
                cap = limit if limit is not None else (budget + budget // 2 if failed[0] else budget)
                if len(restarts) - len(stand_ins) >= cap:
                    return None
                restarts[digest] = restores.restore(*(disk or model.disk(point)), digest)
                if reduction is not None:
                    reduction.learn(index, digest, restarts[digest])
        # the same disk state is judged apart for each set of ranks whose save had returned
        key = (digest, model.returned(point))
        if key not in judged:
            verdict = judge(case, reference, _as_of(first_run, point, model), restarts[digest])
            judged[key] = StateResult(point=point, digest=digest, verdict=verdict, restart=restarts[digest],
                                      description=tuple(model.describe(point)), stand_in=stand_ins.get(digest))
            order.append(judged[key])
        return replace(judged[key], point=point, description=tuple(model.describe(point)))

    def worse(state: StateResult) -> bool:
        return SEVERITY[state.verdict.kind] > SEVERITY[expected]

    enumeration = distinct_states(model, states_budget if reduction is None else max(
        states_budget, profile.reduced_states if max_restores is None else max_restores))
    whole = states_budget if max_restores is not None else states_budget + states_budget // 2
    if enumeration.complete and reduction is not None:  # its restores count against the budget
        if not enumerate_within(enumeration, evaluate, states_budget, whole):
            enumeration = replace(enumeration, too_large=(
                f"its {len(enumeration.states)} distinct disk states needed more restores than the budget, "
                f"{states_budget} (up to {whole} where the first states' rate says the rest fit)"))
    elif enumeration.complete:
        for distinct in enumeration.states:
            for point in distinct.points:
                evaluate(point, limit=len(enumeration.states), index=distinct.index)
    if enumeration.complete:
        # the worst state, the newest step restored among equals, the first enumerated among those:
        # the same in every run whatever the interleaving of the ranks' writes
        reported = max(order, key=lambda s: (SEVERITY[s.verdict.kind], s.verdict.restored_step or -1,
                                             -order.index(s)))
        return Exploration(states=tuple(order), reported=reported, failing=worse(reported), draws=0, swept=0,
                           restores=len(restarts), enumerated=len(enumeration.states),
                           restored_in=restores.describe(), stood_in=len(stand_ins))
    # Every instant at which an op ends, twice: all volatile state reached the disk (what
    # killing every rank leaves), and none of it did. Cheap: many give the same disk state.
    swept = [state for state in map(evaluate, model.sweep()) if state is not None]
    shrunk, draws = search(model, evaluate, worse, profile.examples, profile.derandomize,
                           lambda: failed.__setitem__(0, True))
    if not order:
        raise HarnessError("the exploration restored no crash state")
    # The worst failure: Hypothesis's shrunk one, or else the earliest of the sweep's.
    failures = ([shrunk] if shrunk else []) + [state for state in swept if worse(state)]
    common = dict(states=tuple(order), draws=draws, swept=len(swept), restores=len(restarts),
                  too_large=enumeration.too_large, restored_in=restores.describe(), stood_in=len(stand_ins))
    if failures:
        return Exploration(reported=max(failures, key=lambda state: SEVERITY[state.verdict.kind]), failing=True,
                           **common)
    return Exploration(reported=max(order, key=lambda state: SEVERITY[state.verdict.kind]), failing=False, **common)


def _with_availability(case: Case, model: CrashModel, restores: CrashRestores, reference: PhaseResult,
                       first_run: PhaseResult, reported: StateResult) -> StateResult:
    """The reported state, judged again where its restore refused and an older checkpoint in it was intact."""
    files, dirs = model.disk(reported.point)
    as_of = _as_of(first_run, reported.point, model)
    intact, _ = availability.probe(case, as_of, reported.restart, reference,
                                   lambda step: restores.restore_step(files, dirs, reported.digest, step))
    return reported if intact is None else replace(
        reported, verdict=judge(case, reference, as_of, reported.restart, intact_step=intact))


def _as_of(first_run: PhaseResult, point: CrashPoint, model: CrashModel) -> PhaseResult:
    """The first run as it stood at the power cut: a rank's step-S save returned only if its cut
    reached the op that says so; an earlier save only if it outlived the cut (not memory alone)."""
    returned = model.returned(point)

    def counted(event: dict, rank: int) -> bool:
        if event["event"] != Event.SAVE_RETURNED:
            return True
        return rank in returned if event["step"] == model.step else model.survives(event["step"])

    records = tuple(replace(record, events=tuple(event for event in record.events if counted(event, record.rank)))
                    for record in first_run.ranks)
    return replace(first_run, ranks=records)
