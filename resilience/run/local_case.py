"""A case whose ranks the harness starts on this machine, step by step (`run.case_sequence`):

- reference: cached per workload (`run.reference_cache`), else run in the case;
- setup: the case's object store and node agents, then the fault's setup;
- first_run: the fault armed, supervised by the fault where it acts from outside the ranks;
- check_saves (``verify_saves``): fresh ranks restore each earlier save of the first run;
- restart: the restart, then each later launch of a timeline, each with its own fault armed;
- oracles: the continuation judging a launch that computes otherwise (`run.oracle_chain`);
- probe: after a refused restore, whether an older checkpoint was intact (`run.availability`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..core import registry
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
from ..errors import HarnessError
from ..faults.environment import CaseEnvironment
from ..launch.backend import backend_for_launch
from ..launch.interpreters import for_software
from ..oracle import saved_check
from ..oracle.evidence import collect_again, collect_phase, stderr_tails
from ..oracle.judge import judge
from ..rank.helper_hook import hook_environment
from ..scenario.loader import parse_case
from . import availability, oracle_chain
from .case_sequence import CaseSequence, Progress
from .node_agents import NodeAgents
from .reference_cache import ReferenceCache, reference_key

PhaseRunner = Callable[..., PhaseResult]  # (plan, case, supervisor=None, backend=None): `Harness.run_phase`


class LocalCase(CaseSequence):
    """One case in ``work_dir``; ``run_phase``: the harness's; ``cache``: references shared across
    cases (None: run in this case); ``object_store``: the store factory (`Harness`)."""

    first_run_ends_agents = False  # True: no launch follows the first run with its node agents

    def __init__(self, case: Case, work_dir: Path, run_phase: PhaseRunner, cache: ReferenceCache | None,
                 object_store=None):
        checkpoint_dir = work_dir / "checkpoints"
        checkpoint_dir.mkdir()
        case_file = work_dir / "case.json"
        case.write(case_file)
        self.plan = Planner(case, work_dir, case_file, checkpoint_dir)
        self.run_phase, self.cache = run_phase, cache
        self.store = None
        if case.object_store:
            from ..objectstore.server import S3Store

            self.store = (object_store or S3Store)(work_dir)
        self.agents = node_agents_for(case, work_dir)
        super().__init__(case, registry.resolve("fault", case.fault.kind)(case.fault), CaseEnvironment(
            case=case, case_dir=work_dir, checkpoint_dir=checkpoint_dir, object_store=self.store,
            node_agents=self.agents))

    def reference(self, progress: Progress) -> Progress:
        """The reference phase, and its snapshots (kept only where a continuation is the oracle)."""
        case, plan, keep_snapshots = self.case, self.plan, self.case.keeps_snapshots

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
            return replace(progress, reference=run_into(plan.work_dir),
                           snapshots=plan.work_dir / "snapshots" if keep_snapshots else None)
        entry = self.cache.entry(reference_key(case, keep_snapshots), run_into)
        stored = PhasePlan.read(entry / REFERENCE / "plan.json")
        stored = replace(stored, phase_dir=str(entry / REFERENCE))
        return replace(progress, reference=collect_phase(stored, PhaseStatus.COMPLETED, [0] * stored.world_size, 0.0),
                       snapshots=entry / "snapshots" if keep_snapshots else None)

    def setup(self, progress: Progress) -> Progress:
        if self.store is not None:
            self.store.start()
            self.plan.object_store = self.store.plan()
        if self.agents is not None:
            self.plan.node_agents = str(self.agents.root)
            arm_agent(self.case, self.agents, self.first_plan())
            self.agents.start()
        return super().setup(progress)

    def first_plan(self) -> PhasePlan:
        return self.plan.make(FIRST_RUN, self.case.workload.world_size, Start.FRESH, save=True, inject=True,
                              topology=self.case.placement)

    def first_run(self, progress: Progress) -> Progress:
        first = self.first_plan()
        result = self.run_phase(first, self.case, supervisor=self.fault if self.fault.supervises else None)
        if self.store is not None:
            self.store.record_contents(FIRST_RUN)  # what the fault left in the bucket, before the restart
        if self.agents is not None:
            self.agents.after_launch(result.status, another=not self.first_run_ends_agents)
            if self.case.fault.params.get("process") == "agent":  # it may act as its agent ends the job's work
                result = collect_again(first, result)
        return replace(progress, first_run=result)

    def check_saves(self, progress: Progress) -> Progress:
        """``verify_saves``: fresh ranks at the first run's topology and software restore each of
        its earlier saves (`oracle.saved_check`)."""
        case = self.case
        steps = saved_check.steps_to_check(progress.first_run) if case.verify_saves else ()
        if not registry.resolve("strategy", case.strategy.name).restores_warm(case.strategy.options):
            steps = steps[-1:]  # a load leaves state for the next: one load
        if not steps:
            return progress
        return replace(progress, checked=(self.run_phase(self.plan.make(
            SAVED_CHECK, case.workload.world_size, Start.VERIFY, topology=case.placement, verify_steps=steps),
            case), steps))

    def restart(self, progress: Progress) -> Progress:
        """The restart, then each later launch of the case's timeline (`Case.incarnations`), each
        from the checkpoints of the launches before it, with its own fault armed; a launch that
        fails other than by its fault ends the job there."""
        case, plan = self.case, self.plan
        launches: list[PhaseResult] = []
        for index, incarnation in enumerate(case.incarnations, 1):
            case_file = None
            if case.timeline:  # its ranks read the case as this launch runs it
                case_file = plan.work_dir / f"case_{index}.json"
                parse_case(case.incarnation_document(index), case.source, case.id).write(case_file)
            fault = registry.resolve("fault", incarnation.fault.kind)(incarnation.fault)
            fault.setup(self.env)  # a launch's own fault (`Fault.in_timelines`: no first-run setup or heal)
            try:
                launch = self.run_phase(plan.make(
                    launch_name(index), incarnation.restart.world_size, Start.STRATEGY, save=True,
                    inject=incarnation.fault.kind != "none", rank_map=incarnation.restart.rank_map,
                    topology=incarnation.restart.placement, case_file=case_file,
                    foreign=tuple(str(plan.work_dir / launch_name(i)) for i in range(1, index))), case,
                    supervisor=fault if fault.supervises else None,
                    backend=backend_for_launch(case, index))
            finally:
                fault.teardown(self.env)
            launches.append(launch)
            if self.agents is not None and index < len(case.incarnations):
                self.agents.after_launch(launch.status)
            if launch.status not in (PhaseStatus.COMPLETED, PhaseStatus.FAULT_KILLED):
                break
        return replace(progress, restart=launches[0], later=tuple(launches[1:]))

    def oracles(self, progress: Progress) -> Progress:
        reference = progress.reference
        judging = oracle_chain.oracles(self.case, self.plan, reference, progress.snapshots,
                                       [progress.first_run, progress.restart, *progress.later], self.run_phase)
        continuation = judging[0] if judging[0] is not reference else None  # the restart's, as the judge takes it
        more = {id(o): o for o in judging[1:] if o is not None and o is not reference and o is not continuation}
        return replace(progress, continuation=continuation, oracles=tuple(judging), more_oracles=tuple(more.values()))

    def probe(self, progress: Progress) -> Progress:
        case = self.case
        intact_step, probes = availability.probe(
            case, progress.first_run, progress.restart, progress.reference, lambda step: self.run_phase(
                self.plan.make(FALLBACK, case.restart.world_size, Start.STEP, snapshot_step=step,
                               rank_map=case.restart.rank_map, phase_dir=self.plan.work_dir / f"{FALLBACK}_step_{step}",
                               topology=case.restart.placement), case,
                backend=backend_for_launch(case, 1)))  # the restart's own software: could it have restored it?
        return replace(progress, intact_step=intact_step, probes=probes)

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            if self.agents is not None:
                self.agents.stop()
            if self.store is not None:
                self.store.stop()  # the bucket, the proxy and the server go with the case

    def judge(self, progress: Progress) -> CaseResult:
        checked = progress.checked
        verdict = judge(self.case, progress.reference, progress.first_run, progress.restart, progress.continuation,
                        fault_findings=progress.findings, fault_notes=progress.notes,
                        intact_step=progress.intact_step, later=progress.later, saved_check=checked,
                        oracles=progress.oracles)
        phases = (progress.reference, progress.first_run, progress.restart,
                  *((progress.continuation,) if progress.continuation is not None else ()),
                  *progress.later, *progress.more_oracles)
        return CaseResult(case=self.case, verdict=verdict, phases=phases + progress.probes + (checked[:1] if checked
                                                                                              else ()),
                          work_dir=self.plan.work_dir)


def node_agents_for(case: Case, work_dir: Path) -> NodeAgents | None:
    """The case's node agents (not yet started), where its strategy keeps one per node."""
    strategy = registry.resolve("strategy", case.strategy.name)
    if strategy.node_agent is None:
        return None
    nodes = sorted({*case.placement.node_ids, *(n for i in case.incarnations for n in i.restart.placement.node_ids)})
    return NodeAgents(strategy.node_agent, work_dir / "node_agents", tuple(nodes), dict(case.strategy.options),
                      for_software(case.software, case.source, "software"))


def arm_agent(case: Case, agents: NodeAgents, first: PhasePlan) -> None:
    """A fault that acts in a node agent (``process: agent``): the first run's agent of the trigger
    rank's node starts armed, following that rank's clock and writing into its event log; one armed
    ``in_every_node_agent``: every node's agent, each following its node's first rank."""
    trigger = case.fault.trigger
    placement = case.placement
    if registry.resolve("fault", case.fault.kind).in_every_node_agent:
        ranks = [block * placement.ranks_per_node for block in range(placement.nodes)]  # each node's first
    elif case.fault.params.get("process") == "agent" and trigger is not None:
        ranks = [trigger.rank]
    else:
        return
    for rank in ranks:
        node = placement.node_of(rank)
        agents.arm(node, hook_environment(
            rank=rank, world_size=first.world_size, case_file=Path(first.case_file),
            checkpoint_dir=placement.storage_dir(Path(first.checkpoint_dir), rank),
            events_path=first.events_path(rank), clock_path=Path(first.phase_dir) / f"rank{rank}.clock",
            process="agent", node_index=placement.node_ids.index(node)))  # the agent's software adds its PYTHONPATH


class Planner:
    """Makes the case's phase plans, all in its work directory and on its checkpoint directory."""

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
