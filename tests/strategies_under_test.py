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


def _fsync_directory(path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class PointerBeforeDurableShards(CheckpointStrategy):
    """Broken under power loss: each rank writes its shard with a plain ``torch.save`` (never
    fsynced), then rank 0 publishes the step in ``latest`` the careful way (temp file, fsync,
    rename, directory fsync). The pointer is durable before the shards it names; restore follows it."""

    def save(self, workload, step):
        root = self.context.checkpoint_dir
        directory = step_dir(root, step)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(workload.state_dict(), directory / f"shard_{self.context.rank}.pt")
        dist.barrier()
        if self.context.rank == 0:
            staging = root / "latest.tmp"
            with open(staging, "w") as f:
                f.write(str(step))
                f.flush()
                os.fsync(f.fileno())
            os.replace(staging, root / "latest")
            _fsync_directory(root)
        dist.barrier()

    def load(self, workload):
        root = self.context.checkpoint_dir
        pointer = root / "latest"
        if pointer.exists():
            directory = step_dir(root, int(pointer.read_text()))
            workload.load_state_dict(torch.load(directory / f"shard_{self.context.rank}.pt", weights_only=True))
        dist.barrier()


class DurableShardsThenPointer(PointerBeforeDurableShards):
    """Correct under power loss: every shard is written to a temp name, fsynced, renamed, and its
    directory fsynced (the new step directory's entry in the root too) before rank 0 publishes
    ``latest`` the same way."""

    def save(self, workload, step):
        root = self.context.checkpoint_dir
        directory = step_dir(root, step)
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / f"shard_{self.context.rank}.pt"
        staging = final.with_suffix(".tmp")
        with open(staging, "wb") as f:
            torch.save(workload.state_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging, final)
        _fsync_directory(directory)
        _fsync_directory(root)
        dist.barrier()
        if self.context.rank == 0:
            staging = root / "latest.tmp"
            with open(staging, "w") as f:
                f.write(str(step))
                f.flush()
                os.fsync(f.fileno())
            os.replace(staging, root / "latest")
            _fsync_directory(root)
        dist.barrier()


class DcpPerStep(CheckpointStrategy):
    """torch.distributed.checkpoint as a training script uses it: every rank calls ``dcp.save`` of
    the model, optimizer, scheduler and progress into ``step_N/``; restore takes the newest step
    directory that has DCP's ``.metadata`` (written last, through a temp file and a rename)."""

    def _state(self, workload) -> dict:
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        return {"model": get_model_state_dict(workload.model),
                "optimizer": get_optimizer_state_dict(workload.model, workload.optimizer),
                "scheduler": workload.scheduler.state_dict(), "progress": workload.progress_state()}

    def save(self, workload, step):
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(workload), checkpoint_id=str(step_dir(self.context.checkpoint_dir, step)))

    def load(self, workload):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        root = self.context.checkpoint_dir
        complete = sorted(p for p in root.iterdir() if (p / ".metadata").exists()) if root.is_dir() else []
        if complete:
            state = self._state(workload)
            dcp.load(state, checkpoint_id=str(complete[-1]))
            set_model_state_dict(workload.model, state["model"])
            set_optimizer_state_dict(workload.model, workload.optimizer, state["optimizer"])
            workload.scheduler.load_state_dict(state["scheduler"])
            workload.load_progress_state(state["progress"])
        dist.barrier()


class PlantsSymlinkOut(PerRankSave):
    """Leaves a symlink among its files that points outside the checkpoint directory (option
    ``link_to``), as a careless library or a hostile plug-in might: a fault that damages whatever
    ``file`` matches must refuse to follow it."""

    options = (*PerRankSave.options, "link_to")

    def save(self, workload, step):
        super().save(workload, step)
        if self.context.rank == 0:
            os.symlink(self.context.options["link_to"], step_dir(self.context.checkpoint_dir, step) / "escape.pt")
