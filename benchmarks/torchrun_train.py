"""The training a 2-rank no-fault case does, launched cold under torchrun (the benchmark's baseline).

    torchrun --standalone --nproc-per-node 2 benchmarks/torchrun_train.py
"""
import os
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist

from resilience.core import registry
from resilience.scenario.loader import load_file
from resilience.strategies.base import StrategyContext
from resilience.workloads.mlp import MLPWorkload


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    case = load_file(os.environ["BENCH_SCENARIO"]).cases[int(os.environ.get("BENCH_CASE", "0"))]
    workload = MLPWorkload(case.workload, dist.get_rank(), dist.get_world_size())
    # the case's strategy may train the workload in its engine (DeepSpeed): then so does this job
    context = StrategyContext(checkpoint_dir=Path(os.environ.get("BENCH_CHECKPOINTS", ".")), rank=dist.get_rank(),
                              world_size=dist.get_world_size(), previous_rank=None,
                              options=dict(case.strategy.options))
    workload = registry.resolve("strategy", case.strategy.name)(context).prepare(workload)
    while workload.step < case.workload.steps:
        workload.train_step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
