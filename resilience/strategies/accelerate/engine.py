"""Hugging Face Accelerate as it trains a workload: the data position registered for
checkpointing and the workload whose steps Accelerate's prepared objects compute. What decides
the numbers of an Accelerate-trained run lives here and in `strategies.accelerate`'s loop: the
reference cache is keyed on both.
"""
from __future__ import annotations

from typing import Any

import torch

from ...workloads.base import TrainableWorkload, Workload


class DataPosition:
    """The step, epoch and batch within the epoch: registered with
    ``Accelerator.register_for_checkpointing`` so ``save_state`` / ``load_state`` carry it."""

    def __init__(self) -> None:
        self.step, self.epoch, self.batch = 0, 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.epoch, self.batch = int(state["step"]), int(state["epoch"]), int(state["batch"])


class AccelerateTrainedWorkload(Workload):
    """A `TrainableWorkload` trained by Accelerate's prepared model, optimizer, scheduler and data
    loader. State (what fingerprints see): the position, the model, the optimizer, the schedule,
    and with the options the weights' average and the process's torch RNG."""

    def __init__(self, inner: TrainableWorkload):
        super().__init__(inner.spec, inner.rank, inner.world_size)
        self.inner = inner
        self.position = DataPosition()
        self.accelerator: Any = None

    @property
    def step(self) -> int:
        return self.position.step

    def train_step(self) -> float:
        raise NotImplementedError("the Accelerate loop computes the steps of an Accelerate-trained workload")

    def state_dict(self) -> dict[str, Any]:
        state = {**self.position.state_dict(), "model": self.inner.model.state_dict(),
                 "optimizer": self.inner.optimizer.state_dict(), "scheduler": self.inner.scheduler.state_dict()}
        average = getattr(self.inner, "average", None)  # the mlp workload's, with the ema option
        if average is not None:
            state["ema"] = average.state_dict()
        if self.spec.options.get("dropout"):  # the stream dropout draws from
            state["torch_rng"] = torch.get_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError("Accelerate restores its own checkpoints (Accelerator.load_state)")

    def save_reference_snapshot(self, directory) -> None:
        """The reference run's own state as Accelerate saves it (collective); the oracle's
        continuation starts from it with ``load_state``."""
        self.accelerator.save_state(str(directory))

    def evaluation_loss(self, parameters=None) -> float:
        return self.inner.evaluation_loss(parameters)
