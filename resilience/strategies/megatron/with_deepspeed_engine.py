"""The DeepSpeed engine training the model-parallel workload (``tp_mlp``) as Megatron-DeepSpeed runs
it: Megatron's tensor-parallel layers inside the engine, the engine told the parallel groups through
its ``mpu`` argument (Megatron-DeepSpeed's ``megatron/training.py`` passes ``mpu=mpu``, megatron's
``parallel_state``), so DeepSpeed reduces gradients and partitions ZeRO state over the data-parallel
group only and names its files per tensor-parallel rank (``mp_rank_XX_model_states.pt``,
``zero_pp_rank_D_mp_rank_XX_optim_states.pt``). What decides the numbers of such a run lives here:
the reference cache is keyed on this module's source.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ...workloads.parallel_mlp_full import load_snapshot, save_snapshot
from ..deepspeed.engine import ZeroTrainedWorkload


class TensorParallelGroups:
    """The ``mpu`` DeepSpeed reads (the names of megatron's ``parallel_state`` it calls in
    ``deepspeed/utils/groups.py`` and ``runtime/engine.py``), over the workload's own groups:
    model parallel = tensor parallel (no pipeline under this engine), data parallel = the rest."""

    def __init__(self, workload: Any):
        self.workload = workload
        self.data_ranks = next(g for g in workload.topology.data_groups() if workload.rank in g)

    def get_model_parallel_rank(self) -> int:
        return self.workload.coords.tp

    def get_model_parallel_world_size(self) -> int:
        return self.workload.topology.tp

    def get_model_parallel_group(self):
        return self.workload.tensor_group

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_tensor_model_parallel_src_rank(self) -> int:
        return self.workload.rank - self.workload.coords.tp

    def get_pipeline_model_parallel_world_size(self) -> int:
        return 1

    def get_pipeline_model_parallel_rank(self) -> int:
        return 0

    def get_data_parallel_rank(self) -> int:
        return self.workload.coords.dp

    def get_data_parallel_world_size(self) -> int:
        return self.workload.topology.dp

    def get_data_parallel_group(self):
        return self.workload.data_group

    def get_data_parallel_group_ranks(self) -> list[int]:
        return list(self.data_ranks)


class ZeroTrainedTensorParallel(ZeroTrainedWorkload):
    """`tp_mlp` whose steps a DeepSpeed engine (given the groups as ``mpu``) computes.

    DeepSpeed sees this rank's tensor-parallel shard as the whole model, so its ``safe_get_full_*``
    give the shard (whole over the data-parallel partitions); ``fingerprint`` and the reference
    snapshots gather the shards over the tensor-parallel group into the full state, free of the
    topology, and the trusted restore slices it for this rank's place and sets it through
    ``safe_set_full_*`` (never through a DeepSpeed checkpoint). Collective like the workload's own.
    """

    model_parallel = True

    def train_step(self) -> float:
        inputs, targets = self.inner.next_local_batch()
        loss = ((self.engine(inputs) - targets) ** 2).mean()  # DeepSpeed averages over data parallel
        self.engine.backward(loss)
        self.engine.step()
        self.inner.count_step()
        total = loss.detach().clone().reshape(1)
        dist.all_reduce(total, group=self.inner.data_group)  # tensor-parallel peers hold the same loss
        return float(total[0]) / self.inner.topology.dp

    def evaluation_loss(self) -> float | None:
        return None  # the full model exists on no rank; resilience verify --step-check has no figure

    def full_state(self) -> dict[str, Any]:
        shard = self.state_dict()
        held = {name: {"param": value,
                       **({"step": torch.tensor(shard["optimizer"]["step"]),
                           **{key: shard["optimizer"][key][name] for key in ("exp_avg", "exp_avg_sq")}}
                          if shard["optimizer"] else {})}
                for name, value in shard["model"].items()}
        return self.inner.full_state(held)

    def fingerprint(self) -> dict[str, str]:
        from ...workloads.base import flatten_state, tensor_digest

        state = {**self.full_state(), **self.inner.own_streams()}
        return {key: tensor_digest(value) for key, value in flatten_state(state)}

    def save_reference_snapshot(self, directory: Path) -> None:
        save_snapshot(self.inner, self.full_state(), directory)

    def load_reference_snapshot(self, directory: Path) -> None:
        full, progress = load_snapshot(directory, self.inner)
        moments = full["optimizer"]["state"]
        names = [name for name, _ in self.engine.module.named_parameters()]
        state = {"model": {n: self.inner.shard(n, full["model"][n]) for n in names}, "scheduler": full["scheduler"],
                 "optimizer": {}, **progress}
        if moments[names[0]]:
            state["optimizer"] = {key: {n: self.inner.shard(n, moments[n][key]) for n in names}
                                  for key in ("exp_avg", "exp_avg_sq")}
            state["optimizer"]["step"] = float(moments[names[0]]["step"])
        self.load_state_dict(state)
