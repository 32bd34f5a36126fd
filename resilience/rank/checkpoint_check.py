"""One rank of `resilience verify`: `python -m resilience.rank.checkpoint_check PLAN.json RANK`.

Loads an existing checkpoint with its strategy, as a restarted job would (``previous_rank`` = this
rank), and reports what it restored: the step, a digest of every state entry, and with
``step_check`` the evaluation loss the checkpoint recorded at save time, the same loss recomputed
from the loaded state, and the loss of one training step run after it. Writes nothing under the
checkpoint directory itself; import-safe like the worker.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

from ..core.events import Event


@dataclass(frozen=True)
class CheckPlan:
    checkpoint_dir: str
    world_size: int
    store_path: str
    case_file: str  # the workload and strategy, as the harness hands them to its ranks
    events_dir: str
    step_check: bool
    collective_timeout_s: float

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> CheckPlan:
        return cls(**json.loads(Path(path).read_text()))

    def events_path(self, rank: int) -> Path:
        return Path(self.events_dir) / f"rank{rank}.events.jsonl"


def run(plan: CheckPlan, rank: int, emit) -> None:
    import torch
    import torch.distributed as dist

    from ..core import registry
    from ..core.case import Case
    from ..strategies.base import StrategyContext
    from .worker import use_private_temp_dir

    torch.set_num_threads(1)
    use_private_temp_dir()
    case = Case.read(Path(plan.case_file))
    dist.init_process_group("gloo", store=dist.FileStore(plan.store_path, plan.world_size), rank=rank,
                            world_size=plan.world_size, timeout=timedelta(seconds=plan.collective_timeout_s))
    context = StrategyContext(checkpoint_dir=Path(plan.checkpoint_dir), rank=rank, world_size=plan.world_size,
                              previous_rank=rank, options=dict(case.strategy.options))
    strategy = registry.resolve("strategy", case.strategy.name)(context)
    workload = strategy.prepare(registry.resolve("workload", case.workload.model)(case.workload, rank, plan.world_size))
    strategy.load(workload)
    fingerprint = workload.fingerprint()
    local = set(workload.rank_local_keys)
    emit(Event.RESTORED, step=workload.step, fingerprint=fingerprint,
         replicated=sorted(k for k in fingerprint if k.split(".", 1)[0].split("[", 1)[0] not in local))
    if plan.step_check:
        emit(Event.CHECK_LOSS, recorded=strategy.recorded_check_loss, measured=workload.evaluation_loss())
        emit(Event.TRAINED, step=workload.step + 1, loss=workload.train_step())
    dist.barrier()
    emit(Event.DONE)
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    from ..core.events import EventLog
    from .startup import begin_rank, run_reporting

    plan = CheckPlan.read(Path(argv[1]))
    rank = int(argv[2])
    begin_rank()
    events = EventLog(plan.events_path(rank), rank)
    return run_reporting(events, lambda: run(plan, rank, events.emit))  # a failure: it did not load here


if __name__ == "__main__":
    from .startup import exit_now

    exit_now(main(sys.argv))  # no interpreter finalization: see exit_now
