"""The `mlp` workload: a deterministic training job whose checkpointed state is tensors and ints
(loadable with weights_only), and the gradient sum and schedule the other built-in workloads share.

The trajectory does not depend on how the fixed global batch is split: every rank takes its slice of
the same global batch, the loss is normalized by the global batch, and gradients are summed with one
all-reduce. Only the bits of that sum depend on the world size, which is why the verifier computes
its oracle on the restart's own topology instead of using a tolerance.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from ..core.case import WorkloadSpec
from ..core.device import rank_device
from ..core.topology import Topology
from .base import TrainableWorkload
from .data import ShuffledSampler, synthetic_dataset


class MLPWorkload(TrainableWorkload):
    """A tanh MLP regressing a fixed synthetic dataset with Adam and a warm-up/decay LR schedule.

    Checkpointed state: ``step``, ``model``, ``optimizer`` (Adam moments), ``scheduler``, ``data``
    (epoch and position of the shuffled sampler) and ``rng`` (this rank's input-noise generator).
    With ``rank_rng: same`` every rank draws the noise of the whole global batch from an identical
    stream and keeps its slice (so the trajectory is independent of the split); with ``distinct``
    each rank has its own stream, as real per-rank dropout does, and a restore that hands every rank
    rank 0's stream changes the losses.
    """

    input_dim = 32
    dataset_size = 512
    noise_scale = 0.05
    evaluation_examples = 64
    base_lr = 1e-3

    def __init__(self, spec: WorkloadSpec, rank: int, world_size: int, topology: Topology | None = None):
        super().__init__(spec, rank, world_size, topology)
        if spec.global_batch % world_size:
            raise ValueError(f"global batch {spec.global_batch} is not divisible by world size {world_size}")
        self.local_batch = spec.global_batch // world_size
        hidden = hidden_width(spec.size_bytes, self.input_dim)
        self.device = torch.device(rank_device())  # cuda:LOCAL_RANK under NCCL, else the CPU
        torch.manual_seed(spec.seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(self.input_dim, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, 1)).to(self.device)  # built on the CPU: the same initial bits
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.base_lr, foreach=False)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor)
        inputs, targets = synthetic_dataset(spec.seed, self.dataset_size, self.input_dim)
        self.inputs, self.targets = inputs.to(self.device), targets.to(self.device)
        stream_seed = spec.seed + 2 + (rank + 1) * 7919 if spec.rank_rng == "distinct" else spec.seed + 2
        self.rng = torch.Generator().manual_seed(stream_seed)
        # with one stream shared by all ranks, the stream is replicated state like the model
        self.rank_local_keys = ("rng",) if spec.rank_rng == "distinct" else ()
        self._step = 0
        self.sampler = ShuffledSampler(spec.seed, self.dataset_size, spec.global_batch)

    @property
    def step(self) -> int:
        return self._step

    def next_local_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's slice of the next global batch, (inputs, targets); advances data and noise."""
        indices = self.sampler.next_indices()
        start = self.rank * self.local_batch
        local = indices[start:start + self.local_batch]
        self.last_samples = local.tolist()  # the rows gathered below: what this step trains on
        if self.spec.rank_rng == "same":
            noise = torch.randn(self.spec.global_batch, self.input_dim, generator=self.rng)
            noise = noise[start:start + self.local_batch]
        else:
            noise = torch.randn(self.local_batch, self.input_dim, generator=self.rng)
        local = local.to(self.device)  # the data order and the noise stream stay on the CPU
        return self.inputs[local] + self.noise_scale * noise.to(self.device), self.targets[local]

    def local_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean squared error over this rank's examples (an engine averages it over ranks)."""
        return ((outputs - targets) ** 2).mean()

    def training_examples(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs, self.targets

    def count_step(self) -> None:
        """An engine that drives this workload finished one step."""
        self._step += 1

    def train_step(self) -> float:
        inputs, targets = self.next_local_batch()
        self.optimizer.zero_grad(set_to_none=False)
        local_loss = ((self.model(inputs) - targets) ** 2).sum() / self.spec.global_batch
        local_loss.backward()
        loss = sum_gradients(self.model.parameters(), local_loss.detach().reshape(1))
        self.optimizer.step()
        self.scheduler.step()
        self._step += 1
        return float(loss)

    def evaluation_loss(self, parameters: dict[str, torch.Tensor] | None = None) -> float:
        """The loss on a fixed evaluation batch (the first ``evaluation_examples`` examples, no noise)
        under the current parameters, whatever the world size or batch. Changes no state and needs no
        collective, so a strategy can record it at save time and a check after loading can recompute
        it (bitwise equal if the model was restored). ``parameters``: use these (by name) instead of
        the model's own, for an engine that keeps the model partitioned."""
        count = self.evaluation_examples
        if parameters is None:
            parameters = dict(self.model.named_parameters())
        with torch.no_grad():  # by hand, not through the module: an engine may have hooked it
            hidden = self.inputs[:count]
            layers = [name[:-len(".weight")] for name in parameters if name.endswith(".weight")]
            for index, layer in enumerate(layers):
                hidden = torch.nn.functional.linear(hidden, parameters[f"{layer}.weight"], parameters[f"{layer}.bias"])
                if index < len(layers) - 1:
                    hidden = torch.tanh(hidden)
            errors = (hidden - self.targets[:count]) ** 2
        return float(errors.sum() / count)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            **self.progress_state(),
        }

    def progress_state(self) -> dict[str, Any]:
        return {"step": self._step, "data": self.sampler.state(),
                "rng": self.rng.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.load_progress_state(state)

    def load_progress_state(self, state: dict[str, Any]) -> None:
        self.sampler.load(state["data"])
        self.rng.set_state(state["rng"])
        self._step = int(state["step"])


def sum_gradients(parameters, extra: torch.Tensor, group=None, reduce: bool = True) -> torch.Tensor:
    """Sum every parameter's gradient and ``extra`` over ``group`` in one flat all-reduce (one
    reduction order for all of them), write the sums back, and return the summed ``extra``."""
    grads = [p.grad for p in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads] + [extra])
    if reduce:
        dist.all_reduce(flat, group=group)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()
    return flat[offset:].clone()


def lr_factor(step: int) -> float:
    return min(1.0, (step + 1) / 3) * 0.97 ** step


def hidden_width(size_bytes: int, input_dim: int) -> int:
    """Hidden width whose fp32 parameters take about ``size_bytes``: h*h + (input_dim + 3)*h + 1 params."""
    params = max(size_bytes // 4, 64)
    b = input_dim + 3
    return max(4, int((-b + math.sqrt(b * b + 4 * params)) / 2))
