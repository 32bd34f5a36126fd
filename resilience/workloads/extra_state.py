"""State a real job carries beside model and optimizer, as the `mlp` workload's options add it:
dropout that consumes the process's torch RNG, and an exponential moving average of the weights."""
from __future__ import annotations

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


class WeightAverage:
    """An exponential moving average of a model's parameters (full tensors, by name), updated after
    every optimizer step as EMA helpers in training scripts do. A sharded parameter (FSDP2's
    DTensor) is gathered first: a collective, so ``update`` is called on every rank together."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.average = {name: _full(p).detach().clone() for name, p in model.named_parameters()}

    def update(self, model: torch.nn.Module) -> None:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                self.average[name].lerp_(_full(parameter).detach().to(self.average[name].device), 1 - self.decay)

    def state(self) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() for name, tensor in self.average.items()}

    def load(self, state: dict[str, Any]) -> None:
        missing = set(self.average) - set(state)
        if missing:
            raise KeyError(f"the EMA state lacks {sorted(missing)}")
        for name, tensor in self.average.items():
            tensor.copy_(state[name])


def _full(parameter: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(parameter, "full_tensor", None)  # a DTensor: every rank gathers it
    return full_tensor() if full_tensor is not None else parameter
