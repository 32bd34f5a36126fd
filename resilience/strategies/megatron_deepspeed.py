"""Megatron-DeepSpeed's checkpoint with ``--deepspeed``: the real DeepSpeed engine's checkpoint of
``global_stepN/`` with Megatron's state in its client state, then Megatron's own tracker. Two
pointers: DeepSpeed's ``latest`` and Megatron's ``latest_checkpointed_iteration.txt``.

Megatron-DeepSpeed is not on the package index; this reproduces the sequence of its
``megatron/checkpointing.py`` (microsoft/Megatron-DeepSpeed at f4157be) around the real engine:

- save (``save_checkpoint``, 225-323): Megatron's state (``args``, ``checkpoint_version`` 3.0,
  ``iteration``, RNG) as client state; every rank calls ``model[0].save_checkpoint(save_dir,
  client_state=state_dict)`` (303: no tag, so DeepSpeed's ``global_step<global_steps>``, which is
  the step here, and DeepSpeed's ``latest``); a barrier (310); rank 0 writes the tracker with a
  plain open and write (317-319); a barrier (323).
- load (``load_checkpoint``, 532-556): ``model[0].load_checkpoint(load_dir, load_module_strict=True,
  tag=args.load_tag)``, with no tag: DeepSpeed follows its own ``latest``; Megatron's tracker is not
  read on this path; no checkpoint found: a warning and a start from random.

The workload is DeepSpeed's (``mlp`` under ZeRO-1, as the ``deepspeed.zero1`` strategy trains it);
``args`` is a dict of the parallel sizes, so DeepSpeed's files keep loading with its own loader.
"""
from __future__ import annotations

import sys

import torch.distributed as dist

from ..workloads.base import Workload
from .deepspeed_zero import Zero1
from .megatron_layout import write_tracker

CHECKPOINT_VERSION = 3.0


class MegatronDeepSpeed(Zero1):
    """Megatron-DeepSpeed with ``--deepspeed`` (ZeRO-1): DeepSpeed's checkpoint, then Megatron's tracker."""

    options = ("tag_validation",)
    option_values = {"tag_validation": Zero1.option_values["tag_validation"]}

    def save(self, workload: Workload, step: int) -> None:
        client_state = {"args": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                                 "data_parallel_size": self.context.world_size},
                        "checkpoint_version": CHECKPOINT_VERSION, "iteration": step,
                        "progress": self.workload.inner.progress_state(),
                        "check_loss": self.workload.evaluation_loss()}
        # tag_for(step) is global_step<step>: DeepSpeed's own default tag, as engine.global_steps == step
        self.workload.engine.save_checkpoint(str(self.context.checkpoint_dir), tag=self.tag_for(step),
                                             client_state=client_state)
        dist.barrier()
        if self.context.rank == 0:
            write_tracker(self.context.checkpoint_dir, step)
        dist.barrier()

    def load(self, workload: Workload) -> None:
        path, client_state = self.workload.engine.load_checkpoint(str(self.context.checkpoint_dir),
                                                                  load_module_strict=True, tag=None)
        if path is None:
            print(f"WARNING: could not find the metadata file {self.context.checkpoint_dir}; will not load any "
                  "checkpoints and will start from random", file=sys.stderr)
            return
        self.workload.inner.load_progress_state(client_state["progress"])
        self.recorded_check_loss = client_state.get("check_loss")
