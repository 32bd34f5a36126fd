"""Planted bugs of a job's sequence of launches: three that only a second resume shows (each saves
right until the job has been restored once, and writes something stale from then on), and a last
save left in flight when the job ends. A case with one restart never restores a save its
restart made, so it accepts them all; a timeline whose third launch restores the second launch's
save catches them (``resilience.planted.catalogue``: the catcher ``second_resume``); the restart after a
job that ended cleanly catches the last (``clean_exit``).

Each is modelled on a failure mode of real training code and written against the public contract.
"""
from __future__ import annotations

import copy
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from ..strategies.torch.native import CHECK_LOSS_KEY, PerRankSave, load_checked
from ..workloads.base import Workload


class SavesTensorsHeldBeforeLoad(PerRankSave):
    """Keeps references to the model's tensors from ``prepare`` (a save then needs no state dict),
    and restores with ``load_state_dict(assign=True)``, handing the optimizer the new parameters:
    training goes on right after the resume, but the references still name the tensors the process
    started with, so every save after it writes the weights from before the restore."""

    def prepare(self, workload: Workload) -> Workload:
        workload = super().prepare(workload)
        self.held = workload.model.state_dict()  # detached views of the live tensors
        return workload

    def file_content(self, workload: Workload) -> dict:
        return {**super().file_content(workload), "model": dict(self.held)}

    def restore_from(self, path: Path | str, workload: Workload) -> None:
        super().restore_from(path, workload)
        model, optimizer = workload.model, workload.optimizer
        before = list(model.parameters())
        model.load_state_dict({name: t.detach().clone() for name, t in model.state_dict().items()}, assign=True)
        after = dict(zip(map(id, before), model.parameters(), strict=True))
        for group in optimizer.param_groups:
            group["params"] = [after[id(p)] for p in group["params"]]
        optimizer.state = defaultdict(dict, {after[id(p)]: s for p, s in optimizer.state.items()})


class KeepsLoadedDataPosition(PerRankSave):
    """Writes the data position its loader reports, and that loader reports the state it was
    restored with until its iterator is rebuilt, which this job never does: the first resume
    restores the right position, every later save writes that one again, and the second resume
    goes back to it and replays the batches in between."""

    loaded_data: Any = None

    def file_content(self, workload: Workload) -> dict:
        content = super().file_content(workload)
        if self.loaded_data is not None:
            content["data"] = copy.deepcopy(self.loaded_data)
        return content

    def restore_from(self, path: Path | str, workload: Workload) -> None:
        super().restore_from(path, workload)
        self.loaded_data = copy.deepcopy(workload.state_dict()["data"])


class CachesLoadedState(PerRankSave):
    """Keeps the state dict it restored as its save cache (to spare building one at every save),
    refreshing the counters, schedule, data position and RNG in it but never its tensors: the
    model and the optimizer's moments were copied out of it into the live ones, so every save
    after the resume writes the restored step's weights under a later step."""

    cache: dict | None = None
    REFRESHED = ("step", "scheduler", "data", "rng")

    def file_content(self, workload: Workload) -> dict:
        content = super().file_content(workload)
        if self.cache is None:
            return content
        live_steps = {index: entry["step"] for index, entry in content["optimizer"]["state"].items()
                      if isinstance(entry.get("step"), torch.Tensor)}
        cached = {**content, **{key: value for key, value in self.cache.items() if key not in self.REFRESHED}}
        for index, step in live_steps.items():  # Adam's step counts on: only the tensors are stale
            cached["optimizer"]["state"][index]["step"] = step
        return cached

    def restore_from(self, path: Path | str, workload: Workload) -> None:
        state = load_checked(path, bool(self.context.options.get("check_version")), self.target)
        self.recorded_check_loss = state.pop(CHECK_LOSS_KEY, None)
        workload.load_state_dict(state)
        self.cache = {key: value for key, value in state.items() if key in ("model", "optimizer")}


class DefersWriteToNextStep(PerRankSave):
    """Returns from a save once the state is staged (a copy), and writes it when the next training
    step begins, as a save that overlaps its write with the next step's compute does; ``finish``
    does not write the last one (the ``flush_at_exit: true`` twin does), so the job ends, every
    rank exiting 0, believing its last step saved."""

    options = (*PerRankSave.options, "flush_at_exit")
    option_values = {**PerRankSave.option_values, "flush_at_exit": (True, False)}
    staged: tuple[dict, int] | None = None

    def prepare(self, workload: Workload) -> Workload:
        workload = super().prepare(workload)
        train_step = workload.train_step

        def write_then_train() -> float:
            self.write_staged()
            return train_step()

        workload.train_step = write_then_train
        return workload

    def save(self, workload: Workload, step: int) -> None:
        self.write_staged()
        self.staged = (copy.deepcopy(self.file_content(workload)), step)

    def write_staged(self) -> None:
        if self.staged is None:
            return
        content, step = self.staged
        self.staged = None
        self.target.make_directory(self.step_location(step))
        self.target.save(content, self.file_path(step))

    def finish(self, workload: Workload) -> None:
        if self.context.options.get("flush_at_exit"):
            self.write_staged()


class MisnamesRankOneShard(PerRankSave):
    """Rank 1 saves its shard as ``ckpt_rank1.pt`` (the save's path lost an underscore the restore's
    kept), and every restore reads ``ckpt_rank_1.pt``: each save returns on every rank and none can
    ever be restored, which a case learns only when it restores one, unless the saves are verified
    where they were made (``verify_saves``)."""

    saving = False

    def save(self, workload: Workload, step: int) -> None:
        self.saving = True
        try:
            super().save(workload, step)
        finally:
            self.saving = False

    def file_path(self, step: int) -> Path | str:
        path = super().file_path(step)
        if self.saving and self.context.rank == 1:
            return str(path).replace("ckpt_rank_1.pt", "ckpt_rank1.pt")
        return path
