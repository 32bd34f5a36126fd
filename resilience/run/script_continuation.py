"""The oracle of a user's script restarted at another world size (``script.continuation_args``).

Such a restart comes back at step S (found by digest), and its losses after S have no reference:
the uninterrupted runs trained at the first run's size. The continuation gives them one, as the
built-in strategies' continuation does from a trusted snapshot (`resilience.run.torchrun`):

1. launch 0: the first run's command at its own world size, without a fault, each rank ending
   (exit status 0) once its save of step S returned (the startup hook's ``stop_after_save``), so
   the checkpoint directory holds what an uninterrupted run saved at S and nothing later;
2. launch 1: ``continuation_args`` at the restart's world size on that directory, without a
   fault, to the end.

Launch 1's losses after S are what the restart's must equal, rank by rank, bitwise. The pair is
cached beside the references (keyed by them, S, the continuation's arguments and world size).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from ..core.elastic_layout import Incarnation
from ..core.events import Event, read_events, tail
from ..errors import HarnessError, ScenarioError
from ..oracle.blackbox import RankLog, restored_steps
from .blackbox_records import BlackBoxJob

#: launch(run_dir, fault, launch, args, restarts, stop_after) -> the part that hung, or None
Launch = Callable[[Path, dict | None, int, tuple[str, ...], int, int | None], str | None]


def check_continuation_args(job: BlackBoxJob) -> None:
    """A continuation only where the restart runs at another world size (the CLI's flags named)."""
    if job.continuation_args is not None and job.restart_nproc_per_node in (None, job.nproc_per_node):
        raise ScenarioError("black-box job", "--continuation-args", "resumes a restart at another world size, and "
                            "the restart has the first run's", list(job.continuation_args),
                            "--restart-nproc-per-node other than --nproc-per-node")


def continuation_key(reference_key: str, job: BlackBoxJob, step: int) -> str:
    identity = [reference_key, step, job.continuation_args, job.restart_nproc_per_node]
    return "continuation-" + hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]


def run_continuation(directory: Path, job: BlackBoxJob, step: int, world_sizes: tuple[int, int],
                     launch: Launch) -> Path:
    """Both launches into ``directory`` (``world_sizes``: the first run's and the restart's);
    raises where either did not end as it should."""
    hung = launch(directory, None, 0, job.args, 0, step)
    first = directory / Incarnation(0, 0).name
    stopped = [rank for rank in range(world_sizes[0])
               if any(e["event"] == Event.STOPPED_AFTER_SAVE for e in read_events(first / f"rank{rank}.events.jsonl"))]
    if hung or len(stopped) != world_sizes[0]:
        raise HarnessError(f"the continuation of {job.script}: an uninterrupted run did not end after its save of step "
                           f"{step} on every rank (ended so: ranks {stopped}); its output:\n"
                           f"{tail(directory / 'torchrun.launch0.log')}")
    hung = launch(directory, None, 1, job.continuation_args, 0, None)
    resumed = directory / Incarnation(1, 0).name
    failed = [rank for rank in range(world_sizes[1])
              if any(e["event"] == Event.ERROR for e in read_events(resumed / f"rank{rank}.events.jsonl"))]
    if hung or failed:
        raise HarnessError(f"the continuation of {job.script} (script.continuation_args at world size "
                           f"{world_sizes[1]} from an uninterrupted run's save of step {step}) did not "
                           f"complete; its output:\n{tail(directory / 'torchrun.launch1.log')}")
    shutil.rmtree(directory / "checkpoints", ignore_errors=True)  # the events are the oracle
    return directory


def described(step: int, first: int, restart: int) -> str:
    """What the rescaled restart's losses were judged against, for the verdict's notes."""
    return (f"the restart ran at world size {restart}, the uninterrupted run at {first}: its losses are judged "
            f"bitwise against a continuation (an uninterrupted run stopped after its save of step {step}, resumed "
            f"at world size {restart} by script.continuation_args)")


def check_continuation(job: BlackBoxJob, step: int, reference: list[RankLog], continuation: list[RankLog]) -> None:
    """The continuation must come back at ``step`` on every rank and train to the reference's last
    step: otherwise ``continuation_args`` do not resume the job, and it is no oracle."""
    final = max(reference[0].step_losses(), default=0)
    restored = restored_steps(reference, [], continuation).steps
    reached = {log.rank: max(log.step_losses(restored.get(log.rank, 0)), default=0) for log in continuation}
    wrong = {rank: restored.get(rank) for rank in reached if rank < len(reference) and restored.get(rank) != step}
    short = {rank: last for rank, last in reached.items() if last < final}
    if wrong or short:
        raise ScenarioError(str(job.script), "script.continuation_args",
                            f"does not resume the job: from an uninterrupted run's save of step {step} its ranks came "
                            f"back at steps {wrong or 'as saved'} and trained to {short or 'the end'} (the reference "
                            f"reached step {final})", list(job.continuation_args or ()),
                            "the arguments that resume the job from its checkpoint directory")
