"""Black-box mode: qualify a user's own training script, unmodified, under torchrun.

    result = qualify_script(BlackBoxJob(script=Path("train.py"), args=("--ckpt", "{checkpoint_dir}")),
                            fault={"kind": "kill", "rank": 1, "step": 6})

1. reference: the script runs once under torchrun without a fault, into a checkpoint directory of
   its own, and its logged losses are the oracle;
2. the job: the same command with the fault armed in the first incarnation by the startup hook
   (`blackbox_hook`, through ``sitecustomize``): the elastic agent restarts the group after the
   fault and the script resumes from its own checkpoints; a job that ends without a restart (no
   fault fired, or restarts ran out) is launched once more, as an operator would;
3. the verdict from the lines the script logs (`contract`), bitwise (`blackbox_verdict`).

``{checkpoint_dir}`` in the script's arguments is replaced by the run's checkpoint directory; the
fault acts on writes under it. Faults: ``kill`` (its trigger's ``phase`` is ``save``: the window
after the script logs step ``step`` and before its next step, where it saves).
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import janitor
from ..core.elastic_layout import LAUNCH_ENV, Incarnation, incarnations_in
from ..core.events import read_events, tail
from ..core.paths import PROJECT_ROOT
from ..core.records import Verdict
from ..errors import HarnessError, ScenarioError
from ..launch.backend import rank_environment
from ..oracle.blackbox import RankLog, judge_logs
from ..rank.helper_hook import STARTUP_DIR
from .supervisor import AgentLaunch, deadline_after, supervise

PLACEHOLDER = "{checkpoint_dir}"
FAULT_KINDS = ("kill",)
KILL_POINTS = ("start", "open", "write", "fsync", "close")


@dataclass(frozen=True)
class BlackBoxJob:
    """The user's command: ``torchrun --nproc-per-node N SCRIPT ARGS...``."""

    script: Path
    args: tuple[str, ...] = ()
    nproc_per_node: int = 2
    max_restarts: int = 1
    launch_timeout_s: float = 300.0  # one torchrun launch still running after this long: HANG
    python: str = sys.executable


@dataclass(frozen=True)
class BlackBoxResult:
    verdict: Verdict
    reference_losses: dict[int, float]
    first_run: tuple[RankLog, ...]
    restart: tuple[RankLog, ...] | None
    restart_incarnation: Incarnation | None
    work_dir: Path


def fault_spec(document: Mapping[str, Any] | None, source: str = "black-box fault") -> dict | None:
    """The fault as the startup hook reads it; errors name the key, the bad value and what is allowed."""
    if document is None or document.get("kind", "none") == "none":
        return None
    allowed_keys = ("kind", "rank", "step", "phase", "point", "file", "after_bytes")
    for key in document:
        if key not in allowed_keys:
            raise ScenarioError(source, f"fault.{key}", "unknown key", key, allowed_keys)
    if document["kind"] not in FAULT_KINDS:
        raise ScenarioError(source, "fault.kind", "not available in black-box mode", document["kind"],
                            FAULT_KINDS + ("none",))
    for key in ("rank", "step"):
        if not isinstance(document.get(key), int) or document[key] < 0:
            raise ScenarioError(source, f"fault.{key}", "must be an integer >= 0", document.get(key))
    phase, point = document.get("phase", "save"), document.get("point", "start")
    if phase != "save":
        raise ScenarioError(source, "fault.phase", "a black-box rank is placed by its log lines", phase, ("save",))
    if point not in KILL_POINTS:
        raise ScenarioError(source, "fault.point", "unknown point", point, KILL_POINTS)
    if point != "start" and not document.get("file"):
        raise ScenarioError(source, "fault.file", f"point {point} needs a file glob under the checkpoint directory")
    if point == "write" and not isinstance(document.get("after_bytes"), int):
        raise ScenarioError(source, "fault.after_bytes", "point write needs a byte count", document.get("after_bytes"))
    trigger = {"rank": document["rank"], "step": document["step"], "phase": phase, "point": point,
               "file": document.get("file", "*"), "after_bytes": document.get("after_bytes")}
    return {"kind": document["kind"], "trigger": trigger, "params": {}}


def qualify_script(job: BlackBoxJob, fault: Mapping[str, Any] | None, *, work_root: Path | None = None,
                   keep: bool = False) -> BlackBoxResult:
    spec = fault_spec(fault)
    if not Path(job.script).is_file():
        raise ScenarioError(str(job.script), "script", "no such file", str(job.script))
    with janitor.temporary_directory("resilience-blackbox-", work_root, keep) as work_dir:
        return _BlackBoxRun(job, spec, work_dir.resolve()).run()


class _BlackBoxRun:
    def __init__(self, job: BlackBoxJob, fault: dict | None, work_dir: Path):
        self.job, self.fault, self.work_dir = job, fault, work_dir
        (work_dir / "tmp").mkdir()

    def run(self) -> BlackBoxResult:
        reference_dir = self.work_dir / "reference"
        hung = self._launch(reference_dir, fault=None, launch=0)
        reference = self._logs(reference_dir, Incarnation(0, 0))
        if hung or any(log.errors for log in reference) or not reference or not reference[0].losses:
            raise HarnessError(f"the uninterrupted run of {self.job.script} did not complete (or logged no "
                               "'RESILIENCE step=' lines); its output:\n"
                               f"{tail(reference_dir / 'torchrun.launch0.log')}")
        job_dir = self.work_dir / "job"
        for launch in (0, 1):
            hung = self._launch(job_dir, fault=self.fault, launch=launch)
            if hung or self._restart_incarnation(job_dir):
                break
        restart_incarnation = self._restart_incarnation(job_dir)
        first = self._logs(job_dir, Incarnation(0, 0))
        restart = self._logs(job_dir, restart_incarnation) if restart_incarnation else None
        verdict = judge_logs(reference[0].losses, first, restart, hung)
        return BlackBoxResult(verdict=verdict, reference_losses=reference[0].losses, first_run=tuple(first),
                              restart=tuple(restart) if restart is not None else None,
                              restart_incarnation=restart_incarnation, work_dir=self.work_dir)

    def command(self, run_dir: Path) -> list[str]:
        checkpoint_dir = str(run_dir / "checkpoints")
        return [self.job.python, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(self.job.nproc_per_node), "--max-restarts", str(self.job.max_restarts),
                "--monitor-interval", "0.1", str(self.job.script),
                *(arg.replace(PLACEHOLDER, checkpoint_dir) for arg in self.job.args)]

    def _launch(self, run_dir: Path, fault: dict | None, launch: int) -> str | None:
        """One torchrun launch; the name of the part that hung, or None."""
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        env = rank_environment()
        env.update({
            "TMPDIR": str(self.work_dir / "tmp"), LAUNCH_ENV: str(launch),
            "PYTHONPATH": os.pathsep.join([str(STARTUP_DIR), env["PYTHONPATH"]]),
            "RESILIENCE_BLACKBOX": json.dumps({"run_dir": str(run_dir), "checkpoint_dir": str(run_dir / "checkpoints"),
                                               "fault": fault, "project_root": str(PROJECT_ROOT)}),
        })
        group = AgentLaunch(self.command(run_dir), env, run_dir / f"torchrun.launch{launch}.log",
                            lambda: run_dir.glob("launch*/rank*.events.jsonl"), marker=str(self.work_dir))
        end = supervise(group, deadline_after(self.job.launch_timeout_s), lambda: self._check_contract(run_dir))
        return f"launch {launch} of {run_dir.name}" if end.status == "deadline" else None

    def _check_contract(self, run_dir: Path) -> None:
        for path in run_dir.glob("launch*/rank*.events.jsonl"):
            for event in read_events(path):
                if event["event"] == "contract_violation":
                    raise HarnessError(f"{self.job.script}: {event['message']}")

    def _restart_incarnation(self, run_dir: Path) -> Incarnation | None:
        return next((i for i in incarnations_in(run_dir) if not i.is_first), None)

    def _logs(self, run_dir: Path, incarnation: Incarnation) -> list[RankLog]:
        directory = run_dir / incarnation.name
        return [RankLog.from_events(rank, read_events(directory / f"rank{rank}.events.jsonl"))
                for rank in range(self.job.nproc_per_node)]


def describe(result: BlackBoxResult) -> str:
    """Verdict, findings and where the restart came from, for people."""
    verdict = result.verdict
    lines = [(f"verdict: {verdict.kind.value}   restored step: {verdict.restored_step}   "
              f"newest checkpoint logged as saved on every rank: {verdict.complete_step}")]
    lines += [f"  - {finding}" for finding in verdict.findings]
    if result.restart_incarnation:
        lines.append(f"restore in {result.restart_incarnation.name} "
                     f"(restart {result.restart_incarnation.restart} of launch {result.restart_incarnation.launch})")
    fired = [e for log in result.first_run for e in log.fault_events]
    lines += [f"fault: {json.dumps({k: v for k, v in e.items() if k != 'event'})}" for e in fired]
    return "\n".join(lines)

