"""Megatron-LM's legacy (torch) checkpoint format, as `megatron/training/checkpointing.py` writes it.

Layout under the checkpoint directory::

    latest_checkpointed_iteration.txt              the tracker: the newest iteration, as text
    iter_0000008/mp_rank_00/model_optim_rng.pt     one file per model-parallel rank (pp = 1)
    iter_0000008/mp_rank_01_001/model_optim_rng.pt (pp > 1: tensor rank, then pipeline stage)

Save: only data-parallel rank 0 of each model-parallel group writes, with ``torch.save``, its shard
of the model and of the optimizer state, the scheduler, ``args``, ``checkpoint_version`` 3.0 and the
RNG state (a list: this rank's, or every data-parallel rank's when ``data_parallel_random_init``);
then a barrier, then rank 0 writes the tracker with a plain open and write; then a barrier.

Load: a missing tracker means "start from random" (a warning, as Megatron-LM prints); otherwise the
iteration it names, maxed over ranks, and this rank's ``mp_rank`` file; ``check_checkpoint_args``
refuses another tensor- or pipeline-parallel size; the RNG state taken is entry 0 of the list, or
this rank's data-parallel entry with ``data_parallel_random_init``. Another data-parallel size loads
as is (each data-parallel rank reads its model-parallel group's file).

Where this differs from Megatron-LM: ``args`` is a dict, not an ``argparse.Namespace``, so files
load with ``weights_only=True`` (Megatron-LM unpickles them in full); the data position, which
Megatron-LM keeps as ``args.consumed_train_samples``, travels in ``args`` too.
The paths come from `megatron_layout`, which the fuzzer evaluates without processes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from ...core.device import rank_device
from ...workloads.base import Workload
from ..base import CheckpointStrategy
from .layout import checkpoint_file, tracked_iteration, write_tracker

CHECKPOINT_VERSION = 3.0


def agreed_iteration(checkpoint_dir: Path) -> int | None:
    """Megatron's read_metadata, every rank: the tracker's iteration, the ranks agreeing on the
    maximum (an all-reduce); None (after a barrier) when there is no tracker."""
    iteration = tracked_iteration(checkpoint_dir)
    if iteration is None:
        dist.barrier()
        return None
    newest = torch.tensor([iteration], device=rank_device())  # a CUDA tensor under NCCL
    dist.all_reduce(newest, op=dist.ReduceOp.MAX)
    return int(newest)


class MegatronCheckpoint(CheckpointStrategy):
    """Megatron-LM's ``mp_rank_XX`` checkpoints of a model-parallel workload (``tp_mlp``)."""

    warm_restores = True  # keeps nothing between loads: restored in warm ranks
    options = ("data_parallel_random_init",)
    option_values: ClassVar[dict[str, tuple[bool, ...]]] = {"data_parallel_random_init": (True, False)}

    def prepare(self, workload: Workload) -> Workload:
        if not workload.model_parallel:
            raise TypeError(f"strategy megatron needs a model-parallel workload such as tp_mlp, "
                            f"not {type(workload).__name__}")
        self.topology = workload.topology
        self.coords = self.topology.coords(self.context.rank)
        self.data_group = workload.data_group
        return workload

    @property
    def random_init(self) -> bool:
        return bool(self.context.options.get("data_parallel_random_init", False))

    def _args(self, workload: Workload, state: dict) -> dict[str, Any]:
        return {"tensor_model_parallel_size": self.topology.tp, "pipeline_model_parallel_size": self.topology.pp,
                "num_layers": 3, "hidden_size": workload.hidden, "data_parallel_random_init": self.random_init,
                "consumed_train_samples": state["data"]}

    def save(self, workload: Workload, step: int) -> None:
        state = workload.state_dict()
        rng_state = [workload.own_streams()]  # the noise stream, and with dropout the torch RNG
        if self.random_init and self.topology.dp > 1:
            rng_state = [None] * self.topology.dp
            dist.all_gather_object(rng_state, workload.own_streams(), group=self.data_group)
        extra = {"ema": state["ema"]} if "ema" in state else {}  # a script's own entry beside the model
        if self.coords.dp == 0:
            path = checkpoint_file(self.context.checkpoint_dir, step, self.coords.tp, self.coords.pp,
                                   self.topology.pp)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"args": self._args(workload, state), "checkpoint_version": CHECKPOINT_VERSION,
                        "iteration": step, "model": state["model"], "optimizer": state["optimizer"],
                        "opt_param_scheduler": state["scheduler"], "rng_state": rng_state, **extra}, path)
        dist.barrier()
        if self.context.rank == 0:
            write_tracker(self.context.checkpoint_dir, step)
        dist.barrier()

    def load(self, workload: Workload) -> None:
        iteration = agreed_iteration(self.context.checkpoint_dir)
        if iteration is None:
            return
        path = checkpoint_file(self.context.checkpoint_dir, iteration, self.coords.tp, self.coords.pp,
                               self.topology.pp)
        saved = torch.load(path, weights_only=True)
        self._check_args(saved["args"], workload)
        rng_list = saved["rng_state"]
        rng = rng_list[self.coords.dp] if self.random_init else rng_list[0]
        workload.load_state_dict({"model": saved["model"], "optimizer": saved["optimizer"],
                                  "scheduler": saved["opt_param_scheduler"], "step": saved["iteration"],
                                  "data": saved["args"]["consumed_train_samples"], **rng,
                                  **({"ema": saved["ema"]} if "ema" in saved else {})})
        dist.barrier()

    def _check_args(self, saved: dict, workload: Workload) -> None:
        """Megatron-LM's check_checkpoint_args for a checkpoint_version 3.0 torch checkpoint."""
        current = self._args(workload, workload.state_dict())
        names = ["num_layers", "hidden_size", "tensor_model_parallel_size", "pipeline_model_parallel_size"]
        if self.random_init:
            names.append("data_parallel_random_init")
        for name in names:
            assert saved.get(name) == current[name], (
                f"{name} value from checkpoint ({saved.get(name)}) is not equal to the input argument value "
                f"({current[name]}).")
