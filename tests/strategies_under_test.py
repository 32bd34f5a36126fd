"""Strategies written against the public contract, as a user would: deliberately broken ones (the
checker must catch each) and correct ones. Most live in the planted-bug catalogue
(`resilience.planted`), which the tests reach under this module's name too."""
from __future__ import annotations

import copy
import logging
import os
import time

import torch
import torch.distributed as dist

from resilience.planted.async_bugs import SwallowsWriterError
from resilience.planted.durable import (  # noqa: F401 -- the two correct twins re-exported for the tests' targets
    AtomicFallbackSave,
    DurableShardsThenPointer,
    fsync_directory,
    write_durably,
)
from resilience.planted.state_bugs import (  # noqa: F401 -- re-exported for the tests' targets
    ForgetsOptimizer,
    LoadsByLocalRank,
    LoadsOldest,
    RankZeroFileEverywhere,
    SaveConsumesRandomness,
)
from resilience.planted.storage_bugs import (  # noqa: F401 -- re-exported for the tests' targets
    IgnoresTornSave,
    PointerBeforeDurableShards,
    UnpicklesInFull,
)
from resilience.strategies.base import CheckpointStrategy
from resilience.strategies.torch.native import CHECK_LOSS_KEY, STAMP_KEY, PerRankSave, RankZeroSave, step_dir
from resilience.strategies.torchtitan.strategy import TorchtitanCheckpoint


class StallsOnLoad(PerRankSave):
    """Rank 1 never finishes its restore; rank 0 waits at the barrier: nobody fails, nothing moves."""

    def load(self, workload):
        if self.context.rank == 1:
            time.sleep(3600)
        super().load(workload)


class DurableWithoutFallback(PerRankSave):
    """Every per-rank file durable (temp name, fsync, rename, both directories fsynced) before the
    barrier; the restore takes the newest step directory and refuses it when a file is missing or
    torn, never trying the older complete step."""

    def save(self, workload, step):
        path = self.file_path(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(path, lambda file: torch.save(self.file_content(workload), file))
        fsync_directory(path.parent.parent)
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


_FIRST_LOADED: dict | None = None  # module global: outlives one restore in a process that runs several


class CachesFirstLoad(RankZeroSave):
    """Broken in a reused process: it says it keeps nothing between loads (``warm_restores``), but
    keeps the state of its first load in a module global and restores that one ever after,
    whatever the disk holds. Fresh ranks never notice; the explorer's canary must."""

    warm_restores = True

    def restore_from(self, path, workload) -> None:
        global _FIRST_LOADED
        if _FIRST_LOADED is None:
            state = torch.load(path, weights_only=True)
            _FIRST_LOADED = {key: value for key, value in state.items() if key not in (STAMP_KEY, CHECK_LOSS_KEY)}
        workload.load_state_dict(copy.deepcopy(_FIRST_LOADED))


class LogsWriterError(SwallowsWriterError):
    """`SwallowsWriterError` whose failed background write is logged at error level (the job still
    goes on and exits 0): its log says the save failed."""

    def commit(self) -> None:
        if self.pending is None:
            return
        pending, step = self.pending, self.pending_step
        self.pending = self.pending_step = None
        failure = pending.exception(timeout=60)
        if failure is not None:
            logging.basicConfig()
            logging.getLogger("checkpoint").error("background checkpoint of step %d failed: %r", step, failure)


class TitanExcludesDataloader(TorchtitanCheckpoint):
    """torchtitan's manager told not to load the dataloader (its own ``exclude_from_loading``): the
    restart reads its data from the start again while the step count goes on."""

    def train(self, workload, observer) -> None:
        build = self.workload.manager
        self.workload.manager = lambda base, **config: build(base, exclude_from_loading=["dataloader"], **config)
        super().train(workload, observer)
