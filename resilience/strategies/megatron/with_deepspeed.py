"""Megatron-DeepSpeed's checkpoint with ``--deepspeed``: the real DeepSpeed engine's checkpoint of
``global_stepN/`` with Megatron's state in its client state, then Megatron's own tracker. Two
pointers: DeepSpeed's ``latest`` and Megatron's ``latest_checkpointed_iteration.txt``.

Megatron-DeepSpeed is not on the package index; this reproduces the sequence of its
``megatron/training.py`` and ``megatron/checkpointing.py`` (microsoft/Megatron-DeepSpeed at f4157be)
around the real engine:

- setup (``training.py:617-624``, with ``--no-pipeline-parallel``): ``deepspeed.initialize(model,
  optimizer, lr_scheduler, mpu=mpu, config)``: the tensor-parallel model (``tp_mlp``'s column- and
  row-parallel layers) under ZeRO-1, DeepSpeed told the tensor- and data-parallel groups through
  ``mpu`` (``megatron_deepspeed_engine.TensorParallelGroups``), so each tensor-parallel rank has its
  own ``mp_rank_XX_model_states.pt`` and ``zero_pp_rank_D_mp_rank_XX_optim_states.pt``.
- save (``save_checkpoint``, 225-323): Megatron's state (``args``, ``checkpoint_version`` 3.0,
  ``iteration``, RNG) as client state; every rank calls ``model[0].save_checkpoint(save_dir,
  client_state=state_dict)`` (303: no tag, so DeepSpeed's ``global_step<global_steps>``, which is
  the step here, and DeepSpeed's ``latest``); a barrier (310); rank 0 writes the tracker with a
  plain open and write (317-319); a barrier (323).
- load (``load_checkpoint``, 532-604): ``model[0].load_checkpoint(load_dir, load_module_strict=True,
  tag=args.load_tag)`` (548), with no tag: DeepSpeed follows its own ``latest``; Megatron's tracker
  is not read on this path; no checkpoint found: a warning and a start from random (550-555). Then
  ``check_checkpoint_args`` of the saved ``args`` (604): with checkpoint version 3.0 and no
  universal checkpoint, ``tensor_model_parallel_size`` and ``pipeline_model_parallel_size`` must
  equal the job's (80-82), an AssertionError otherwise.

``args`` is a dict of the parallel sizes (Megatron's is a Namespace), so DeepSpeed's files keep
loading with its own loader. Pipeline stages are not offered: Megatron-DeepSpeed runs them through
DeepSpeed's ``PipelineModule`` engine, another code path.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from ...workloads.base import Workload
from ..deepspeed.engine import deepspeed_version, import_deepspeed
from ..deepspeed.zero import Zero1, stamp_version
from .layout import write_tracker
from .with_deepspeed_engine import TensorParallelGroups, ZeroTrainedTensorParallel

CHECKPOINT_VERSION = 3.0
CHECKED_ARGS = ("tensor_model_parallel_size", "pipeline_model_parallel_size")  # checkpointing.py:80-82


class MegatronDeepSpeed(Zero1):
    """Megatron-DeepSpeed with ``--deepspeed`` (ZeRO-1, Megatron's groups as ``mpu``): DeepSpeed's
    checkpoint, then Megatron's tracker."""

    options = ("tag_validation",)
    option_values = {"tag_validation": Zero1.option_values["tag_validation"]}

    @classmethod
    def trainer(cls, options: Mapping[str, Any]) -> str:
        return f"deepspeed-{deepspeed_version()}-zero1-mpu"

    @classmethod
    def trained_by(cls, options: Mapping[str, Any]) -> tuple[type, ...]:
        return (cls, ZeroTrainedTensorParallel)

    def prepare(self, workload: Workload) -> Workload:
        if not workload.model_parallel:
            raise TypeError(f"strategy megatron_deepspeed trains a model-parallel workload such as tp_mlp, "
                            f"not {type(workload).__name__}")
        topology = workload.topology
        if topology.pp != 1:
            raise ValueError(f"strategy megatron_deepspeed: topology.pp is {topology.pp}; allowed: 1 (pipeline "
                             "stages run under DeepSpeed's PipelineModule engine, not reproduced)")
        context = self.context
        import_deepspeed(context.rank, context.world_size)
        import deepspeed

        config = {"train_batch_size": workload.spec.global_batch,
                  "train_micro_batch_size_per_gpu": workload.spec.global_batch // topology.dp,
                  "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 1},
                  "steps_per_print": 1 << 30, "checkpoint": {}}
        if "tag_validation" in context.options:
            config["checkpoint"]["tag_validation"] = context.options["tag_validation"]
        engine, _, _, _ = deepspeed.initialize(model=workload.model, optimizer=workload.optimizer,
                                               lr_scheduler=workload.scheduler, mpu=TensorParallelGroups(workload),
                                               config=config, dist_init_required=False)
        self.workload = ZeroTrainedTensorParallel(workload, engine, 1)
        return self.workload

    def _args(self) -> dict[str, int]:
        topology = self.context.placement
        return {"tensor_model_parallel_size": topology.tp, "pipeline_model_parallel_size": topology.pp,
                "data_parallel_size": topology.dp}

    def save(self, workload: Workload, step: int) -> None:
        client_state = {"args": self._args(), "checkpoint_version": CHECKPOINT_VERSION, "iteration": step,
                        "progress": self.workload.inner.progress_state()}
        # tag_for(step) is global_step<step>: DeepSpeed's own default tag, as engine.global_steps == step
        self.workload.engine.save_checkpoint(str(self.context.checkpoint_dir), tag=self.tag_for(step),
                                             client_state=client_state)
        dist.barrier()
        if self.context.rank == 0:
            write_tracker(self.context.checkpoint_dir, step)
        dist.barrier()

    def rewrite_version_stamp(self, step: int, claim: str) -> list[str]:
        """``ds_version`` in this rank's files of the tag: its ZeRO shard, named by its data- and
        tensor-parallel ranks, and, on data-parallel rank 0, its tensor rank's model states."""
        coords = self.context.placement.coords(self.context.rank)
        mine = [f"zero_pp_rank_{coords.dp}_mp_rank_{coords.tp:02d}_optim_states.pt"]
        if coords.dp == 0:
            mine.append(f"mp_rank_{coords.tp:02d}_model_states.pt")
        root, changed = self.context.checkpoint_dir, []
        for path in (root / self.tag_for(step) / name for name in mine):
            stamp_version(path, self.CLAIMED_DS_VERSIONS[claim])
            changed.append(path.relative_to(root).as_posix())
        return changed

    def load(self, workload: Workload) -> None:
        path, client_state = self.workload.engine.load_checkpoint(str(self.context.checkpoint_dir),
                                                                  load_module_strict=True, tag=None)
        if path is None:
            print(f"WARNING: could not find the metadata file {self.context.checkpoint_dir}; will not load any "
                  "checkpoints and will start from random", file=sys.stderr)
            return
        saved, current = client_state.get("args", {}), self._args()
        for name in CHECKED_ARGS if saved else ():
            if saved[name] != current[name]:  # Megatron's own assert, raised even under python -O
                raise AssertionError(f"{name} value from checkpoint ({saved[name]}) is not equal to the input "
                                     f"argument value ({current[name]}).")
        self.workload.inner.load_progress_state(client_state["progress"])
