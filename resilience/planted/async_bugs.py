"""Planted bugs of checkpoints written in the background or published early: a writer's failure
that never reaches the job, and a completion marker that names a step whose shards are not all
there.

Each is modelled on a failure mode seen in real training code and written against the public
contract only; ``resilience.planted.catalogue`` names the case that must catch each one.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ..core.capabilities import Capability
from ..strategies.torch.dcp import DcpCheckpoint, job_timeout
from ..strategies.torch.dcp import step_dir as dcp_step_dir
from ..strategies.torch.native import step_dir
from ..workloads.base import Workload
from .durable import DurableShardsThenPointer, write_durably


class SwallowsWriterError(DcpCheckpoint):
    """DCP ``async_save`` whose future is awaited with ``future.exception()`` and whose failure is
    only logged ("the next save will do"; DCP's ``CheckpointException`` is a ``BaseException``, so
    the usual ``except Exception`` would not even have swallowed it): an exception in the background
    writer thread leaves the job believing the step saved, and the restart silently resumes from an
    older one."""

    def __init__(self, context):
        super().__init__(context)
        self.mode = "async"

    @classmethod
    def capabilities_for(cls, options):
        return cls.capabilities  # async whatever the options say

    def commit(self) -> None:
        if self.pending is None:
            return
        pending, step = self.pending, self.pending_step
        self.pending = self.pending_step = None
        failure = pending.exception(timeout=job_timeout().total_seconds())  # waits, never raises what it holds
        if failure is not None:  # the bug: a failed background write is only logged
            print(f"warning: background checkpoint of step {step} failed, continuing: {failure!r}", file=sys.stderr)


class PointerBeforeEveryShard(DurableShardsThenPointer):
    """Rank 0 publishes ``latest`` as soon as its own shard is durable, without waiting for the
    other ranks' (a completion marker that can name a step with a missing shard); restore follows
    the pointer and refuses the step when a shard is missing, loudly, never trying the older
    complete step beside it. Loud, but the job is down while a good checkpoint sits unused."""

    capabilities = DurableShardsThenPointer.capabilities | {Capability.CHOSEN_STEP}

    def save(self, workload: Workload, step: int) -> None:
        root = self.context.checkpoint_dir
        step_dir(root, step).mkdir(parents=True, exist_ok=True)
        self.write_shard(workload, self.shard(step))
        if self.context.rank == 0:  # the bug: no barrier before the pointer
            write_durably(root / "latest", lambda file: file.write(step_dir(root, step).name.encode()))
        dist.barrier()

    def step_to_restore(self) -> int | None:
        return self.pointed_step()

    def step_location(self, step: int) -> Path:
        return step_dir(self.context.checkpoint_dir, step)

    def load_step(self, workload: Workload, step: int) -> None:
        workload.load_state_dict(torch.load(self.shard(step), weights_only=True))
        dist.barrier()


class PointsAtUncommittedSave(DcpCheckpoint):
    """Overlapping DCP async saves with a ``latest`` pointer written when ``save`` returns (the
    state staged, not written): restore follows the pointer into a step whose write never
    finished, and refuses it, loudly, beside an older committed step it never tries."""

    capabilities = DcpCheckpoint.capabilities | {Capability.CHOSEN_STEP}

    def __init__(self, context):
        super().__init__(context)
        self.mode, self.overlap = "async", True

    @classmethod
    def capabilities_for(cls, options):
        return cls.capabilities  # async whatever the options say

    def save(self, workload: Workload, step: int) -> None:
        super().save(workload, step)
        if self.context.rank == 0:  # the bug: the pointer moves before the write is committed
            write_durably(self.context.checkpoint_dir / "latest", lambda file: file.write(str(step).encode()))

    def load(self, workload: Workload) -> None:
        pointer = self.context.checkpoint_dir / "latest"
        if pointer.exists():
            self.load_step(workload, int(pointer.read_text()))

    def step_location(self, step: int) -> Path:
        return dcp_step_dir(self.context.checkpoint_dir, step)

    def load_step(self, workload: Workload, step: int) -> None:
        import torch.distributed.checkpoint as dcp

        state = self.workload.sharded_state()
        dcp.load(state, storage_reader=self._reader(self.step_location(step)))
        self.workload.load_sharded_state(state)
