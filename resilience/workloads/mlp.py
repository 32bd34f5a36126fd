"""The `mlp` workload: a deterministic training job whose checkpointed state is tensors and ints
(loadable with weights_only), and the gradient sum and schedule the other built-in workloads share.

The trajectory does not depend on how the fixed global batch is split: every rank takes its slice of
the same global batch, the loss is normalized by the global batch, and gradients are summed with one
all-reduce. Only the bits of that sum depend on the world size, which is why the verifier computes
its oracle on the restart's own topology instead of using a tolerance.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from ..core.case import WorkloadSpec
from ..core.device import rank_device
from ..core.topology import Topology
from .base import TrainableWorkload
from .data import SamplerData, synthetic_dataset
from .extra_state import Precision, RowDropout, RunningCenter, WeightAverage
from .loader import LoaderData
from .options import TrainingExtras, batch_problem, option_problem


class MLPWorkload(TrainableWorkload):
    """A tanh MLP regressing a fixed synthetic dataset with Adam and a warm-up/decay LR schedule.

    Checkpointed state: ``step``, ``model``, ``optimizer`` (Adam moments), ``scheduler``, ``data``
    (the position of the shuffled sampler or of the DataLoader) and ``rng`` (this rank's input-noise
    generator); with the options (`TrainingExtras`) also ``torch_rng`` (the process's torch RNG,
    which dropout consumes), ``ema`` (the weights' moving average) and ``scaler`` (fp16's loss scale).
    With ``rank_rng: same`` every rank draws the noise (and dropout masks) of the whole global batch
    from an identical stream and keeps its rows (so the trajectory is independent of the split);
    with ``distinct`` each rank has its own streams, as real per-rank dropout does, and a restore
    that hands every rank rank 0's streams changes the losses.
    """

    input_dim = 32
    dataset_size = 512
    noise_scale = 0.05
    evaluation_examples = 64
    base_lr = 1e-3
    @classmethod
    def check_options(cls, options: Mapping[str, Any], world_size: int,
                      global_batch: int) -> tuple[str, str, Any, Any] | None:
        """``workload.options`` (`TrainingExtras`): None, or (key, problem, value, allowed)."""
        return option_problem(options, world_size, global_batch)

    def __init__(self, spec: WorkloadSpec, rank: int, world_size: int, topology: Topology | None = None):
        super().__init__(spec, rank, world_size, topology)
        self.extras = extras = TrainingExtras.parse(spec.options)
        problem = batch_problem(spec.options, world_size, spec.global_batch)
        if problem:
            raise ValueError(problem)
        self.local_batch = spec.global_batch // world_size
        self.micro_batch = self.local_batch // extras.accumulation
        hidden = hidden_width(spec.size_bytes, self.input_dim)
        self.device = torch.device(rank_device())  # cuda:LOCAL_RANK under NCCL, else the CPU
        torch.manual_seed(spec.seed)
        distinct = spec.rank_rng == "distinct"
        self.dropouts = [RowDropout(extras.dropout, distinct) for _ in range(2)] if extras.dropout else []
        statistics = [RunningCenter(hidden, self.micro_batch * world_size)] if extras.buffers else []
        # built in this order: the same initial bits with any options
        first, shared, last = (torch.nn.Linear(self.input_dim, hidden), torch.nn.Linear(hidden, hidden),
                               torch.nn.Linear(hidden, 1))
        layers = [first, torch.nn.Tanh(), *statistics, *self.dropouts[:1], shared, torch.nn.Tanh(),
                  *((shared, torch.nn.Tanh()) if extras.tied else ()), *self.dropouts[1:], last]  # tied: 2 keys
        self.model = torch.nn.Sequential(*layers).to(self.device)  # built on the CPU: the same initial bits
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.base_lr, foreach=False)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor)
        self.average = WeightAverage(self.model, extras.ema) if extras.ema is not None else None
        self.precision = Precision(extras.amp, self.device)
        size = spec.global_batch * extras.epoch_steps if extras.data == "loader" else self.dataset_size
        inputs, targets = synthetic_dataset(spec.seed, size, self.input_dim)
        self.inputs, self.targets = inputs.to(self.device), targets.to(self.device)
        if extras.data == "loader":
            self.data = LoaderData(inputs, targets, spec.seed, rank, world_size, self.micro_batch, extras.num_workers,
                                   extras.persistent_workers, extras.loader_state == "per_rank")
        else:
            self.data = SamplerData(inputs, targets, spec.seed, rank, world_size, self.micro_batch, spec.global_batch)
        stream_seed = spec.seed + 2 + (rank + 1) * 7919 if distinct else spec.seed + 2
        self.rng = torch.Generator().manual_seed(stream_seed)
        if extras.dropout:  # the stream dropout draws from: the process's own, as nn.Dropout's
            torch.manual_seed(stream_seed + 1)
        # with one stream shared by all ranks, the stream is replicated state like the model
        self.rank_local_keys = (("rng", "torch_rng") if extras.dropout else ("rng",)) if distinct else ()
        if extras.loader_state == "per_rank":
            self.rank_local_keys += ("data",)  # each rank's position under its own key
        self._step = 0

    @property
    def step(self) -> int:
        return self._step

    def next_micro_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indices, inputs, targets) of this rank's next micro-batch; advances data, noise and
        the rows the dropout masks are drawn for."""
        indices, inputs, targets, rows = self.data.next_micro_batch()
        global_rows = self.micro_batch * self.world_size
        if self.spec.rank_rng == "same":
            noise = torch.randn(global_rows, self.input_dim, generator=self.rng)[rows]
        else:
            noise = torch.randn(self.micro_batch, self.input_dim, generator=self.rng)
        for dropout in self.dropouts:
            dropout.rows, dropout.global_rows = rows, global_rows
        inputs = inputs.to(self.device) + self.noise_scale * noise.to(self.device)
        return indices, inputs, targets.to(self.device)

    def micro_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This step's micro-batches, (inputs, targets) each; tells ``micro_step_listener`` between
        them, and records the step's samples once all were drawn."""
        samples: list[int] = []
        for index in range(self.extras.accumulation):
            if index and self.micro_step_listener is not None:
                self.micro_step_listener(self._step + 1)
            indices, inputs, targets = self.next_micro_batch()
            samples += indices.tolist()  # the rows gathered: what this step trains on
            yield inputs, targets
        self.last_samples = samples

    def next_local_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's whole batch of the next step, (inputs, targets), for an engine that takes
        one batch a step (``accumulation`` 1)."""
        (batch,) = list(self.micro_batches())
        return batch

    def local_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean squared error over this rank's examples (an engine averages it over ranks)."""
        return ((outputs - targets) ** 2).mean()

    def training_examples(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs, self.targets

    def count_step(self) -> None:
        """An optimizer step finished (this workload's own, or an engine's that drives it)."""
        if self.average is not None:
            self.average.update(self.model)
        self._step += 1

    def train_step(self) -> float:
        paced_until = time.monotonic() + self.extras.step_seconds
        self.optimizer.zero_grad(set_to_none=False)
        total = None
        for inputs, targets in self.micro_batches():  # gradients accumulate, one reduction a step
            with self.precision.autocast():
                local_loss = ((self.model(inputs) - targets) ** 2).sum() / self.spec.global_batch
            self.precision.backward(local_loss)
            total = local_loss.detach().reshape(1) if total is None else total + local_loss.detach()
        loss = sum_gradients(self.model.parameters(), total)
        self.precision.step(self.optimizer)
        self.scheduler.step()
        self.count_step()
        # a step as long as a real model's: what arrives while the job trains finds it training
        time.sleep(max(0.0, paced_until - time.monotonic()))
        return float(loss)

    def evaluation_loss(self, parameters: dict[str, torch.Tensor] | None = None) -> float:
        """The loss on a fixed evaluation batch (the first ``evaluation_examples`` examples, no noise)
        under the current parameters, whatever the world size or batch. Changes no state and needs no
        collective, so a strategy can record it at save time and a check after loading can recompute
        it (bitwise equal if the model was restored). ``parameters``: use these (by name) instead of
        the model's own, for an engine that keeps the model partitioned."""
        count = min(self.evaluation_examples, len(self.inputs))
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
        state = {"step": self._step, "data": self.data.state(), "rng": self.rng.get_state()}
        if self.dropouts:
            state["torch_rng"] = torch.get_rng_state()
        if self.average is not None:
            state["ema"] = self.average.state_dict()
        if self.precision.scaler is not None:
            state["scaler"] = self.precision.scaler.state_dict()
        return state

    def close(self) -> None:
        self.data.close()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.load_progress_state(state)

    def load_progress_state(self, state: dict[str, Any]) -> None:
        self.data.load(state["data"])
        self.rng.set_state(state["rng"])
        if self.dropouts:
            torch.set_rng_state(state["torch_rng"])
        if self.average is not None:
            self.average.load_state_dict(state["ema"])
        if self.precision.scaler is not None:
            self.precision.scaler.load_state_dict(state["scaler"])
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
