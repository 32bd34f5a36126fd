"""The workload FSDP2 trains for the `dcp` strategy: the inner workload's model sharded over every
rank, with its optimizer and schedule rebuilt over the shards."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ...workloads.base import TrainableWorkload, Workload


class FsdpTrainedWorkload(Workload):
    """A `TrainableWorkload` whose model FSDP2 shards over every rank, or, with ``replicate`` R > 1,
    hybrid-shards (HSDP): a 2-D mesh of R replica groups, each sharding the model over
    ``world_size / R`` ranks, gradients reduce-scattered within a group and all-reduced across.

    The optimizer and scheduler are rebuilt over the sharded parameters (FSDP2 replaces them with
    DTensors). Gradients are reduce-scattered as a plain sum (``set_gradient_divide_factor(1)``, sum
    reductions only): the loss is normalized by the global batch, so the trajectory is the inner
    workload's whatever the split, except for the bits of that sum.

    ``state_dict`` (what fingerprints and trusted snapshots see) is free of the topology: the full,
    unsharded model and optimizer state (``StateDictOptions(full_state_dict=True)``), gathered on
    every rank. ``state_dict`` and ``load_state_dict`` are collective: every rank calls them together.
    """

    def __init__(self, inner: TrainableWorkload, replicate: int = 1):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        super().__init__(inner.spec, inner.rank, inner.world_size)
        self.inner = inner
        self.rank_local_keys = inner.rank_local_keys
        scheduler = inner.scheduler
        if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR) or scheduler.last_epoch != 0:
            raise TypeError(f"FSDP2 training rebuilds the LR schedule over the sharded parameters; it needs a fresh "
                            f"LambdaLR, got {type(scheduler).__name__} at epoch {scheduler.last_epoch}")
        if inner.world_size % replicate:
            raise ValueError(f"replicate {replicate} does not divide the world size {inner.world_size}: "
                             "hybrid sharding needs equal replica groups")
        if replicate > 1:
            mesh = init_device_mesh("cpu", (replicate, inner.world_size // replicate),
                                    mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (inner.world_size,))
        self.model = fully_shard(inner.model, mesh=mesh)
        self.model.set_gradient_divide_factor(1.0)
        self.model.set_force_sum_reduction_for_comms(True)
        defaults = dict(inner.optimizer.defaults)
        self.optimizer = type(inner.optimizer)(self.model.parameters(), **defaults)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, scheduler.lr_lambdas[0])
        inner.optimizer, inner.scheduler = self.optimizer, self.scheduler  # one optimizer, wherever it is reached

    @property
    def step(self) -> int:
        return self.inner.step

    def train_step(self) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        total = None
        for inputs, targets in self.inner.micro_batches():
            loss = ((self.model(inputs) - targets) ** 2).sum() / self.spec.global_batch
            loss.backward()  # FSDP2 reduce-scatters the gradient sum into each rank's shard
            total = loss.detach().reshape(1) if total is None else total + loss.detach()
        self.optimizer.step()
        self.scheduler.step()
        self.inner.count_step()
        dist.all_reduce(total)
        return float(total[0])

    def sharded_state(self) -> dict[str, Any]:
        """What a DCP checkpoint holds: this rank's shards (DTensors) and the replicated rest."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer, "scheduler": self.scheduler.state_dict(),
                "progress": self.inner.progress_state()}

    def load_sharded_state(self, state: dict[str, Any]) -> None:
        """Apply a `sharded_state` that ``dcp.load`` filled in place."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.inner.load_progress_state(state["progress"])

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer,
                                          options=StateDictOptions(full_state_dict=True))
        return {"model": model, "optimizer": optimizer, "scheduler": self.scheduler.state_dict(),
                **self.inner.progress_state()}

    def rank_local_state(self) -> dict[str, Any]:
        return self.inner.progress_state()  # state_dict() is collective; a rank new to the job calls this alone

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The trusted restore of a reference snapshot through torch's full-state-dict API, which
        shards each full tensor locally: never through DCP, which is what is under test."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        # A module applied twice (the workload's ``tied``) has its parameters under two keys; torch
        # 2.13's full-state-dict load shards only the first (``_iterate_valid_model_state`` skips a
        # module it visited, state_dict.py:243) and copies the second, still a plain tensor, into
        # the DTensor ("got mixed torch.Tensor and DTensor"): the second key is left out, and
        # loading the first sets the one parameter both keys name.
        own = {name for name, _ in self.model.named_parameters()} | {name for name, _ in self.model.named_buffers()}
        model_state = {key: value for key, value in state["model"].items() if key in own}
        set_state_dict(self.model, self.optimizer, model_state_dict=model_state, optim_state_dict=state["optimizer"],
                       options=StateDictOptions(full_state_dict=True, strict=len(model_state) == len(state["model"])))
        self.scheduler.load_state_dict(state["scheduler"])
        self.inner.load_progress_state(state)
