"""Runs a case under torchrun: the elastic agent starts the ranks and restarts them after a fault.

    result = run_case_under_torchrun(case, nnodes=1, nproc_per_node=2, max_restarts=1)

The driver writes the case and its phase plans into a case directory, launches
``torchrun ... -m resilience.rank.elastic_entry CASE_DIR`` (see that module for what each incarnation
does), enforces the phase deadline, and judges the files the ranks wrote with the oracle the local
harness uses (`oracle.judge`), so the result is the same `CaseResult`.

Restarts: a rank that dies or raises makes the agent restart the whole group (on several nodes
every agent, and a spare node's joins), which restores and trains to the end; with ``min_nodes``
the survivors may go on at a smaller size, judged against the oracle's continuation there. A first run that ends
without a failure (no fault), or a job whose restarts ran out, is resumed by a second launch of the
same command, as an operator or a scheduler would. Only the first restore is judged.

Deadlines: a phase still running ``timeouts.phase`` seconds after its ranks began it (or after the
launch plus ``startup_s`` for torchrun's start and rendezvous) is a HANG: every live rank dumps its
stack (SIGUSR1, faulthandler), then torchrun's process group and every rank's are SIGKILLed.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..core import janitor, registry
from ..core.case import Case
from ..core.elastic_layout import LAUNCH_ENV, Incarnation, TorchrunLayout
from ..core.events import Event, EventFollower, read_events, tail
from ..core.plan import FIRST_RUN, REFERENCE, RESTART
from ..core.records import CaseResult, PhaseResult, PhaseStatus
from ..core.topology import NODE_LOCAL
from ..errors import HarnessError, StrategyUnavailable, TorchrunIncompatible
from ..faults.base import CaseEnvironment, Fault
from ..launch.backend import rank_environment
from ..launch.torchrun_command import STARTUP_S, TorchrunOptions, incompatibility, torchrun_command
from ..oracle.evidence import collect_phase, launcher_error, stderr_tails, where_waiting
from .agent_launch import AgentLaunch
from .case_sequence import CaseSequence, Progress, Step
from .elastic_grow import is_grown, judge_job, superseded
from .local_probe import continue_in_local_ranks, probe_in_local_ranks
from .supervisor import supervise

__all__ = ["STARTUP_S", "TorchrunOptions", "incompatibility", "run_case_under_torchrun", "torchrun_command"]



def run_case_under_torchrun(case: Case, nnodes: int = 1, nproc_per_node: int | None = None,
                            max_restarts: int = 1, *, rdzv_endpoint: str | None = None,
                            rdzv_id: str | None = None, case_dir: Path | None = None,
                            work_root: Path | None = None, keep: bool = False,
                            python: str | None = None, startup_s: float = STARTUP_S, **more) -> CaseResult:
    """Run ``case`` under torchrun and judge it; the same `CaseResult` the local harness returns.

    ``case_dir``: the case directory (on several nodes: the same shared path on each, and each
    node runs this same call); it is kept. Without it, a fresh directory under ``work_root`` (or
    TMPDIR) is used and removed afterwards unless ``keep``. Raises `TorchrunIncompatible` for a
    case torchrun cannot express, `StrategyUnavailable` when the strategy's library is missing,
    `HarnessError` when the job never produced a reference. ``more``: the other `TorchrunOptions`
    (``rdzv_conf``, ``local_addr``, ``min_nodes``, ``join``)."""
    options = TorchrunOptions(nnodes=nnodes, nproc_per_node=nproc_per_node, max_restarts=max_restarts,
                              rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, python=python or sys.executable,
                              startup_s=startup_s, **more)
    reason = incompatibility(case, options)
    if reason:
        raise TorchrunIncompatible(reason)
    missing = registry.resolve("strategy", case.strategy.name).missing()
    if missing:
        raise StrategyUnavailable(f"strategy {case.strategy.name} needs {missing}")
    if case_dir is not None:
        return _Driver(case, TorchrunLayout(Path(case_dir).resolve()), options).run()
    with janitor.temporary_directory("resilience-torchrun-", work_root, keep) as owned:
        return _Driver(case, TorchrunLayout(owned.resolve()), options).run()


@dataclass(frozen=True)
class _Hang:
    incarnation: Incarnation
    phase: str
    stopped: frozenset[int]


class _Driver(CaseSequence):
    """The case's steps under torchrun (`run.case_sequence`): the job's launches run the reference,
    the first run and the restarts in one go; the steps after read what its ranks wrote."""

    skips = frozenset({
        Step.REFERENCE,  # the job's first incarnation runs it: read with the first run
        Step.CHECK_SAVES,  # the agent restarts at once: there is no moment between the runs for it
        Step.HEAL,  # the same: the restart follows the failure inside torchrun
    })

    def __init__(self, case: Case, layout: TorchrunLayout, options: TorchrunOptions):
        self.layout, self.options = layout, options
        self._launches: list[int] = []
        self._hung: _Hang | None = None
        fault = registry.resolve("fault", case.fault.kind)(case.fault)
        super().__init__(case, fault, CaseEnvironment(case=case, case_dir=layout.case_dir,
                                                      checkpoint_dir=layout.checkpoint_dir))

    def run(self) -> CaseResult:
        self._prepare()  # before the fault's setup: a directory of an earlier run is refused untouched
        return super().run()

    def first_run(self, progress: Progress) -> Progress:
        """The job's launches (a second one where the first ended without a restore), then the
        reference and the first run as its ranks recorded them."""
        for launch in (0, 1):
            self._launches.append(launch)
            self._hung = self._launch(launch, self.fault if self.fault.node_scoped else None)
            if self._hung or not self._needs_resume():
                break
        first = Incarnation(0, 0)
        reference = self._phase(first, REFERENCE, self._hung)
        if reference.status != PhaseStatus.COMPLETED:
            detail = reference.first_error.summary() if reference.first_error else reference.status
            raise HarnessError(f"the uninterrupted reference run did not complete under torchrun ({detail})\n"
                               + stderr_tails(reference)
                               + f"\n--- torchrun ---\n{tail(self.layout.torchrun_log(0, self.options.local_addr))}")
        return replace(progress, reference=reference, first_run=self._phase(first, FIRST_RUN, self._hung))

    def restart(self, progress: Progress) -> Progress:
        """The first restore (judged), then the later attempts; before it, any group superseded by a grow."""
        judged = self._first_restart()
        later = sorted((i for i in self.layout.incarnations() if not i.is_first), key=lambda i: i != judged)
        if later:
            restarts = [self._phase(i, RESTART, self._hung) for i in later]
            return replace(progress, restart=restarts[0], later=tuple(restarts[1:]))
        # the first run hung, or torchrun gave up (its store's host lost): nothing restarted
        log = self.layout.torchrun_log(max(self._launches, default=0), self.options.local_addr)
        return replace(progress, restart=PhaseResult(
            name=RESTART, world_size=self.case.restart.world_size, status=PhaseStatus.NOT_STARTED, ranks=(),
            fault_events=(), elapsed_s=0.0, first_error=None if self._hung else
            launcher_error(log.read_text(errors="replace") if log.exists() else "", RESTART)))

    def oracles(self, progress: Progress) -> Progress:
        """The oracle's continuation on the restart's topology (an elastic restart at another size)."""
        restored = progress.restart.restored()
        if not self.case.topology_changes or 0 not in restored or is_grown(self.case, progress.restart):
            return progress
        step = restored[0]["step"]
        if not (self.layout.snapshots_dir / f"step_{step}").is_dir():
            return progress
        return replace(progress, continuation=continue_in_local_ranks(
            self.case, self.layout.case_file, self.layout.checkpoint_dir, self._driver_dir(), self.layout.snapshots_dir,
            step))

    def probe(self, progress: Progress) -> Progress:
        if not self._sees_every_file():
            return progress
        intact, probes = probe_in_local_ranks(self.case, self.layout.case_file, self.layout.checkpoint_dir,
                                              self._driver_dir(), list(progress.phases()))
        return replace(progress, intact_step=intact, probes=probes)

    def judge(self, progress: Progress) -> CaseResult:
        phases = [progress.reference, progress.first_run, progress.restart, *progress.later]
        continuation = [progress.continuation] if progress.continuation is not None else []
        verdict = judge_job(self.case, phases, continuation, progress.findings, progress.intact_step, progress.notes)
        return CaseResult(case=self.case, verdict=verdict, phases=tuple(phases + continuation) + progress.probes,
                          work_dir=self.layout.case_dir)

    def _driver_dir(self) -> Path:
        directory = self.layout.driver_dir(self.options.local_addr)  # several drivers share the case directory
        directory.mkdir(exist_ok=True)
        return directory

    def _sees_every_file(self) -> bool:
        """Whether this driver's local ranks can read every checkpoint the job wrote: one node, or
        storage every node shares (node-local disks are the other nodes' own)."""
        return self.options.nnodes == 1 or NODE_LOCAL not in (self.case.placement.storage,
                                                              self.case.restart.placement.storage)

    # -- before the launch ------------------------------------------------------------------------
    def _prepare(self) -> None:
        layout, case = self.layout, self.case
        if self.options.join and (layout.incarnations() or self.options.standby):  # joining the running job
            return  # (a spare standing by is handed over only once it runs): the rest is done
        if layout.incarnations():  # its files would be judged as this run's (on several nodes, no rank
            # starts before every node's agent joined, so a node that prepares late still sees none)
            raise HarnessError(f"case directory {layout.case_dir} holds an earlier run's ranks "
                               f"({layout.incarnations()[0].name}); allowed: a new or empty directory")
        layout.write_plans(case, may_grow=bool(self.options.min_nodes))  # a spare may grow a shrunk job back

    def _environment(self, launch: int) -> dict[str, str]:
        env = rank_environment()
        if self.options.nnodes > 1:  # loopback only on one node; several use the cluster's network
            env.pop("GLOO_SOCKET_IFNAME")
            if "GLOO_SOCKET_IFNAME" in os.environ:  # the node's own interface (nodes in namespaces: veth0)
                env["GLOO_SOCKET_IFNAME"] = os.environ["GLOO_SOCKET_IFNAME"]
        env["TMPDIR"] = str(self.layout.temp_dir)  # torchrun's torchelastic_* directories go with the case
        env[LAUNCH_ENV] = str(launch)
        return env

    # -- while it runs ----------------------------------------------------------------------------
    def _launch(self, launch: int, supervisor: Fault | None = None) -> _Hang | None:
        """``supervisor``: a node-wide fault this node's driver drives for its own ranks (`stall`, `partition`)."""
        group = AgentLaunch(torchrun_command(self.case, self.options, self.layout.case_dir, launch),
                            self._environment(launch), self.layout.torchrun_log(launch, self.options.local_addr),
                            lambda: self._event_files(launch), marker=str(self.layout.case_dir))
        started, found = time.time(), []

        def expired() -> bool:
            found[:] = [self._hang(launch, started)]
            return found[0] is not None

        first_run = self.layout.phase_dir(Incarnation(0, 0), FIRST_RUN)
        events = EventFollower(lambda: sorted(first_run.glob("rank*.events.jsonl")))
        watch = ((lambda: supervisor.supervise(events(), group.rank_handles(self.case.workload.world_size)))
                 if supervisor is not None else None)
        end = supervise(group, expired, watch)
        return _Hang(found[0].incarnation, found[0].phase, end.stopped) if end.status == PhaseStatus.DEADLINE else None

    def _event_files(self, launch: int) -> list[Path]:
        """The event files of this launch's ranks, every incarnation and phase."""
        return [self.layout.phase_dir(incarnation, phase) / f"rank{rank}.events.jsonl"
                for incarnation in self.layout.incarnations() if incarnation.launch == launch
                for phase in (REFERENCE, FIRST_RUN, RESTART)
                for rank in range(self.case.workload.world_size)]

    def _hang(self, launch: int, launch_started: float) -> _Hang | None:
        """A phase of this launch past its deadline, counted from the latest phase any rank began
        (torchrun's start and rendezvous get ``startup_s`` on top)."""
        marks = [(event["time"], incarnation, phase) for incarnation in self.layout.incarnations()
                 if incarnation.launch == launch for phase in (REFERENCE, FIRST_RUN, RESTART)
                 for event in self._events(incarnation, phase, Event.PHASE_BEGIN)]
        now = time.time()
        began = max([launch_started + self.options.startup_s] + [mark[0] for mark in marks])
        if now <= began + self.case.timeouts.phase_s:
            return None
        if not marks:
            raise HarnessError(f"torchrun started no rank within {now - launch_started:.0f} s; its output:\n"
                               f"{tail(self.layout.torchrun_log(launch, self.options.local_addr))}")
        _, incarnation, phase = max(marks, key=lambda mark: mark[0])
        return _Hang(incarnation, phase, frozenset())

    def _needs_resume(self) -> bool:
        """Whether the job ended without any restore (no fault, or its restarts ran out first)."""
        incarnations = self.layout.incarnations()
        if Incarnation(0, 0) not in incarnations:
            raise HarnessError("torchrun started no rank; its output:\n"
                               + tail(self.layout.torchrun_log(0, self.options.local_addr)))
        return all(incarnation.is_first for incarnation in incarnations)

    # -- after it ended ---------------------------------------------------------------------------
    def _phase(self, incarnation: Incarnation, name: str, hang: _Hang | None) -> PhaseResult:
        plan = self.layout.plan(incarnation, name)
        codes = [self._exit_status(incarnation, name, rank) for rank in range(plan.world_size)]
        hung = hang is not None and (hang.incarnation, hang.phase) == (incarnation, name)
        if hung:
            status = PhaseStatus.DEADLINE
        elif all(code == 0 for code in codes):
            status = PhaseStatus.COMPLETED
        else:
            status = PhaseStatus.FAILED
        times = [e["time"] for rank in range(plan.world_size) for e in read_events(plan.events_path(rank))]
        result = collect_phase(plan, status, codes, max(times) - min(times) if times else 0.0)
        if not incarnation.is_first and incarnation != self._first_restart():  # a later, unjudged attempt
            result = replace(result, name=f"{name} ({incarnation.name})")
        if hung:
            result = replace(result, hang_summary=tuple(
                where_waiting(record, record.rank in hang.stopped) for record in result.ranks
                if record.returncode is None))
        return result

    def _first_restart(self) -> Incarnation | None:
        return next((i for i in self.layout.incarnations() if not i.is_first and not superseded(self.layout, i)),
                    None)

    def _exit_status(self, incarnation: Incarnation, phase: str, rank: int) -> int | None:
        """0 once the rank finished the phase; otherwise how its process ended (None: torn down by
        the agent or the driver, or never started)."""
        plan_events = read_events(self.layout.phase_dir(incarnation, phase) / f"rank{rank}.events.jsonl")
        if any(e["event"] == Event.DONE for e in plan_events):
            return 0
        outcome = self.layout.read_outcome(incarnation, rank)
        if outcome is None or outcome["torn_down_by"]:
            return None
        return outcome["returncode"]

    def _events(self, incarnation: Incarnation, phase: str, kind: str) -> list[dict]:
        directory = self.layout.phase_dir(incarnation, phase)
        found = []
        for path in directory.glob("rank*.events.jsonl") if directory.is_dir() else ():
            found += [e for e in read_events(path) if e["event"] == kind]
        return found
