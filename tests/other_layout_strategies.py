"""Strategies written outside the framework against the documented contract only
(`CheckpointStrategy`), with a file layout of their own that no catcher names: every rank saves
``ckpt-<step>/shard-of-<rank>.bin`` (a temp name, fsync, rename, the directory fsynced), then rank
0 publishes the directory's name in ``CURRENT`` the same way. ``OtherLayout`` is correct; each
subclass below it plants one bug."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from resilience.strategies.base import CheckpointStrategy

FORMAT_VERSION = 3
NAME = re.compile(r"ckpt-(\d+)")


def fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def publish(path: Path, write) -> None:
    temp = path.parent / f".{path.name}.partial"
    with open(temp, "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, path)
    fsync_dir(path.parent)


class OtherLayout(CheckpointStrategy):
    """Correct: each shard carries its format version, rank and world size, all checked at restore
    (with ``weights_only=True``); restore takes the step ``CURRENT`` names, or a newer one whose
    every shard is in place (a pointer update lost), saying so."""

    def directory(self, step: int) -> Path:
        return self.context.checkpoint_dir / f"ckpt-{step}"

    def shard(self, step: int, rank: int | None = None) -> Path:
        return self.directory(step) / f"shard-of-{self.context.rank if rank is None else rank}.bin"

    def save(self, workload, step: int) -> None:
        root = self.context.checkpoint_dir
        self.directory(step).mkdir(parents=True, exist_ok=True)
        blob = {"format_version": FORMAT_VERSION, "rank": self.context.rank, "world_size": self.context.world_size,
                "state": workload.state_dict()}
        publish(self.shard(step), lambda file: torch.save(blob, file))
        fsync_dir(root)
        dist.barrier()
        if self.context.rank == 0:
            publish(root / "CURRENT", lambda file: file.write(self.directory(step).name.encode()))
        dist.barrier()

    def pointed_step(self) -> int | None:
        pointer = self.context.checkpoint_dir / "CURRENT"
        if not pointer.exists():
            return None
        named = pointer.read_text().strip()
        match = NAME.fullmatch(named)
        if match is None:
            raise RuntimeError(f"CURRENT names {named!r}, not a checkpoint directory")
        return int(match.group(1))

    def complete_steps(self) -> list[int]:
        root = self.context.checkpoint_dir
        steps = [int(m.group(1)) for p in root.iterdir() if (m := NAME.fullmatch(p.name))] if root.is_dir() else []
        return sorted(s for s in steps if all(self.shard(s, r).exists() for r in range(self.context.world_size)))

    def step_to_restore(self) -> int | None:
        pointed = self.pointed_step()
        newest = max(self.complete_steps(), default=None)
        if newest is not None and (pointed is None or newest > pointed):
            print(f"CURRENT names step {pointed}, but step {newest} is complete: restoring it", file=sys.stderr)
            return newest
        return pointed

    def read_shard(self, step: int) -> dict:
        return torch.load(self.shard(step), weights_only=True)

    def check(self, blob: dict, step: int) -> None:
        if blob.get("format_version", 0) > FORMAT_VERSION:
            raise RuntimeError(f"{self.shard(step)}: format {blob.get('format_version')} is newer than "
                               f"this reader's {FORMAT_VERSION}")
        where = (blob.get("rank"), blob.get("world_size"))
        if where != (self.context.rank, self.context.world_size):
            raise RuntimeError(f"{self.shard(step)} was written by rank {where[0]} of {where[1]}, "
                               f"not rank {self.context.rank} of {self.context.world_size}")

    def load(self, workload) -> None:
        step = self.step_to_restore()
        if step is not None:
            blob = self.read_shard(step)
            self.check(blob, step)
            workload.load_state_dict(blob["state"])
        dist.barrier()


class TrustsCurrent(OtherLayout):
    """Follows ``CURRENT`` blindly: a lost pointer update silently drops a complete newer checkpoint."""

    def step_to_restore(self) -> int | None:
        return self.pointed_step()


class AnyShardWillDo(OtherLayout):
    """Never checks whose shard it loaded (a copy tool that mixed two names goes unseen)."""

    def check(self, blob: dict, step: int) -> None:
        if blob.get("format_version", 0) > FORMAT_VERSION:
            raise RuntimeError(f"format {blob['format_version']} is newer than {FORMAT_VERSION}")


class UnpicklesShards(OtherLayout):
    """Loads shards with full unpickling (``weights_only=False``): a hostile file runs code."""

    def read_shard(self, step: int) -> dict:
        return torch.load(self.shard(step), weights_only=False)


class IgnoresFormat(OtherLayout):
    """Checks the rank, never the format version: a newer writer's shard loads without a word."""

    def check(self, blob: dict, step: int) -> None:
        super().check({**blob, "format_version": 0}, step)


class KeepsThreeDropsOldest(OtherLayout):
    """Keeps the three newest checkpoints, but its clean-up sorts directory names as text. With
    three checkpoints or fewer it deletes nothing; from the fourth on it deletes the wrong one, and
    once the step numbers gain a digit (``ckpt-10`` sorts before ``ckpt-4``) the one it just wrote,
    which ``CURRENT`` names: the restore then fails."""

    def save(self, workload, step: int) -> None:
        super().save(workload, step)
        if self.context.rank == 0:
            names = sorted(p.name for p in self.context.checkpoint_dir.iterdir() if NAME.fullmatch(p.name))
            for name in names[:-3]:
                for file in (self.context.checkpoint_dir / name).iterdir():
                    file.unlink()
                (self.context.checkpoint_dir / name).rmdir()
        dist.barrier()
