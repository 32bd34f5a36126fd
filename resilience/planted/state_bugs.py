"""Planted bugs in what a checkpoint saves or restores: the optimizer, the RNG streams, the data
position, keys that never match, the wrong step or file, a save that changes training, a snapshot
taken after the save returned, a reshard that zero-fills.

Each is modelled on a failure mode seen in real training code and written against the public
contract only; ``resilience.planted.catalogue`` names the case that must catch each one.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..strategies.base import CheckpointStrategy
from ..strategies.torch.native import CHECK_LOSS_KEY, STAMP_KEY, PerRankSave, newest_step_dir, step_dir, step_of
from ..workloads.base import Workload
from .durable import step_dirs

# -- restore is incomplete ----------------------------------------------------------------------


class ForgetsOptimizer(PerRankSave):
    """Restores everything except the Adam moments: training resumes with a cold optimizer (a
    model-only ``load_state_dict``, the optimizer left as constructed)."""

    def restore_from(self, path: Path, workload: Workload) -> None:
        state = _plain_state(path)
        workload.load_state_dict({**state, "optimizer": workload.state_dict()["optimizer"]})


class RankZeroFileEverywhere(PerRankSave):
    """Every rank loads rank 0's file: rank 0's RNG stream (dropout, noise) is given to every rank
    (the seed's warning: per-rank files must be loaded by rank)."""

    def load_step(self, workload: Workload, step: int) -> None:
        self.restore_from(self.step_location(step) / "ckpt_rank_0.pt", workload)
        dist.barrier()


class ForgetsDataPosition(PerRankSave):
    """Restores model, optimizer, schedule and RNG, but the data loader starts its epoch again: the
    resumed job sees the first batches twice and the last ones never."""

    def restore_from(self, path: Path, workload: Workload) -> None:
        state = _plain_state(path)
        workload.load_state_dict({**state, "data": workload.state_dict()["data"]})


class IgnoresMissingKeys(PerRankSave):
    """Saves the model as a DistributedDataParallel wrapper names it (``module.`` before every key)
    and restores it into the bare model with ``strict=False``: no key matches, none is loaded, and
    nothing says so. Optimizer, schedule and data position are restored; the weights stay at init."""

    def file_content(self, workload: Workload) -> dict:
        content = super().file_content(workload)
        content["model"] = {f"module.{key}": value for key, value in content["model"].items()}
        return content

    def restore_from(self, path: Path, workload: Workload) -> None:
        state = _plain_state(path)
        workload.load_state_dict({**state, "model": workload.state_dict()["model"]})
        workload.model.load_state_dict(state["model"], strict=False)


class LoadsOldest(PerRankSave):
    """Restores the oldest checkpoint instead of the newest (a sort in the wrong direction): a
    completed checkpoint is lost."""

    def load(self, workload: Workload) -> None:
        directories = step_dirs(self.context.checkpoint_dir)
        if directories:
            self.load_step(workload, step_of(directories[0]))
        else:
            dist.barrier()


class LoadsByLocalRank(PerRankSave):
    """Saves ckpt_rank_<global rank>.pt and loads ckpt_rank_<LOCAL_RANK>.pt: right on one node only."""

    @staticmethod
    def _restore_model():
        from ..fuzz.models import PerRankModel

        class LocalRankModel(PerRankModel):
            def file_for(self, restart, rank):
                return f"ckpt_rank_{restart.local_rank(rank)}.pt"

        return LocalRankModel

    def load(self, workload: Workload) -> None:
        directory = newest_step_dir(self.context.checkpoint_dir)
        if directory is not None:
            self.restore_from(directory / f"ckpt_rank_{self.context.local_rank}.pt", workload)
        dist.barrier()


LoadsByLocalRank.restore_model = LoadsByLocalRank._restore_model()  # the fuzzer's fast tier replays it


# -- save is wrong ------------------------------------------------------------------------------


class SaveConsumesRandomness(PerRankSave):
    """Saving draws from the training RNG (e.g. to pick a temp file name): a run that checkpoints
    trains differently from one that does not."""

    def save(self, workload: Workload, step: int) -> None:
        torch.randn(1, generator=workload.rng)
        super().save(workload, step)


class SnapshotsAfterReturning(PerRankSave):
    """An asynchronous save that returns before it copied anything: it keeps references to the live
    tensors and writes them when the next save begins (or training ends), after later optimizer
    steps changed them in place. The file of step N holds the weights of a later step."""

    pending: tuple[int, dict] | None = None

    def save(self, workload: Workload, step: int) -> None:
        self.write_pending()
        self.pending = (step, self.file_content(workload))  # references, not copies: the bug
        dist.barrier()

    def finish(self, workload: Workload) -> None:
        self.write_pending()
        dist.barrier()

    def write_pending(self) -> None:
        if self.pending is not None:
            step, content = self.pending
            self.file_path(step).parent.mkdir(parents=True, exist_ok=True)
            torch.save(content, self.file_path(step))
            self.pending = None


class KeepsScheduleBesideCheckpoint(PerRankSave):
    """Writes the LR schedule's state into the job's working directory (where a script keeps its
    run files) and records that file's absolute path in the checkpoint; the restore reads it back
    from there. It works where the restart runs in the same directory on the same machine, and a
    fresh node, or a cleaned working directory, has no such file."""

    def file_content(self, workload: Workload) -> dict:
        content = super().file_content(workload)
        schedule = Path.cwd() / f"schedule_rank_{self.context.rank}.pt"
        torch.save(content.pop("scheduler"), schedule)
        content["scheduler_file"] = str(schedule.resolve())
        return content

    def restore_from(self, path: Path, workload: Workload) -> None:
        state = _plain_state(path)
        state["scheduler"] = torch.load(state.pop("scheduler_file"), weights_only=True)
        workload.load_state_dict(state)


class ZeroFillReshard(CheckpointStrategy):
    """Shards the replicated state across the ranks: rank r saves the r-th of W equal slices of
    every flattened tensor (``step_N/slice_<r>.pt``, everything else whole). Restore rebuilds each
    tensor from the slice files of the *current* ranks, sliced by the *current* world size, into a
    zero-filled buffer: exact at the saving world size; at a smaller one, the tail of every slice
    is never read and stays zero."""

    def save(self, workload: Workload, step: int) -> None:
        directory = step_dir(self.context.checkpoint_dir, step)
        directory.mkdir(parents=True, exist_ok=True)
        rank, world = self.context.rank, self.context.world_size
        sliced = _map_tensors(workload.state_dict(), lambda t: t.flatten().tensor_split(world)[rank].clone())
        torch.save(sliced, directory / f"slice_{rank}.pt")
        dist.barrier()

    def load(self, workload: Workload) -> None:
        directory = newest_step_dir(self.context.checkpoint_dir)
        if directory is not None:
            world = self.context.world_size
            slices = [torch.load(directory / f"slice_{r}.pt", weights_only=True) for r in range(world)]
            workload.load_state_dict(_rebuild(workload.state_dict(), slices, world))
        dist.barrier()


# -- helpers ------------------------------------------------------------------------------------


def _plain_state(path: Path) -> dict:
    """A torch scheme's file without its stamp and check loss."""
    state = torch.load(path, weights_only=True)
    for key in (STAMP_KEY, CHECK_LOSS_KEY):
        state.pop(key, None)
    return state


def _map_tensors(value: Any, change: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return change(value)
    if isinstance(value, dict):
        return {key: _map_tensors(item, change) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(item, change) for item in value)
    return value


def _rebuild(template: Any, slices: list[Any], world: int) -> Any:
    """Each tensor of ``template`` rebuilt from the ``world`` slices (the bug: slicing by the
    current world size, whatever size saved them, into zeros)."""
    if isinstance(template, torch.Tensor):
        whole = torch.zeros(template.numel(), dtype=template.dtype)
        for target, piece in zip(whole.tensor_split(world), slices, strict=False):
            count = min(target.numel(), piece.numel())
            target[:count] = piece[:count]
        return whole.reshape(template.shape)
    if isinstance(template, dict):
        return {key: _rebuild(item, [s[key] for s in slices], world) for key, item in template.items()}
    if isinstance(template, (list, tuple)):
        return type(template)(_rebuild(item, [s[i] for s in slices], world) for i, item in enumerate(template))
    return slices[0]


# -- a failure handled by saving ------------------------------------------------------------------


class SavesMidStepOnFailure(PerRankSave):
    """An emergency checkpoint written from the handler of a failed training step (a fault-tolerant
    loop saving what it has before it dies): the step's batch was already drawn, its noise already
    taken from the RNG stream, so the file holds a state no step ever ended in, labelled with the
    last completed step. Restored, it is neither that step nor the next."""

    def prepare(self, workload: Workload) -> Workload:
        train_step = workload.train_step

        def saving_on_failure() -> float:
            try:
                return train_step()
            except Exception:
                self.file_path(workload.step).parent.mkdir(parents=True, exist_ok=True)
                torch.save(self.file_content(workload), self.file_path(workload.step))  # the bug: mid-step state
                raise

        workload.train_step = saving_on_failure
        return workload
