"""`resilience verify CHECKPOINT_DIR --strategy NAME`: the seed's advice for production, load an
existing checkpoint back with its strategy in real ranks and check it before trusting it.

Checks, in order: every rank loads without raising (its files are present and readable); every
rank restored the same step, and not step 0 (nothing found); the replicated state is identical on
every rank; with ``step_check``, the evaluation loss recorded at save time equals, bitwise, the one
recomputed from the loaded state, and one training step from it gives a finite loss.
"""
from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import janitor
from ..core.events import read_events, tail
from ..core.records import PhaseStatus
from ..errors import ResilienceError
from ..launch.backend import PopenRank, rank_environment, start_all
from ..rank.checkpoint_check import CheckPlan
from ..scenario.loader import load_document, load_file
from .supervisor import LocalRanks, deadline_after, supervise

CHECK_MODULE = "resilience.rank.checkpoint_check"


@dataclass(frozen=True)
class RankView:
    rank: int
    returncode: int | None
    step: int | None
    error: str | None
    stderr_tail: str


@dataclass(frozen=True)
class CheckpointVerdict:
    checkpoint_dir: str
    strategy: str
    world_size: int
    ok: bool
    step: int | None
    findings: tuple[str, ...]  # what failed, or what was checked when all is well
    ranks: tuple[RankView, ...]


def case_for(checkpoint_dir: Path, strategy: str, options: dict[str, Any], world_size: int | None,
             scenario: Path | None, case_id: str | None):
    """The workload and strategy to load with: a scenario's (the job that wrote the checkpoint),
    or the default workload at ``world_size``."""
    if scenario is not None:
        cases = load_file(scenario).cases
        chosen = [c for c in cases if case_id in (None, c.id)]
        if not chosen:
            raise ResilienceError(f"{scenario}: --case {case_id!r} not found; "
                                  f"allowed: {', '.join(c.id for c in cases)}")
        document = dict(chosen[0].document)
        document["strategy"] = {"name": strategy, "options": {**dict(chosen[0].strategy.options), **options}}
        if world_size is not None:
            document["workload"] = {**document["workload"], "world_size": world_size}
    else:
        document = {"name": f"verify {checkpoint_dir}", "description": "resilience verify",
                    "strategy": {"name": strategy, "options": options},
                    "workload": {"model": "mlp", "world_size": world_size or 2, "steps": 1, "checkpoint_every": 1,
                                 "global_batch": math.lcm(16, world_size or 2)},  # the shapes do not depend on it
                    "fault": "none", "expect": "recovers"}
    document.pop("matrix", None)
    return load_document(document, "<resilience verify>").cases[0]


def verify_checkpoint(checkpoint_dir: Path, case, step_check: bool = False, deadline_s: float = 300.0,
                      collective_timeout_s: float = 60.0) -> CheckpointVerdict:
    if not checkpoint_dir.is_dir():
        raise ResilienceError(f"{checkpoint_dir}: not a directory")
    world_size = case.workload.world_size
    with janitor.temporary_directory("resilience-verify-") as work:
        case_file = work / "case.json"
        case.write(case_file)
        plan = CheckPlan(checkpoint_dir=str(checkpoint_dir.resolve()), world_size=world_size,
                         store_path=str(work / "store"), case_file=str(case_file), events_dir=str(work),
                         step_check=step_check, collective_timeout_s=collective_timeout_s)
        plan_path = work / "plan.json"
        plan.write(plan_path)
        codes, timed_out = _run_ranks(plan, plan_path, world_size, deadline_s, work)
        views, events = _views(plan, codes, work)
    findings, step = _judge(views, events, step_check, timed_out, deadline_s)
    return CheckpointVerdict(checkpoint_dir=str(checkpoint_dir), strategy=case.strategy.name, world_size=world_size,
                             ok=not findings[0].startswith("FAIL") if findings else True, step=step,
                             findings=tuple(findings), ranks=tuple(views))


def _run_ranks(plan: CheckPlan, plan_path: Path, world_size: int, deadline_s: float, work: Path):
    """Start one checking rank per rank of the checkpoint and supervise them: the exit statuses,
    and whether they passed the deadline."""

    def start_one(rank: int) -> PopenRank:
        with open(work / f"rank{rank}.out", "wb") as out, open(work / f"rank{rank}.err", "wb") as err:
            popen = subprocess.Popen([sys.executable, "-m", CHECK_MODULE, str(plan_path), str(rank)],
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=rank_environment(),
                                     start_new_session=True)
        return PopenRank(rank, popen)

    ranks = start_all(world_size, start_one)
    end = supervise(LocalRanks(ranks), deadline_after(deadline_s))
    return list(end.codes), end.status == PhaseStatus.DEADLINE


def _views(plan: CheckPlan, codes: list[int | None], work: Path):
    views, events = [], {}
    for rank, code in enumerate(codes):
        found = {event["event"]: event for event in read_events(plan.events_path(rank))}
        events[rank] = found
        error = found.get("error")
        described = (f"{error['type']}: {error['message']}" + "".join(f" (from {c})" for c in error["chain"])
                     if error else None)
        step = found["restored"]["step"] if "restored" in found else None
        views.append(RankView(rank=rank, returncode=code, step=step, error=described,
                              stderr_tail=tail(work / f"rank{rank}.err")))
    return views, events


def _judge(views: list[RankView], events: dict, step_check: bool, timed_out: bool, deadline_s: float):
    failures: list[str] = []
    for view in views:
        if view.error:
            failures.append(f"rank {view.rank} could not load the checkpoint: {view.error}")
        elif view.returncode not in (0, None):
            when = " after its checks were done (at exit)" if "done" in events.get(view.rank, {}) else ""
            failures.append(f"rank {view.rank} died with exit status {view.returncode} without raising{when}")
    if timed_out:
        failures.append(f"the ranks did not finish within {deadline_s:g} s (a hang in load or in a collective)")
    steps = {v.rank: v.step for v in views if v.step is not None}
    step = next(iter(steps.values())) if steps else None
    if steps and len(set(steps.values())) > 1:
        failures.append(f"ranks restored different steps: {steps}")
    elif steps and step == 0 and len(steps) == len(views):
        failures.append("the strategy found no checkpoint to restore (every rank would start from step 0)")
    restored = {rank: e["restored"] for rank, e in events.items() if "restored" in e}
    if 0 in restored:
        keys = restored[0]["replicated"]
        for rank, event in sorted(restored.items()):
            differing = [k for k in keys if event["fingerprint"].get(k) != restored[0]["fingerprint"].get(k)]
            if differing and rank:
                failures.append(f"rank {rank}'s replicated state differs from rank 0's in {len(differing)} entries: "
                                + ", ".join(differing[:5]))
    if step_check and not failures:
        for rank, event in sorted(events.items()):
            check, trained = event.get("check_loss", {}), event.get("trained", {})
            if check.get("recorded") is None:
                failures.append(f"rank {rank}: the checkpoint records no loss at save time (this strategy "
                                f"or workload does not write check_loss), so --step-check cannot compare")
            elif check.get("measured") != check.get("recorded"):
                failures.append(f"rank {rank}: evaluation loss after loading is {check.get('measured')!r}, "
                                f"the checkpoint recorded {check.get('recorded')!r} at save time")
            if not math.isfinite(trained.get("loss", math.nan)):
                failures.append(f"rank {rank}: the training step after loading gave loss {trained.get('loss')!r}")
    if failures:
        return [f"FAIL: {f}" for f in failures], step
    checked = [f"every one of {len(views)} ranks loaded step {step}", "replicated state identical on every rank"]
    if step_check:
        loss = events[0]["check_loss"]["recorded"]
        checked.append(f"evaluation loss equals the one recorded at save time bitwise ({loss!r}); "
                       f"one training step from it: loss {events[0]['trained']['loss']!r}")
    return checked, step
