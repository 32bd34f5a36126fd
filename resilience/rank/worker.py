"""One rank of one phase: `python -m resilience.rank.worker PLAN.json RANK`.

Import-safe: nothing runs at import, so libraries that start helpers with the spawn method can
re-import this module without re-running a rank.
"""
from __future__ import annotations

import os
import resource
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..core.events import ClockPhase, Event, EventLog
from ..core.plan import RESTART, RESTORING_STARTS, PhasePlan, Start
from .startup import begin_rank, exit_now, report_failure, run_reporting


def run(plan: PhasePlan, rank: int, events: EventLog, store: Any = None) -> None:
    """One rank of ``plan``. ``store``: the rendezvous store of a warm rank (`rank.warm_rank`: a
    PrefixStore per restore); by default a FileStore at ``plan.store_path``."""
    import torch
    import torch.distributed as dist

    from ..core import registry
    from ..core.case import Case
    from ..core.device import for_rank, rank_device
    from ..core.preemption import EmergencySave, wanted_by
    from ..faults.base import Clock, RankEnvironment
    from ..strategies.base import StrategyContext
    from .fault_arming import arm_in_rank
    from .step_loop import HarnessObserver, load_reporting_tier, train_with_harness_loop
    from .working_dir import enter_working_dir, observe_paths, watch_foreign_reads

    torch.set_num_threads(1)  # reductions over several threads change the bits of a sum
    use_private_temp_dir()
    if plan.object_store:  # before any S3 client exists: credentials, endpoint, loopback only
        from ..objectstore.client import enter

        enter(plan.object_store, events.emit)
    case = Case.read(Path(plan.case_file))
    enter_working_dir(Path(plan.phase_dir))  # relative paths land in this phase's own directory
    watch_foreign_reads(plan.foreign_roots, events.emit)
    observe_paths(plan.checkpoint_dir if plan.observe_paths else None, events.emit)
    topology = plan.placement()
    checkpoint_dir = topology.storage_dir(Path(plan.checkpoint_dir), rank)  # node-local storage: its node's
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    clock = Clock()

    fault_class = registry.resolve("fault", case.fault.kind)
    at_restart = plan.name == RESTART and fault_class.arms_at_restart
    fault = fault_class(case.fault) if plan.inject or at_restart else None
    arm_in_rank(fault, RankEnvironment(rank=rank, world_size=plan.world_size, checkpoint_dir=checkpoint_dir,
                                       clock=clock, emit=events.emit, case_dir=Path(plan.case_file).parent,
                                       incarnation="restart" if at_restart else "first_run",
                                       checkpoint_url=plan.object_store["url"] if plan.object_store else None),
                staging=Path(os.environ["TMPDIR"]))  # files staged in $TMPDIR are "$TMPDIR/..." to fault globs

    if fault and fault.reaches_helpers():
        from .helper_hook import expose, follow_forks

        clock.publish_to = Path(plan.phase_dir) / f"rank{rank}.clock"
        expose(rank=rank, world_size=plan.world_size, case_file=Path(plan.case_file), checkpoint_dir=checkpoint_dir,
               events_path=plan.events_path(rank), clock_path=clock.publish_to)
        follow_forks(fault, checkpoint_dir)

    owns_group = not dist.is_initialized()  # a launcher's entry (torchrun) may have joined already
    if owns_group:
        store = store if store is not None else dist.FileStore(plan.store_path, plan.world_size)
        dist.init_process_group(for_rank(rank).backend, store=store, rank=rank, world_size=plan.world_size,
                                timeout=timedelta(seconds=plan.collective_timeout_s))
    layered = case.software.package_names + case.restart_software.package_names
    events.emit(Event.JOINED, world_size=plan.world_size, versions=_versions(layered), node=topology.node_of(rank),
                local_rank=topology.local_rank(rank), backend=dist.get_backend(), device=rank_device())
    context = StrategyContext(checkpoint_dir=checkpoint_dir, rank=rank, world_size=plan.world_size,
                              previous_rank=plan.rank_map[rank] if plan.start in RESTORING_STARTS else None,
                              options=dict(case.strategy.options), topology=topology,
                              checkpoint_url=plan.object_store["url"] if plan.object_store else None,
                              node_agent_root=Path(plan.node_agents) if plan.node_agents else None)
    # every phase, the oracle's too: a strategy whose engine trains the model trains it everywhere
    strategy = registry.resolve("strategy", case.strategy.name)(context)
    try:
        if fault:
            fault.attach(strategy)
        workload_cls = registry.resolve("workload", case.workload.model)
        workload = workload_cls(case.workload, rank, plan.world_size, **(
            {"topology": topology} if workload_cls.model_parallel else {}))  # collective: it may build groups
        workload = strategy.prepare(workload)
        observer = HarnessObserver(plan, case.workload.steps, case.workload.checkpoint_every, clock, fault, strategy,
                                   events.emit)
        observer.load_started = time.monotonic()  # the time to restore goes in the report
        if plan.start in RESTORING_STARTS:
            clock.phase = ClockPhase.LOAD
        if plan.start == Start.VERIFY:  # no training: each save restored as a restart would, and reported
            for step in plan.verify_steps:
                strategy.load_step(workload, step)
                events.emit(Event.VERIFIED, step=workload.step, checked=step, fingerprint=workload.fingerprint())
        elif strategy.drives_training:  # the library's own loop restores, trains and saves
            strategy.train(workload, observer)
        else:
            tier = {}
            if plan.start == Start.STRATEGY:
                tier = load_reporting_tier(strategy, workload, checkpoint_dir)
            elif plan.start == Start.STEP:  # the fallback probe: exactly this checkpoint, through the strategy
                strategy.load_step(workload, plan.snapshot_step)
            elif plan.start == Start.SNAPSHOT:
                workload.load_reference_snapshot(observer.snapshot_path(plan.snapshot_step))
            observer.restored(workload, **tier)
            emergency = EmergencySave(events.emit) if plan.save and wanted_by(strategy) else None
            train_with_harness_loop(workload, strategy, observer, emergency)
        workload.close()
        dist.barrier()
    except BaseException as exc:
        report_failure(events, exc)  # first: the failure is the evidence, whatever the exit handlers do
        library_exit(strategy, failed=True)
        raise
    library_exit(strategy, failed=False)  # before the groups go: the library's handlers may use them
    events.emit(Event.DONE, step=workload.step, peak_rss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    if owns_group:
        dist.destroy_process_group()


def library_exit(strategy: Any, failed: bool) -> None:
    """The strategy's library's exit handlers (`CheckpointStrategy.at_exit`), which the rank's
    ``os._exit`` would skip; an error there is printed, never the rank's evidence."""
    try:
        strategy.at_exit(failed)
    except Exception:  # noqa: BLE001
        traceback.print_exc()


def use_private_temp_dir() -> None:
    """Temporary files of this rank and of every process its libraries start (multiprocessing's
    pymp-* directories and sockets, a writer's scratch files) go into a directory the harness
    removes when it destroys the rank (`core.paths.rank_temp_dir`): a rank ends by os._exit or
    SIGKILL, so their own cleanup never runs. Short, for AF_UNIX socket paths (108 bytes)."""
    import tempfile
    from multiprocessing import process

    from ..core.paths import rank_temp_dir

    directory = rank_temp_dir(os.getpid())
    directory.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(directory)
    tempfile.tempdir = str(directory)
    process.current_process()._config.pop("tempdir", None)  # a forked rank may inherit its server's


def _versions(layered: tuple[str, ...] = ()) -> dict[str, str | None]:
    """What this rank runs with: a case or its restart may run under another interpreter or other
    packages (``layered``: the names of those, which a stack may not name)."""
    from importlib import metadata

    import torch

    from ..strategies.stack import distributions

    versions = {"executable": sys.executable, "python": sys.version.split()[0], "torch": torch.__version__}
    for package in dict.fromkeys(distributions() + layered):
        if package == "torch":
            continue  # the imported one: a layered release may shadow the installed metadata
        # a module loaded already (a forked rank's server preloads the stacks) says what runs,
        # whatever metadata comes first on the path
        loaded = getattr(sys.modules.get(package.replace("-", "_")), "__version__", None)
        try:
            versions[package] = str(loaded) if loaded is not None else metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def main(argv: list[str]) -> int:
    plan = PhasePlan.read(Path(argv[1]))
    rank = int(argv[2])
    begin_rank()
    events = EventLog(plan.events_path(rank), rank)
    return run_reporting(events, lambda: run(plan, rank, events))


if __name__ == "__main__":
    exit_now(main(sys.argv))
