"""A script case's timeline (black-box mode): the user's job launched once per entry, each launch
from the checkpoints of those before it, with its own arguments and its own fault armed as it
starts (`core.script_case.ScriptLaunch`), each at the first run's size and with no restart of the
agent's own (the next launch is the restart, as an operator's relaunch is). A launch that fails
other than by its fault, or hangs, ends the job there. The verdict: `oracle.blackbox_timeline`.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..core import registry
from ..core.elastic_layout import Incarnation
from ..faults.environment import CaseEnvironment
from ..oracle.blackbox import RankLog
from ..oracle.blackbox_timeline import judge_timeline
from ..oracle.envelope import Envelope
from .blackbox_records import BlackBoxResult, fault_document


def run_timeline(run, job_dir: Path, env: CaseEnvironment, reference: list[RankLog],
                 envelope: Envelope | None) -> BlackBoxResult:
    """``run``: the black-box run (`run.blackbox`) whose ``launch`` and ``logs`` start a launch and
    read its ranks' logs; its first run's fault is ``run.fault`` and its harness side."""
    plan = [(run.harness_side, run.fault, run.job.args)] + [
        (registry.resolve("fault", entry.fault.kind)(entry.fault), fault_document(entry.fault), entry.args)
        for entry in run.timeline]
    launches: list[list[RankLog]] = []
    hung, findings = None, []
    for index, (side, fault, args) in enumerate(plan):
        side.setup(env)
        try:
            hung = run.launch(job_dir, fault=fault, launch=index, args=args, restarts=0,
                              side=side if index else None)
            findings += [f"launch {index + 1}: {line}" for line in side.findings(env, ()) + side.notes(env, ())]
        finally:
            side.teardown(env)
        logs = run.logs(job_dir, Incarnation(index, 0))
        launches.append(logs)
        own_fault = any(log.fault_events for log in logs)
        if hung or (any(log.errors for log in logs) and not own_fault):
            break
    verdict = judge_timeline(reference, launches, hung, envelope, complete=len(launches) == len(plan))
    verdict = replace(verdict, findings=verdict.findings + tuple(findings))
    return BlackBoxResult(verdict=verdict, reference=tuple(reference), first_run=tuple(launches[0]),
                          restart=tuple(launches[1]) if len(launches) > 1 else None,
                          restart_incarnation=Incarnation(1, 0) if len(launches) > 1 else None,
                          work_dir=run.work_dir, later=tuple(tuple(logs) for logs in launches[2:]))
