"""Strategies written against the public contract, as a user would: deliberately broken ones (the
checker must catch each) and one correct one that falls back past a torn checkpoint."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from resilience.strategies.base import CheckpointStrategy
from resilience.strategies.torch_native import PerRankSave, newest_step_dir, step_dir


class ForgetsOptimizer(PerRankSave):
    """Restores everything except the Adam moments: training resumes with a cold optimizer."""

    def load(self, workload):
        directory = newest_step_dir(self.context.checkpoint_dir)
        state = torch.load(directory / f"ckpt_rank_{self.context.rank}.pt", weights_only=True)
        fresh = workload.state_dict()["optimizer"]
        workload.load_state_dict({**state, "optimizer": fresh})
        dist.barrier()


class RankZeroFileEverywhere(PerRankSave):
    """Every rank loads rank 0's file (the seed's warning: per-rank files must be loaded by rank)."""

    def load(self, workload):
        directory = newest_step_dir(self.context.checkpoint_dir)
        workload.load_state_dict(torch.load(directory / "ckpt_rank_0.pt", weights_only=True))
        dist.barrier()


class IgnoresTornSave(PerRankSave):
    """A torn newest checkpoint is swallowed and the job 'resumes' from scratch, claiming success."""

    def load(self, workload):
        try:
            super().load(workload)
        except Exception:
            dist.barrier()


class LoadsOldest(PerRankSave):
    """Restores the oldest checkpoint instead of the newest: a completed checkpoint is lost."""

    def load(self, workload):
        directories = sorted(p for p in self.context.checkpoint_dir.iterdir() if p.is_dir())
        path = directories[0] / f"ckpt_rank_{self.context.rank}.pt"
        workload.load_state_dict(torch.load(path, weights_only=True))
        dist.barrier()


class SaveConsumesRandomness(PerRankSave):
    """Saving draws from the training RNG (e.g. to pick a file name): training itself is disturbed."""

    def save(self, workload, step):
        torch.randn(1, generator=workload.rng)
        super().save(workload, step)


class StallsOnLoad(PerRankSave):
    """Rank 1 never finishes its restore; rank 0 waits at the barrier: nobody fails, nothing moves."""

    def load(self, workload):
        if self.context.rank == 1:
            time.sleep(3600)
        super().load(workload)


class AtomicFallbackSave(CheckpointStrategy):
    """Correct: write to a temp name, fsync, rename; restore the newest step every rank completed."""

    def save(self, workload, step):
        directory = step_dir(self.context.checkpoint_dir, step)
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / f"ckpt_rank_{self.context.rank}.pt"
        temp = final.with_suffix(".tmp")
        with open(temp, "wb") as f:
            torch.save(workload.state_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
        dist.barrier()

    def load(self, workload):
        root = self.context.checkpoint_dir
        for directory in sorted((p for p in root.iterdir() if p.is_dir()), reverse=True):
            files = [directory / f"ckpt_rank_{r}.pt" for r in range(self.context.world_size)]
            if all(f.exists() for f in files):
                workload.load_state_dict(torch.load(files[self.context.rank], weights_only=True))
                break
        dist.barrier()


class LoadsByLocalRank(PerRankSave):
    """Saves ckpt_rank_<global rank>.pt and loads ckpt_rank_<LOCAL_RANK>.pt: right on one node only."""

    from resilience.fuzz.models import PerRankModel as _PerRankModel

    class restore_model(_PerRankModel):
        def file_for(self, restart, rank):
            return f"ckpt_rank_{restart.local_rank(rank)}.pt"

    def load(self, workload):
        from resilience.strategies.torch_native import load_checked, newest_step_dir

        directory = newest_step_dir(self.context.checkpoint_dir)
        if directory is not None:
            workload.load_state_dict(load_checked(directory / f"ckpt_rank_{self.context.local_rank}.pt", False))
        dist.barrier()
