"""Deliberately broken checkpoint strategies, each modelled on a failure mode seen in real training
code, and the correct twins their catching cases are checked against.

Every class is written against the public contract (``CheckpointStrategy``) only, as a user's
strategy would be; ``resilience.planted.catalogue`` names the case that must catch each one.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..strategies.base import CheckpointStrategy
from ..strategies.torch_native import (
    CHECK_LOSS_KEY,
    FORMAT_VERSION,
    STAMP_KEY,
    STEP_DIR,
    PerRankSave,
    newest_step_dir,
    step_dir,
    step_of,
)
from ..workloads.mlp import Workload

# -- correct twins ------------------------------------------------------------------------------


def fsync_directory(path: Path) -> None:
    """Make the entries of ``path`` (a new file's name, a rename) durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_durably(path: Path, write: Callable[[Any], None]) -> None:
    """Write through a temp name, fsync it, rename it into place, fsync the directory."""
    staging = path.with_suffix(".tmp")
    with open(staging, "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(staging, path)
    fsync_directory(path.parent)


def step_dirs(root: Path) -> list[Path]:
    """Every step directory under ``root``, oldest first."""
    found = [p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)] if root.is_dir() else []
    return sorted(found, key=lambda p: p.name)


class AtomicFallbackSave(CheckpointStrategy):
    """Correct: write to a temp name, fsync, rename; restore the newest step every rank completed."""

    def write(self, workload: Workload, step: int) -> None:
        directory = step_dir(self.context.checkpoint_dir, step)
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / f"ckpt_rank_{self.context.rank}.pt"
        temp = final.with_suffix(".tmp")
        with open(temp, "wb") as f:
            torch.save(workload.state_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)

    def save(self, workload: Workload, step: int) -> None:
        self.write(workload, step)
        dist.barrier()

    def load(self, workload: Workload) -> None:
        for directory in reversed(step_dirs(self.context.checkpoint_dir)):
            files = [directory / f"ckpt_rank_{r}.pt" for r in range(self.context.world_size)]
            if all(f.exists() for f in files):
                workload.load_state_dict(torch.load(files[self.context.rank], weights_only=True))
                break
        dist.barrier()


class DurableShardsThenPointer(CheckpointStrategy):
    """Correct, with a ``latest`` pointer: every shard is written to a temp name, fsynced, renamed
    and its directory fsynced (the new step directory's entry in the root too) before rank 0
    publishes ``latest`` (the step directory's name, as DeepSpeed names its tag) the same way. Restore takes the step ``latest`` names, or a newer step
    whose every shard is in place (a pointer update that never reached the disk), saying so."""

    def write_shard(self, workload: Workload, path: Path) -> None:
        write_durably(path, lambda file: torch.save(workload.state_dict(), file))
        fsync_directory(path.parent.parent)

    def shard(self, step: int, rank: int | None = None) -> Path:
        rank = self.context.rank if rank is None else rank
        return step_dir(self.context.checkpoint_dir, step) / f"shard_{rank}.pt"

    def save(self, workload: Workload, step: int) -> None:
        root = self.context.checkpoint_dir
        step_dir(root, step).mkdir(parents=True, exist_ok=True)
        self.write_shard(workload, self.shard(step))
        dist.barrier()
        if self.context.rank == 0:
            write_durably(root / "latest", lambda file: file.write(step_dir(root, step).name.encode()))
        dist.barrier()

    def pointed_step(self) -> int | None:
        pointer = self.context.checkpoint_dir / "latest"
        if not pointer.exists():
            return None
        named = pointer.read_text().strip()
        if not STEP_DIR.match(named):
            raise RuntimeError(f"latest names {named!r}, which is not a step directory")
        return step_of(Path(named))

    def step_to_restore(self) -> int | None:
        pointed = self.pointed_step()
        complete = [step_of(d) for d in step_dirs(self.context.checkpoint_dir)
                    if all(self.shard(step_of(d), r).exists() for r in range(self.context.world_size))]
        newest = max(complete, default=None)
        if newest is not None and (pointed is None or newest > pointed):
            print(f"latest names step {pointed}, but every shard of step {newest} is in place: "
                  f"restoring step {newest}", file=sys.stderr)
            return newest
        return pointed

    def load(self, workload: Workload) -> None:
        step = self.step_to_restore()
        if step is not None:
            workload.load_state_dict(torch.load(self.shard(step), weights_only=True))
        dist.barrier()


class RankStampedPerRank(PerRankSave):
    """Correct against a misplaced file: every per-rank file records the rank that wrote it, and
    restore refuses a file another rank wrote."""

    def file_content(self, workload: Workload) -> dict:
        return {**super().file_content(workload), "saved_by_rank": self.context.rank}

    def restore_from(self, path: Path, workload: Workload) -> None:
        state = torch.load(path, weights_only=True)
        self.check_owner(path, state.pop("saved_by_rank", None))
        for key in (STAMP_KEY, CHECK_LOSS_KEY):
            state.pop(key, None)
        workload.load_state_dict(state)

    def check_owner(self, path: Path, owner: Any) -> None:
        if owner != self.context.rank:
            raise RuntimeError(f"{path.name} was written by rank {owner}; this is rank {self.context.rank}")


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


class SwallowsEnospc(AtomicFallbackSave):
    """A save that logs a failed write and carries on ("a checkpoint is not worth a crash"): the
    job reports the step saved, and the restore, which falls back to the newest complete step,
    silently loses every step since."""

    def save(self, workload: Workload, step: int) -> None:
        try:
            self.write(workload, step)
        except Exception as exc:  # noqa: BLE001 -- the bug: an ENOSPC (or any write error) is only logged
            print(f"warning: checkpoint of step {step} failed, continuing: {exc}", file=sys.stderr)
        dist.barrier()


class PointerBeforeDurableShards(DurableShardsThenPointer):
    """Broken under power loss: each rank writes its shard with a plain ``torch.save`` (never
    fsynced), then rank 0 publishes the step in ``latest`` the careful way (temp file, fsync,
    rename, directory fsync). The pointer is durable before the shards it names; restore follows it."""

    def write_shard(self, workload: Workload, path: Path) -> None:
        torch.save(workload.state_dict(), path)

    def step_to_restore(self) -> int | None:
        return self.pointed_step()


# -- restore trusts what it should check ---------------------------------------------------------


class IgnoresTornSave(PerRankSave):
    """A newest checkpoint that fails to load is swallowed and the job 'resumes' from scratch,
    claiming success."""

    def load(self, workload: Workload) -> None:
        try:
            super().load(workload)
        except Exception:  # noqa: BLE001 -- the bug
            dist.barrier()


class FollowsStalePointer(DurableShardsThenPointer):
    """Durable shards and pointer, but restore follows ``latest`` blindly: a pointer update lost (or
    a pointer copied back from an old backup) silently drops the newer complete checkpoints."""

    def step_to_restore(self) -> int | None:
        return self.pointed_step()


class IgnoresNewerVersion(PerRankSave):
    """Checks the format stamp only against older formats (the upgrade path someone thought of): a
    checkpoint written by a newer release, whose fields may mean something else, loads without a word."""

    def restore_from(self, path: Path, workload: Workload) -> None:
        state = torch.load(path, weights_only=True)
        stamp = state.pop(STAMP_KEY, {})
        if stamp.get("format", FORMAT_VERSION) < FORMAT_VERSION:
            raise RuntimeError(f"{path.name}: format {stamp.get('format')} is too old for this reader")
        state.pop(CHECK_LOSS_KEY, None)
        workload.load_state_dict(state)


class AcceptsForeignShard(RankStampedPerRank):
    """Records which rank wrote each file but never compares it at restore: a shard copied over
    another rank's (a bad rsync, a wrong index in a copy script) loads as that rank's."""

    def check_owner(self, path: Path, owner: Any) -> None:
        pass  # the bug: the recorded owner is never compared with this rank


class UnpicklesInFull(PerRankSave):
    """Loads its files with ``torch.load(weights_only=False)`` (what older code and DeepSpeed do): a
    checkpoint file from a shared bucket or a model hub runs code in the rank that loads it."""

    def restore_from(self, path: Path, workload: Workload) -> None:
        state = torch.load(path, weights_only=False)  # the bug: full unpickling
        for key in (STAMP_KEY, CHECK_LOSS_KEY):
            state.pop(key, None)
        workload.load_state_dict(state)


class WaitsOnStaleLock(PerRankSave):
    """Each rank holds ``step_N/.lock_rank_<r>`` while it writes, and restore waits until the newest
    step directory holds no lock (so it never reads a file being written). A rank killed mid-write
    leaves its lock behind, and the restarted job waits for it forever."""

    def save(self, workload: Workload, step: int) -> None:
        lock = step_dir(self.context.checkpoint_dir, step) / f".lock_rank_{self.context.rank}"
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.touch()
        torch.save(self.file_content(workload), self.file_path(step))
        lock.unlink()
        dist.barrier()

    def load(self, workload: Workload) -> None:
        directory = newest_step_dir(self.context.checkpoint_dir)
        while directory is not None and any(directory.glob(".lock_rank_*")):
            time.sleep(0.1)  # the bug: no deadline, no owner check
        super().load(workload)


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
        for target, piece in zip(whole.tensor_split(world), slices):
            count = min(target.numel(), piece.numel())
            target[:count] = piece[:count]
        return whole.reshape(template.shape)
    if isinstance(template, dict):
        return {key: _rebuild(item, [s[key] for s in slices], world) for key, item in template.items()}
    if isinstance(template, (list, tuple)):
        return type(template)(_rebuild(item, [s[i] for s in slices], world) for i, item in enumerate(template))
    return slices[0]
