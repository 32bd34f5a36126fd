"""Black-box mode: qualify a user's own training script, unmodified, under torchrun.

    result = qualify_script(BlackBoxJob(script=Path("train.py"), args=("--ckpt", "{checkpoint_dir}")),
                            fault={"kind": "kill", "rank": 1, "step": 6})

1. reference: the script runs once under torchrun without a fault, into a checkpoint directory of
   its own; what each rank did (losses, state digests, files written: `rank.step_observer`) is
   that rank's oracle;
2. the job: the same command with the fault armed in the first incarnation by the startup hook
   (`rank.blackbox_hook`, through ``sitecustomize``). The elastic agent restarts the group after
   the fault and the script resumes from its own checkpoints; a job that ends without a restart
   (no fault fired, or restarts ran out) is launched once more, as an operator would. With
   ``restart_args``, or a fault that repairs something between the runs (``heal``: a full disk
   freed), the first launch gets no restart and the second launch is the restart;
3. the verdict, each rank against its own reference, bitwise (`oracle.blackbox`).

``{checkpoint_dir}`` in the script's arguments is replaced by the run's checkpoint directory; the
fault acts on writes under it. Faults: those that need nothing from the script
(`scenario.script_case.script_faults`).

The ranks' group is set up by torchrun; with its default, the restarted ranks of an elastic restart
share the agent's TCP store with the killed ones (torch 2.13: ``dynamic_rendezvous.py:1146``, and
``rendezvous.py:189`` adds no per-attempt prefix), and a script that calls a plain
``init_process_group()`` then hangs or fails in gloo's ``connectFullMesh`` on stale addresses:
every launch here sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (a store per round).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ..core import janitor, registry
from ..core.case import FaultSpec
from ..core.directory_cache import DirectoryCache
from ..core.elastic_layout import LAUNCH_ENV, Incarnation, incarnations_in
from ..core.events import Event, EventFollower, read_events, tail
from ..core.paths import PROJECT_ROOT
from ..core.records import PhaseStatus
from ..core.script_case import ScriptCase, ScriptLaunch
from ..errors import HarnessError, NotReproducible, ScenarioError
from ..faults.environment import CaseEnvironment
from ..faults.roles import HarnessSide
from ..launch.backend import rank_environment
from ..launch.nodes import Node
from ..oracle.blackbox import RankLog, judge_logs
from ..oracle.envelope import Envelope, first_difference
from ..rank.helper_hook import STARTUP_DIR
from ..scenario.script_case import check_script_fault
from . import script_continuation as continuation
from .blackbox_records import BlackBoxJob, BlackBoxResult, describe, fault_document
from .intact_probe import probe_older_checkpoint
from .script_explore import explore_job
from .script_launch import check_launcher, start_agents, torchrun_command, waiting_places
from .script_timeline import run_timeline
from .supervisor import deadline_after, supervise

__all__ = ["BlackBoxJob", "BlackBoxResult", "describe", "qualify_script", "run_script_case"]


def qualify_script(job: BlackBoxJob, fault: Mapping[str, Any] | None, *, work_root: Path | None = None,
                   keep: bool = False, cache: DirectoryCache | None = None) -> BlackBoxResult:
    """``fault``: a scenario's fault section (``{"kind": "kill", "rank": 1, "step": 6}``)."""
    spec = check_script_fault(fault, "black-box fault", job.nproc_per_node * job.nnodes, job.nnodes)
    continuation.check_continuation_args(job)
    if not Path(job.script).is_file():
        raise ScenarioError(str(job.script), "script", "no such file", str(job.script))
    with janitor.temporary_directory("resilience-blackbox-", work_root, keep) as work_dir:
        if keep:
            print(f"keeping the run's directory: {work_dir}", flush=True)
        return _BlackBoxRun(job, spec, work_dir.resolve(), cache).run()


def run_script_case(case: ScriptCase, *, work_root: Path | None = None, keep: bool = False,
                    cache: DirectoryCache | None = None) -> BlackBoxResult:
    """A scenario file's case on a user's script; its phase timeout bounds each torchrun launch."""
    spec = {f.name: getattr(case.script, f.name) for f in dataclasses.fields(case.script) if f.name != "path"}
    job = BlackBoxJob(script=Path(case.script.path), launch_timeout_s=case.timeouts.phase_s, **spec)
    with janitor.temporary_directory("resilience-blackbox-", work_root, keep) as work_dir:
        return _BlackBoxRun(job, case.fault, work_dir.resolve(), cache, case.timeline).run()


class _BlackBoxRun:
    def __init__(self, job: BlackBoxJob, fault: FaultSpec, work_dir: Path, cache: DirectoryCache | None = None,
                 timeline: tuple[ScriptLaunch, ...] = ()):
        self.job, self.work_dir, self.cache, self.timeline = job, work_dir, cache, timeline
        self.fault = fault_document(fault)
        self.job_launches_s: list[tuple[int, float]] = []  # the faulted job's torchrun launches, timed
        (work_dir / "tmp").mkdir()
        self.harness_side = registry.resolve("fault", fault.kind)(fault)
        resized = job.restart_nproc_per_node not in (None, job.nproc_per_node)
        self.rescaled = (f"the restart ran at world size {self.ranks(1)}, the uninterrupted run at "
                         f"{self.ranks(0)}: the restored step and state are judged, its losses not bitwise"
                         ) if resized else None

    def run(self) -> BlackBoxResult:
        if self.cache is None:
            references_dir = self._references(self.work_dir / "reference")
        else:
            references_dir = self.cache.entry(self.reference_key(), self._references)
        runs = [self.logs(references_dir / f"run{index}", Incarnation(0, 0)) for index in range(self._runs())]
        reference, envelope = runs[0], None
        parted = first_difference(runs[0], runs[1]) if len(runs) > 1 else None
        if self.job.oracle == "envelope":
            envelope = Envelope.of(runs, self.job.envelope_factor)
        elif parted:
            raise NotReproducible(f"{self.job.script} is not reproducible: {parted}; it cannot be judged bitwise "
                                  "(oracle: envelope judges it within the spread of several runs)")
        job_dir = self.work_dir / "job"
        env = CaseEnvironment(case=None, case_dir=job_dir, checkpoint_dir=job_dir / "checkpoints",
                              script_ranks=self.ranks(0))
        job_dir.mkdir()
        if self.harness_side.explores:  # power_loss: restarts of the script on each crash state
            return explore_job(self, job_dir, reference, envelope)
        if self.timeline:
            return run_timeline(self, job_dir, env, reference, envelope)
        # a second launch is the restart: for its own arguments, or for a repair between the runs
        # and for a lost node, whose agent never comes back: the job is requeued whole, as a scheduler does
        separate = (self.job.restart_args is not None or self.rescaled is not None
                    or type(self.harness_side).heal is not HarnessSide.heal or self.harness_side.acts_in_its_node)
        try:
            self.harness_side.setup(env)
            for launch in (0, 1):
                args = self.job.args if launch == 0 else (self.job.restart_args or self.job.args)
                restarts = 0 if separate and launch == 0 else self.job.max_restarts
                hung = self.launch(job_dir, fault=self.fault, launch=launch, args=args, restarts=restarts)
                last_launch = launch
                if hung or self._restart_incarnation(job_dir):
                    break
                self.harness_side.heal(env)
            restart_incarnation = self._restart_incarnation(job_dir)
            first = self.logs(job_dir, Incarnation(0, 0))
            restart = self.logs(job_dir, restart_incarnation) if restart_incarnation else None
            verdict = judge_logs(reference, first, restart, hung, envelope, rescaled=self.rescaled)
            final = max(reference[0].step_losses(), default=0)
            if self.job.continuation_args is not None and restart and not hung \
                    and verdict.restored_step is not None and verdict.restored_step < final:
                step = verdict.restored_step
                verdict = judge_logs(reference, first, restart, hung, envelope,
                                     rescaled=continuation.described(step, self.ranks(0), self.ranks(1)),
                                     continuation=self._continuation(step, reference))
            if hung:  # where each rank of the launch that hung waits, from its stack dump
                verdict = dataclasses.replace(verdict, findings=verdict.findings + waiting_places(job_dir, last_launch))
            findings = self.harness_side.findings(env, ()) + self.harness_side.notes(env, ())
            if findings:
                verdict = dataclasses.replace(verdict, findings=verdict.findings + tuple(findings))
            if restart is not None and not hung and self.rescaled is None:
                verdict = probe_older_checkpoint(verdict, reference, first, job_dir / "checkpoints",
                                                 self.work_dir / "aside", lambda: self._restart_again(job_dir),
                                                 envelope)
        finally:
            self.harness_side.teardown(env)
        return BlackBoxResult(verdict=verdict, reference=tuple(reference), first_run=tuple(first),
                              restart=tuple(restart) if restart is not None else None,
                              restart_incarnation=restart_incarnation, work_dir=self.work_dir,
                              job_launches_s=tuple(self.job_launches_s))

    def _continuation(self, step: int, reference: list[RankLog]) -> list[RankLog]:
        """The rescaled restart's oracle from ``step`` (`run.script_continuation`), cached with the references."""
        build = functools.partial(continuation.run_continuation, job=self.job, step=step,
                                  world_sizes=(self.ranks(0), self.ranks(1)), launch=self.launch)
        directory = build(self.work_dir / "continuation") if self.cache is None else \
            self.cache.entry(continuation.continuation_key(self.reference_key(), self.job, step), build)
        logs = self.logs(directory, Incarnation(1, 0))
        continuation.check_continuation(self.job, step, reference, logs)
        return logs

    def _restart_again(self, job_dir: Path) -> list[RankLog] | None:
        """One more restart without a fault (launch 2), for the intact-checkpoint probe."""
        if self.launch(job_dir, fault=None, launch=2, args=self.job.restart_args or self.job.args, restarts=0):
            return None
        return self.logs(job_dir, Incarnation(2, 0))  # a launch that started no rank raised (check_launcher)

    def _runs(self) -> int:
        return max(2, self.job.references) if self.job.oracle == "envelope" else max(1, self.job.references)

    def _references(self, directory: Path) -> Path:
        """The uninterrupted runs, into ``directory``/run0, run1, ...; raises where one did not complete."""
        for index in range(self._runs()):
            run_dir = directory / f"run{index}"
            hung = self.launch(run_dir, fault=None, launch=0, args=self.job.args, restarts=0)
            logs = self.logs(run_dir, Incarnation(0, 0))
            if hung or any(log.errors for log in logs) or not logs or not logs[0].step_losses():
                why = (f"hung ({hung}) past its {self.job.launch_timeout_s:g} s deadline; "
                       + "; ".join(waiting_places(run_dir, 0)) if hung
                       else "did not complete (or no optimizer step was seen after a backward)")
                raise HarnessError(f"the uninterrupted run of {self.job.script} {why}; its output:\n"
                                   f"{tail(run_dir / 'torchrun.launch0.log')}")
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the events are the oracle
        return directory

    def reference_key(self) -> str:
        """The script's content, arguments, ranks and environment, torch, and this package's rank code."""
        import torch

        from .reference_cache import rank_sources

        digest = hashlib.sha256(Path(self.job.script).read_bytes())
        for path in rank_sources():
            digest.update(path.read_bytes())
        identity = {"script": str(Path(self.job.script).resolve()), "sources": digest.hexdigest(),
                    "args": self.job.args, "nproc": self.job.nproc_per_node, "nnodes": self.job.nnodes,
                    "env": dict(self.job.env),
                    "torch": torch.__version__, "python": self.job.python, "runs": self._runs()}
        return "script-" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]

    def command(self, run_dir: Path, args: tuple[str, ...], restarts: int, launch: int = 0,
                node: Node | None = None, host: str | None = None) -> list[str]:
        return torchrun_command(self.job, run_dir, args, restarts, self._per_node(launch), node, host)

    def launch(self, run_dir: Path, fault: dict | None, launch: int, args: tuple[str, ...], restarts: int,
               stop_after: int | None = None, side: HarnessSide | None = None) -> str | None:
        """One torchrun launch; the name of the part that hung, or None. ``stop_after``: each rank
        ends once its save of that step returned. ``side``: a timeline's later launch's own fault,
        armed as it starts (by default only the first run arms it)."""
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        env = rank_environment()
        env.update(self.job.env)
        env.update({
            "TMPDIR": str(self.work_dir / "tmp"), LAUNCH_ENV: str(launch),
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # see the module's docstring
            "PYTHONPATH": os.pathsep.join([str(STARTUP_DIR), env["PYTHONPATH"]]),
            "RESILIENCE_BLACKBOX": json.dumps({"run_dir": str(run_dir), "checkpoint_dir": str(run_dir / "checkpoints"),
                                               "fault": fault, "launch_fault": side is not None,
                                               "project_root": str(PROJECT_ROOT),
                                               "stop_after_save": stop_after}),
        })
        def armed() -> list[Path]:  # the armed incarnation's: a restart's ranks must not get its signals
            return sorted(run_dir.glob(f"{Incarnation(launch, 0).name}/rank*.events.jsonl"))

        events = EventFollower(armed)

        def watch() -> None:
            self._check_contract(run_dir)
            supervisor = side or (self.harness_side if launch == 0 else None)
            if fault is not None and supervisor is not None and supervisor.supervises_by_signals:  # preempt, stall
                supervisor.supervise(events(), group.rank_handles(self.ranks(launch), armed()))

        commands: list[list[str]] = []  # node 0's first: the command that reproduces a launcher failure

        def command(node, host) -> list[str]:
            commands.append(self.command(run_dir, args, restarts, launch, node, host))
            return commands[-1]

        started = time.monotonic()
        with ExitStack() as stack:
            group = start_agents(self.job, run_dir, launch, command, env,
                                 lambda: run_dir.glob("launch*/rank*.events.jsonl"), stack)
            end = supervise(group, deadline_after(self.job.launch_timeout_s), watch)
        if run_dir.name == "job":
            self.job_launches_s.append((launch, time.monotonic() - started))
        # a node the fault took down took its agent, and node 0 the rendezvous: the others' rendezvous
        # errors are the fault's doing
        node_lost = self.harness_side.acts_in_its_node and any(
            e["event"] == Event.FAULT_FIRED for path in armed() for e in read_events(path))
        failed = end.status != PhaseStatus.COMPLETED and not node_lost
        check_launcher(self.job, run_dir, launch, commands[0], failed=failed)
        return f"launch {launch} of {run_dir.name}" if end.status == PhaseStatus.DEADLINE else None

    def _check_contract(self, run_dir: Path) -> None:
        for path in run_dir.glob("launch*/rank*.events.jsonl"):
            for event in read_events(path):
                if event["event"] == Event.CONTRACT_VIOLATION:
                    raise HarnessError(f"{self.job.script}: {event['message']}")

    def _restart_incarnation(self, run_dir: Path) -> Incarnation | None:
        return next((i for i in incarnations_in(run_dir) if not i.is_first), None)

    def logs(self, run_dir: Path, incarnation: Incarnation) -> list[RankLog]:
        directory = run_dir / incarnation.name
        return [RankLog.from_events(rank, read_events(directory / f"rank{rank}.events.jsonl"))
                for rank in range(self.ranks(incarnation.launch))]

    def _per_node(self, launch: int) -> int:
        """A node's ranks in a launch: a later launch is a restart, at its own size where one is given."""
        return self.job.restart_nproc_per_node or self.job.nproc_per_node if launch else self.job.nproc_per_node

    def ranks(self, launch: int) -> int:
        """The world size of a launch."""
        return self._per_node(launch) * self.job.nnodes
