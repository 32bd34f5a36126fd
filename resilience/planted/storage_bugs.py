"""Planted bugs in how checkpoint files are committed and read back: a write error swallowed, a
pointer made durable before its shards, a torn file accepted, a stale pointer followed, a newer
format, another rank's shard or a hostile pickle loaded, a lock a killed writer left, a file
rendezvous without a deadline.

Each is modelled on a failure mode seen in real training code and written against the public
contract only; ``resilience.planted.catalogue`` names the case that must catch each one.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..strategies.torch.native import CHECK_LOSS_KEY, FORMAT_VERSION, STAMP_KEY, PerRankSave, newest_step_dir, step_dir
from ..workloads.base import Workload
from .durable import AtomicFallbackSave, DurableShardsThenPointer, RankStampedPerRank

# -- save is wrong ------------------------------------------------------------------------------


class SwallowsEnospc(AtomicFallbackSave):
    """A save that logs a failed write and carries on ("a checkpoint is not worth a crash"): the
    job reports the step saved, and the restore, which falls back to the newest complete step,
    silently loses every step since."""

    def save(self, workload: Workload, step: int) -> None:
        try:
            self.write(workload, step)
        except Exception as exc:  # the bug: an ENOSPC (or any write error) is only logged
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
        except Exception:  # the bug
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


class PollsForPeersForever(PerRankSave):
    """A save that commits once every rank's file exists, found by polling the directory with no
    deadline instead of a collective (a file rendezvous, as a writer's queue join without a
    timeout is): a peer that stops answering leaves the job waiting forever."""

    def save(self, workload: Workload, step: int) -> None:
        path = self.file_path(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.file_content(workload), path)
        while len(list(path.parent.glob("ckpt_rank_*.pt"))) < self.context.world_size:
            time.sleep(0.05)  # the bug: no deadline

