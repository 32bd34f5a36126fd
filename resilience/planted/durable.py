"""The correct twins of the planted bugs, and the durable-write helpers they and their broken
copies share: write through a temp name, fsync, rename, fsync the directory.

Written against the public contract (``CheckpointStrategy``) only, as a user's strategy would be;
``resilience.planted.catalogue`` names the case each twin must pass.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..strategies.base import CheckpointStrategy
from ..strategies.torch.native import CHECK_LOSS_KEY, STAMP_KEY, STEP_DIR, PerRankSave, step_dir, step_of
from ..workloads.base import Workload


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
    publishes ``latest`` (the step directory's name, as DeepSpeed names its tag) the same way.
    Restore takes the step ``latest`` names, or a newer step whose every shard is in place (a
    pointer update that never reached the disk), saying so."""

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
