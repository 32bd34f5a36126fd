"""State a real job carries beside model and optimizer, as the `mlp` workload's options add it:
dropout that consumes the process's torch RNG, an exponential moving average of the weights, and
mixed precision with its loss scaler."""
from __future__ import annotations

import contextlib
from typing import Any

import torch


class RowDropout(torch.nn.Module):
    """Dropout after a hidden layer, drawing from the process's default torch generator as
    ``torch.nn.Dropout`` does. With ``per_rank`` it is exactly ``F.dropout`` on this rank's rows
    (each rank its own stream: the trajectory depends on the world size). Otherwise every rank
    draws the mask of the whole global micro-batch from one replicated stream and keeps its own
    ``rows``, so the mask of an example does not depend on which rank trains it. ``rows`` and
    ``global_rows`` are set by the workload before each forward."""

    rows: torch.Tensor | None = None
    global_rows = 0

    def __init__(self, p: float, per_rank: bool):
        super().__init__()
        self.p, self.per_rank = p, per_rank

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return hidden
        if self.per_rank or self.rows is None:
            return torch.nn.functional.dropout(hidden, self.p, training=True)
        keep = torch.empty(self.global_rows, hidden.shape[1]).bernoulli_(1 - self.p)[self.rows]
        return hidden * keep.to(hidden.device) / (1 - self.p)


class RunningCenter(torch.nn.Module):
    """Running statistics, as batch normalization keeps them: the forward subtracts a running
    mean of the hidden activations (a buffer updated in place from each global micro-batch, whose
    mean comes from one all-reduce, as SyncBatchNorm's does), with a momentum that falls as the
    ``updates`` counter grows; ``updates`` is rebound to a new tensor at every forward (updated
    out of place), so a state dict taken earlier holds a stale copy of it while it holds the live
    running mean. Collective in training: every rank runs its forward together."""

    def __init__(self, width: int, global_rows: int):
        super().__init__()
        self.global_rows = global_rows
        self.register_buffer("running_mean", torch.zeros(width))
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        centered = hidden - self.running_mean
        if self.training:
            import torch.distributed as dist

            total = hidden.detach().float().sum(dim=0)
            dist.all_reduce(total)
            momentum = max(0.1, 1.0 / float(self.updates + 1))
            self.running_mean.lerp_(total.to(self.running_mean.dtype) / self.global_rows, momentum)
            self.updates = self.updates + 1
        return centered


class WeightAverage:
    """An exponential moving average of a model's parameters (full tensors, by name), updated after
    every optimizer step as EMA helpers in training scripts do (``state_dict`` and
    ``load_state_dict``, so a library can checkpoint it as it does a module). A sharded parameter (FSDP2's
    DTensor) is gathered first: a collective, so ``update`` is called on every rank together."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.average = {name: _full(p).detach().clone() for name, p in model.named_parameters()}

    def update(self, model: torch.nn.Module) -> None:
        parameters = dict(model.named_parameters())  # the ones it averaged from the start, by name
        with torch.no_grad():
            for name, average in self.average.items():
                average.lerp_(_full(parameters[name]).detach().to(average.device), 1 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() for name, tensor in self.average.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = set(self.average) - set(state)
        if missing:
            raise KeyError(f"the EMA state lacks {sorted(missing)}")
        for name, tensor in self.average.items():
            tensor.copy_(state[name])


def _full(parameter: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(parameter, "full_tensor", None)  # a DTensor: every rank gathers it
    return full_tensor() if full_tensor is not None else parameter


class Precision:
    """The step's arithmetic: full precision (None), or autocast in ``bf16`` or ``fp16`` on the
    rank's device; ``fp16`` scales the loss with a ``torch.amp.GradScaler`` whose state (scale,
    growth tracker) a checkpoint must carry. A tiny CPU run never overflows at a real job's
    settings, so the scaler starts at 2**20 and grows after every step (``growth_interval`` 1):
    the scale overflows the fp16 gradients, backs off and grows again within a few steps, and a
    restore that resets it skips steps the uninterrupted run took."""

    INIT_SCALE, GROWTH_INTERVAL = 2.0 ** 20, 1

    def __init__(self, amp: str | None, device: torch.device):
        self.device_type = device.type
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp or "")
        self.scaler = torch.amp.GradScaler(device.type, init_scale=self.INIT_SCALE,
                                           growth_interval=self.GROWTH_INTERVAL) if amp == "fp16" else None

    def autocast(self) -> Any:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step, skipped by the scaler when a gradient overflowed (every rank sees
        the same summed gradients, so every rank skips together)."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()
