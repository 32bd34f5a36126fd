"""The DeepSpeed engine as it trains a workload: the engine's start (environment, config) and
`ZeroTrainedWorkload`, the workload whose steps the engine computes. What decides the numbers of a
DeepSpeed-trained run lives here: the reference cache is keyed on this module's source.

DeepSpeed is imported only inside rank processes, so the harness works without it.
"""
from __future__ import annotations

import os
from importlib import metadata
from typing import Any

import torch
import torch.distributed as dist

from ...core.case import WorkloadSpec
from ...workloads.base import TrainableWorkload, Workload

ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")


def deepspeed_version() -> str | None:
    try:
        return metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        return None


def without_shared_memory_comm_op() -> None:
    """Keep DeepSpeed from JIT-compiling its CPU shared-memory all-reduce op at engine start.

    The op serves only ``inference_all_reduce`` (and only with LOCAL_SIZE set), never a checkpoint;
    but its build runs in every fresh rank under torch's cpp_extension lock file, and a rank killed
    during the build (a fault, a teardown) leaves that lock behind: every later DeepSpeed process
    on the machine then waits for it forever (seen here). The build is skipped, not the library.
    """
    import sys

    comm = sys.modules.get("deepspeed.comm.torch")
    if comm is not None:
        comm.build_shm_op = lambda: None


def import_deepspeed(rank: int, world_size: int) -> None:
    """Import DeepSpeed in a rank, with the environment its ``initialize`` reads (one node: the
    local rank is the rank) and without the shared-memory op build."""
    for name, value in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", world_size),
                        ("LOCAL_WORLD_SIZE", world_size)):
        os.environ[name] = str(value)
    import deepspeed  # noqa: F401 -- imported for its effect: after the environment above, which it reads

    without_shared_memory_comm_op()


def training_config(spec: WorkloadSpec, world_size: int, stage: int) -> dict[str, Any]:
    """The part of DeepSpeed's config that decides how it trains (the strategy adds ``checkpoint``)."""
    return {
        "train_batch_size": spec.global_batch,
        "train_micro_batch_size_per_gpu": spec.global_batch // world_size,
        "gradient_accumulation_steps": 1,
        # stated, not left to the release: the default is 0.0 (no clipping) in DeepSpeed 0.17.6
        # (runtime/constants.py:246) and 1.0 in 0.19.8 (runtime/constants.py:203), so the same
        # config trains another job under another release (docs/findings.md)
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
        "steps_per_print": 1 << 30,
    }


def start_engine(workload: TrainableWorkload, config: dict[str, Any], stage: int) -> ZeroTrainedWorkload:
    """``deepspeed.initialize`` over the workload's model, optimizer and scheduler (collective)."""
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(model=workload.model, optimizer=workload.optimizer,
                                           lr_scheduler=workload.scheduler, config=config,
                                           dist_init_required=False)
    return ZeroTrainedWorkload(workload, engine, stage)


class ZeroTrainedWorkload(Workload):
    """A `TrainableWorkload` whose steps a DeepSpeed engine computes.

    Its ``state_dict`` (what fingerprints and trusted snapshots see) is free of the topology: full
    fp32 parameters and Adam moments assembled from the ZeRO partitions with DeepSpeed's
    ``safe_get_full_*`` API, so a state compares bitwise across world sizes. ``state_dict`` and
    ``load_state_dict`` are collective: every rank calls them together.
    """

    def __init__(self, inner: TrainableWorkload, engine: Any, stage: int):
        super().__init__(inner.spec, inner.rank, inner.world_size)
        self.inner, self.engine, self.stage = inner, engine, stage
        self.rank_local_keys = inner.rank_local_keys
        self._adam = engine.optimizer.optimizer  # the client optimizer, now over flat partitions

    @property
    def step(self) -> int:
        return self.inner.step

    def train_step(self) -> float:
        inputs, targets = self.inner.next_local_batch()
        loss = self.inner.local_loss(self.engine(inputs), targets)
        self.engine.backward(loss)
        self.engine.step()
        self.inner.count_step()
        total = loss.detach().clone().reshape(1)
        dist.all_reduce(total)
        return float(total[0]) / self.world_size

    def _adam_step(self) -> float | None:
        """Adam's step count, once its state exists; then the moments are reachable per parameter."""
        steps = {float(state["step"]) for state in self._adam.state.values() if "step" in state}
        if len(steps) != 1:
            return None
        # ZeRO 1/2 link each parameter to its slice of the moments lazily, in their next step, so
        # right after load_checkpoint safe_get_full_optimizer_state fails (TypeError) until linked
        link = getattr(self.engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None:
            link()
        return steps.pop()

    def state_dict(self) -> dict[str, Any]:
        from deepspeed.utils import (
            safe_get_full_fp32_param,
            safe_get_full_optimizer_state,
        )

        parameters = list(self.engine.module.named_parameters())
        state = {**self.inner.progress_state(),
                 "model": {name: safe_get_full_fp32_param(p).detach().clone() for name, p in parameters},
                 "scheduler": self.inner.scheduler.state_dict(), "optimizer": {}}
        adam_step = self._adam_step()
        if adam_step is not None:  # Adam creates its moments at the first step
            state["optimizer"] = {key: {name: safe_get_full_optimizer_state(p, key).detach().clone()
                                        for name, p in parameters} for key in ADAM_MOMENTS}
            state["optimizer"]["step"] = adam_step
        return state

    def evaluation_loss(self) -> float | None:
        """The inner workload's evaluation loss under the full parameters, recorded at save time as
        client state (for `resilience verify --step-check`). ZeRO-1/2 keep every parameter whole on
        every rank: no collective. ZeRO-3 would have to gather its partitions, collectives that
        DeepSpeed's own save does not make and that would move where a stalled or partitioned peer
        is first noticed: it records nothing."""
        if self.stage == 3:
            return None
        return self.inner.evaluation_loss({name: p.detach() for name, p in self.engine.module.named_parameters()})

    def rank_local_state(self) -> dict[str, Any]:
        return self.inner.progress_state()  # state_dict() is collective; a rank new to the job calls this alone

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The trusted restore of a reference snapshot, through DeepSpeed's public parameter API
        only: never through a DeepSpeed checkpoint, which is what is under test."""
        from deepspeed.utils import (
            safe_set_full_fp32_param,
            safe_set_full_optimizer_state,
        )

        if state["optimizer"] and self._adam_step() is None:
            self.train_step()  # Adam and ZeRO create their state tensors; everything is overwritten below
        for name, parameter in self.engine.module.named_parameters():
            value = state["model"][name]
            self._set_full(parameter, value, None, safe_set_full_fp32_param)
            self._set_module_parameter(parameter, value)
            for key in ADAM_MOMENTS if state["optimizer"] else ():
                self._set_full(parameter, state["optimizer"][key][name], key, safe_set_full_optimizer_state)
        if state["optimizer"]:
            for adam_state in self._adam.state.values():
                adam_state["step"].fill_(state["optimizer"]["step"])
        self.inner.scheduler.load_state_dict(state["scheduler"])
        for group, lr in zip(self._adam.param_groups, self.inner.scheduler.get_last_lr(), strict=False):
            group["lr"] = lr
        self.inner.load_progress_state(state)
        self.engine.global_steps = self.inner.step
        self.engine.global_samples = self.inner.step * self.engine.train_batch_size()

    def _set_full(self, parameter, value: torch.Tensor, key: str | None, set_full) -> None:
        """safe_set_full_* for one parameter. ZeRO-3's narrows the value at partition * rank without
        the padding its partitions have, so a parameter whose size the world size does not divide
        fails ("start (1) + length (1) exceeds dimension size (1)"): set this rank's padded slice."""
        if self.stage != 3:
            set_full(parameter, value) if key is None else set_full(parameter, value, key)
            return
        from deepspeed.utils import (
            safe_set_local_fp32_param,
            safe_set_local_optimizer_state,
        )

        size = parameter.ds_tensor.numel()
        padded = torch.zeros(size * self.world_size, dtype=value.dtype)
        padded[:value.numel()] = value.reshape(-1)
        local = padded.narrow(0, size * self.rank, size)
        if key is None:
            safe_set_local_fp32_param(parameter, local)
        else:
            safe_set_local_optimizer_state(parameter, local, key)

    def _set_module_parameter(self, parameter: torch.nn.Parameter, value: torch.Tensor) -> None:
        """The copy the forward pass reads (ZeRO-3 keeps only a partition of it on each rank)."""
        if self.stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters([parameter], modifier_rank=0):
                if self.rank == 0:
                    parameter.data.copy_(value)
        else:
            parameter.data.copy_(value)
