"""Runs one case: reference -> first run (fault armed) -> restart -> [continuation], then verify.

Every phase has a deadline; the whole rank group is destroyed at the end of every phase, on the
first rank failure (as torchrun does) and on any exception in the harness itself.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..core import janitor, registry
from ..core.case import Case
from ..core.plan import (
    CONTINUATION,
    FALLBACK,
    FIRST_RUN,
    REFERENCE,
    RESTART,
    RESTORING_STARTS,
    SAVED_CHECK,
    PhasePlan,
    Start,
    launch_name,
)
from ..core.records import CaseResult, PhaseResult, PhaseStatus
from ..core.topology import Topology
from ..errors import HarnessError, StrategyUnavailable
from ..faults.base import CaseEnvironment
from ..launch.backend import (
    BACKENDS,
    DEFAULT_BACKEND,
    ProcessBackend,
    backend_for_case,
    backend_for_launch,
)
from ..launch.interpreters import for_software
from ..oracle import saved_check
from ..oracle.evidence import collect_again, collect_phase, follow_phase_events, stderr_tails
from ..oracle.judge import judge
from ..rank.helper_hook import hook_environment
from ..scenario.loader import parse_case
from . import availability, oracle_chain
from .node_agents import NodeAgents
from .reference_cache import ReferenceCache, reference_key
from .supervisor import LocalRanks, collect, deadline_after, supervise


class Harness:
    """Runs cases. ``cache``: a `ReferenceCache` to share reference runs across cases (None: run
    the reference in every case). ``object_store``: for cases with ``object_store``, a callable
    from the case's work directory to the store it checkpoints into (None: moto's server on
    loopback, `resilience.objectstore.server.S3Store`)."""

    def __init__(self, backend: ProcessBackend | None = None, work_root: Path | None = None, keep: bool = False,
                 cache: ReferenceCache | None = None, explore_profile: str | None = None,
                 explore_restores: int | None = None, explore_warm: bool = True, object_store=None):
        self.object_store = object_store
        self.backend = backend or BACKENDS[DEFAULT_BACKEND]()
        self.work_root, self.keep, self.cache = work_root, keep, cache
        # power_loss cases: the explorer's profile (ci, long) and cap on restores, overriding the scenario's
        self.explore_profile, self.explore_restores = explore_profile, explore_restores
        self.explore_warm = explore_warm  # False: every crash state restored by fresh ranks

    def run(self, case: Case) -> CaseResult:
        missing = registry.resolve("strategy", case.strategy.name).missing_for(case.strategy.options)
        if missing:
            raise StrategyUnavailable(f"strategy {case.strategy.name} needs {missing}")
        if case.object_store:
            from ..objectstore.server import missing as store_missing

            if store_missing():
                raise StrategyUnavailable(f"object_store: {case.object_store} needs {store_missing()}")
        with janitor.temporary_directory("resilience-", self.work_root, self.keep) as work_dir:
            return self._run(case, work_dir)

    def _run(self, case: Case, work_dir: Path) -> CaseResult:
        checkpoint_dir = work_dir / "checkpoints"
        checkpoint_dir.mkdir()
        case_file = work_dir / "case.json"
        case.write(case_file)
        plan = _Planner(case, work_dir, case_file, checkpoint_dir)
        reference, snapshots = self._reference(case, plan)
        if registry.resolve("fault", case.fault.kind).explores:
            from .explore import Explorer

            return Explorer(self.run_phase, self.keep, self.explore_profile, self.explore_restores,
                            backend=(backend_for_case(case) or self.backend) if self.explore_warm else None).run(
                case, work_dir, checkpoint_dir, plan, reference)
        fault = registry.resolve("fault", case.fault.kind)(case.fault)
        store = None
        if case.object_store:
            from ..objectstore.server import S3Store

            store = (self.object_store or S3Store)(work_dir)
        agents = _node_agents(case, work_dir)
        env = CaseEnvironment(case=case, case_dir=work_dir, checkpoint_dir=checkpoint_dir, object_store=store,
                              node_agents=agents)
        phases = [reference]
        try:
            if store is not None:
                store.start()
                plan.object_store = store.plan()
            if agents is not None:
                plan.node_agents = str(agents.root)
            first = plan.make(FIRST_RUN, case.workload.world_size, Start.FRESH, save=True, inject=True,
                              topology=case.placement)
            if agents is not None:
                arm_agent(case, agents, first)
                agents.start()
            fault.setup(env)
            phases.append(self.run_phase(first, case, supervisor=fault if fault.supervises else None))
            if store is not None:
                store.record_contents(FIRST_RUN)  # what the fault left in the bucket, before the restart
            if agents is not None:
                agents.after_launch(phases[1].status)
                if case.fault.params.get("process") == "agent":  # it may act as its agent ends the job's work
                    phases[1] = collect_again(first, phases[1])
            # as the saves were made: before a heal that may damage files, after one that lifts a network rule
            checked = None if fault.leaves_saves_alone else self._check_saves(case, plan, phases[1])
            fault.heal(env)
            if fault.leaves_saves_alone:
                checked = self._check_saves(case, plan, phases[1])
            launches = self._launches(case, plan, env, agents)
            restart, later = launches[0], launches[1:]
            phases.append(restart)
            judging = oracle_chain.oracles(case, plan, reference, snapshots, [phases[1], *launches], self.run_phase)
            continuation = judging[0] if judging[0] is not reference else None  # the restart's, as the judge takes it
            phases += [continuation] if continuation is not None else []
            others = {id(o): o for o in judging[1:] if o is not None and o is not reference and o is not continuation}
            intact_step, probes = availability.probe(case, phases[1], restart, reference, lambda step: self.run_phase(
                plan.make(FALLBACK, case.restart.world_size, Start.STEP, snapshot_step=step,
                          rank_map=case.restart.rank_map, phase_dir=work_dir / f"{FALLBACK}_step_{step}",
                          topology=case.restart.placement), case,
                backend=backend_for_launch(case, 1)))  # the restart's own software: could it have restored it?
            found = fault.findings(env, tuple(phases))
            noted = fault.notes(env, tuple(phases))
            phases += later + list(others.values())
        finally:
            try:
                fault.teardown(env)
            finally:
                if agents is not None:
                    agents.stop()
                if store is not None:
                    store.stop()  # the bucket, the proxy and the server go with the case
        verdict = judge(case, reference, phases[1], restart, continuation, fault_findings=found, fault_notes=noted,
                        intact_step=intact_step, later=tuple(later), saved_check=checked, oracles=tuple(judging))
        return CaseResult(case=case, verdict=verdict, phases=tuple(phases) + probes + (checked[:1] if checked else ()),
                          work_dir=work_dir)

    def _check_saves(self, case: Case, plan: "_Planner", first_run: PhaseResult
                     ) -> tuple[PhaseResult, tuple[int, ...]] | None:
        """``verify_saves``: fresh ranks at the first run's topology and software restore each of
        its earlier saves (`oracle.saved_check`); None where there is none to check."""
        steps = saved_check.steps_to_check(first_run) if case.verify_saves else ()
        strategy = registry.resolve("strategy", case.strategy.name)
        if not strategy.restores_warm(case.strategy.options):  # a load leaves state for the next: one load
            steps = steps[-1:]
        if not steps:
            return None
        return self.run_phase(plan.make(SAVED_CHECK, case.workload.world_size, Start.VERIFY, topology=case.placement,
                                        verify_steps=steps), case), steps

    def _launches(self, case: Case, plan: "_Planner", env: CaseEnvironment,
                  agents: NodeAgents | None) -> list[PhaseResult]:
        """The restart, then each later launch of the case's timeline (`Case.incarnations`), each
        from the checkpoints of the launches before it, with its own fault armed; a launch that
        fails other than by its fault ends the job there."""
        launches: list[PhaseResult] = []
        for index, incarnation in enumerate(case.incarnations, 1):
            case_file = None
            if case.timeline:  # its ranks read the case as this launch runs it
                case_file = plan.work_dir / f"case_{index}.json"
                parse_case(case.incarnation_document(index), case.source, case.id).write(case_file)
            fault = registry.resolve("fault", incarnation.fault.kind)(incarnation.fault)
            fault.setup(env)  # a launch's own fault (`Fault.in_timelines`: no first-run setup or heal)
            try:
                launch = self.run_phase(plan.make(
                    launch_name(index), incarnation.restart.world_size, Start.STRATEGY, save=True,
                    inject=incarnation.fault.kind != "none", rank_map=incarnation.restart.rank_map,
                    topology=incarnation.restart.placement, case_file=case_file,
                    foreign=tuple(str(plan.work_dir / launch_name(i)) for i in range(1, index))), case,
                    supervisor=fault if fault.supervises else None,
                    backend=backend_for_launch(case, index))
            finally:
                fault.teardown(env)
            launches.append(launch)
            if agents is not None and index < len(case.incarnations):
                agents.after_launch(launch.status)
            if launch.status not in (PhaseStatus.COMPLETED, PhaseStatus.FAULT_KILLED):
                break
        return launches

    def _reference(self, case: Case, plan: "_Planner") -> tuple[PhaseResult, Path | None]:
        """The reference phase and its snapshot directory (only kept where a continuation is the oracle)."""
        keep_snapshots = case.keeps_snapshots

        def run_into(directory: Path) -> PhaseResult:
            result = self.run_phase(plan.make(REFERENCE, case.workload.world_size, Start.FRESH, record_states=True,
                                           snapshot_dir=directory / "snapshots" if keep_snapshots else None,
                                           phase_dir=directory / REFERENCE, topology=case.placement), case)
            if result.status != PhaseStatus.COMPLETED:
                raise HarnessError(f"the uninterrupted reference run did not complete ({result.status}): "
                                   f"{result.first_error.summary() if result.first_error else ''}\n"
                                   + stderr_tails(result))
            return result

        if self.cache is None:
            return run_into(plan.work_dir), plan.work_dir / "snapshots" if keep_snapshots else None
        entry = self.cache.entry(reference_key(case, keep_snapshots), run_into)
        stored = PhasePlan.read(entry / REFERENCE / "plan.json")
        stored = replace(stored, phase_dir=str(entry / REFERENCE))
        result = collect_phase(stored, PhaseStatus.COMPLETED, [0] * stored.world_size, 0.0)
        return result, entry / "snapshots" if keep_snapshots else None

    def run_phase(self, plan: PhasePlan, case: Case, supervisor=None,
                  backend: ProcessBackend | None = None) -> PhaseResult:
        """Start the phase's ranks (with ``backend``, else the case's software's, else this harness's),
        supervise them to the end (``supervisor``: a fault that acts from outside the ranks while they
        run) and collect them."""
        phase_dir = Path(plan.phase_dir)
        phase_dir.mkdir(parents=True)
        plan_path = phase_dir / "plan.json"
        plan.write(plan_path)
        expired = deadline_after(case.timeouts.phase_s)
        group = LocalRanks((backend or backend_for_case(case) or self.backend).start(plan, plan_path),
                           registry.resolve("strategy", case.strategy.name).failure_grace_s)
        events = follow_phase_events(plan)
        watch = (lambda: supervisor.supervise(events(), group.ranks)) if supervisor is not None else None
        return collect(plan, supervise(group, expired, watch))


def _node_agents(case: Case, work_dir: Path) -> NodeAgents | None:
    """The case's node agents (not yet started), where its strategy keeps one per node."""
    strategy = registry.resolve("strategy", case.strategy.name)
    if strategy.node_agent is None:
        return None
    nodes = sorted({*case.placement.node_ids, *(n for i in case.incarnations for n in i.restart.placement.node_ids)})
    return NodeAgents(strategy.node_agent, work_dir / "node_agents", tuple(nodes), dict(case.strategy.options),
                      for_software(case.software, case.source, "software"))


def arm_agent(case: Case, agents: NodeAgents, first: PhasePlan) -> None:
    """A fault that acts in a node agent (``process: agent``): the first run's agent of the trigger
    rank's node starts armed, following that rank's clock and writing into its event log."""
    trigger = case.fault.trigger
    if case.fault.params.get("process") != "agent" or trigger is None:
        return
    rank = trigger.rank
    agents.arm(case.placement.node_of(rank), hook_environment(
        rank=rank, world_size=first.world_size, case_file=Path(first.case_file),
        checkpoint_dir=case.placement.storage_dir(Path(first.checkpoint_dir), rank),
        events_path=first.events_path(rank), clock_path=Path(first.phase_dir) / f"rank{rank}.clock",
        process="agent"))  # the agent's own software adds its PYTHONPATH after the hook's


class _Planner:
    def __init__(self, case: Case, work_dir: Path, case_file: Path, checkpoint_dir: Path):
        self.case, self.work_dir, self.case_file, self.checkpoint_dir = case, work_dir, case_file, checkpoint_dir
        self.object_store: dict | None = None  # the case's store, once started (`S3Store.plan`)
        self.node_agents: str | None = None  # the root of the case's node agents, once started

    def placement(self, name: str) -> Topology:
        """The topology a phase runs at: the restart's for the restart and the oracle's continuation."""
        return self.case.restart.placement if name in (RESTART, CONTINUATION) else self.case.placement

    def make(self, name: str, world_size: int, start: Start, *, save: bool = False, inject: bool = False,
             record_states: bool = False, snapshot_dir: Path | None = None, snapshot_step: int | None = None,
             rank_map: tuple[int, ...] | None = None, phase_dir: Path | None = None,
             topology: Topology | None = None, case_file: Path | None = None,
             foreign: tuple[str, ...] = (), verify_steps: tuple[int, ...] = ()) -> PhasePlan:
        """``case_file``: the case as this phase runs it (a timeline's launch); ``foreign``: more
        directories of earlier launches that a restoring phase must not need."""
        phase_dir = phase_dir or self.work_dir / name
        return PhasePlan(
            name=name, case_file=str(case_file or self.case_file), world_size=world_size,
            store_path=str(phase_dir / "store"), checkpoint_dir=str(self.checkpoint_dir),
            phase_dir=str(phase_dir), start=start, save=save,
            inject=inject, record_states=record_states,
            snapshot_dir=str(snapshot_dir) if snapshot_dir else None, snapshot_step=snapshot_step,
            rank_map=rank_map or tuple(range(world_size)),
            collective_timeout_s=self.case.timeouts.collective_s,
            topology=(topology or self.placement(name)).as_dict(), object_store=self.object_store,
            # a phase that restores from the checkpoint must find everything in it
            foreign_roots=(str(self.work_dir / FIRST_RUN), *foreign) if start in RESTORING_STARTS else (),
            verify_steps=verify_steps, node_agents=self.node_agents)

