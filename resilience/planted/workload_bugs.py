"""Planted bugs in the state a real job carries beside model and optimizer (`mlp` workload
options): the weights' moving average, the DataLoader's epoch and position, the step-to-batch
arithmetic of gradient accumulation, the fp16 loss scaler, a buffer updated out of place, and
tied weights.

Each is modelled on a failure mode of real training scripts and written against the public contract
(``state_dict``/``load_state_dict``) and the workload's own data pipeline, which a script owns;
``resilience.planted.catalogue`` names the case that must catch each one.
"""
from __future__ import annotations

import copy
from pathlib import Path

from ..strategies.torch.native import CHECK_LOSS_KEY, PerRankSave, load_checked
from ..workloads.base import Workload


class EmaSavedAsWeights(PerRankSave):
    """Writes the live weights where the moving average belongs (the script saves the model it
    trains under the EMA key, not the EMA helper's shadow copy): the average restarts from the
    weights of the checkpoint's step."""

    def file_content(self, workload: Workload) -> dict:
        content = super().file_content(workload)
        content["ema"] = {name: tensor.clone() for name, tensor in content["model"].items()}
        return content


class ReshufflesFromEpochZero(PerRankSave):
    """Restores the loader's position within its epoch but never calls ``set_epoch`` with the
    saved epoch: the resumed epoch is dealt in epoch 0's shuffled order."""

    def restore_from(self, path: Path | str, workload: Workload) -> None:
        super().restore_from(path, workload)
        state = workload.state_dict()
        workload.load_state_dict({**state, "data": {**state["data"], "epoch": 0}})


class CountsPrefetchedBatches(PerRankSave):
    """Saves the loader position as its sampler counts it: the indices handed to the DataLoader's
    worker processes, which prefetch ahead of training (``num_workers * prefetch_factor``
    batches). A resume skips batches that were fetched and never trained; without workers the
    count is exact and the bug hides."""

    def file_content(self, workload: Workload) -> dict:
        content = super().file_content(workload)
        data = workload.data  # the script's own loader and sampler
        content["data"] = {**content["data"], "batch": data.sampler.handed_out // data.loader.batch_size}
        return content


class SkipsStepsNotMicroBatches(PerRankSave):
    """Resumes mid-epoch by skipping one batch per optimizer step trained in the epoch, forgetting
    that each step took ``accumulation`` micro-batches: the rest of the epoch's first part is
    trained again."""

    def restore_from(self, path: Path | str, workload: Workload) -> None:
        super().restore_from(path, workload)
        state = workload.state_dict()
        epoch_steps = int(workload.spec.options.get("epoch_steps", 5))
        steps_in_epoch = state["step"] - state["data"]["epoch"] * epoch_steps
        workload.load_state_dict({**state, "data": {**state["data"], "batch": steps_in_epoch}})


class ScalerNotSaved(PerRankSave):
    """Checkpoints model, optimizer and the rest but not the fp16 loss scaler, and builds a fresh
    one on resume (a script that saves what it names and forgets ``scaler.state_dict()``): the
    scale starts over, and the first steps after the restore overflow or skip where the
    uninterrupted run did not."""

    def file_content(self, workload: Workload) -> dict:
        content = super().file_content(workload)
        content.pop("scaler", None)
        return content

    def restore_from(self, path: Path | str, workload: Workload) -> None:
        fresh = workload.state_dict()["scaler"]  # the scaler as the resumed script constructs it
        state = load_checked(path, False, self.target)
        state.pop(CHECK_LOSS_KEY, None)
        workload.load_state_dict({**state, "scaler": fresh})


class CachesModelStateDict(PerRankSave):
    """Takes the model's state dict once, at the first save, and writes that dict at every later
    save (the tensors it holds are the live ones, so why ask again): what the model updates in
    place is saved fresh, a buffer the forward rebinds to a new tensor (updated out of place) is
    saved as it was at the first save."""

    cached_model: dict | None = None

    def file_content(self, workload: Workload) -> dict:
        content = super().file_content(workload)
        if self.cached_model is None:
            self.cached_model = workload.state_dict()["model"]
        content["model"] = self.cached_model
        return content


class UntiesAtLoad(PerRankSave):
    """Restores every state-dict key into a parameter of its own (a load with ``assign=True``, or a
    format that stores each key apart and never re-ties): the tied layer's two keys get the same
    values but two tensors, and the optimizer, built over the one tied parameter, updates only the
    first from then on."""

    def restore_from(self, path: Path | str, workload: Workload) -> None:
        super().restore_from(path, workload)
        seen: set[int] = set()
        for index, layer in enumerate(list(workload.model)):  # named_children() would skip the repeat
            if id(layer) in seen:
                workload.model[index] = copy.deepcopy(layer)
            seen.add(id(layer))
