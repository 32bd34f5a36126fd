"""torch.distributed.checkpoint (DCP) as the system under test, over a model sharded with FSDP2.

The model is wrapped with ``fully_shard`` on a CPU device mesh (gloo); every rank holds a dim-0
shard of each parameter and of its Adam moments. A checkpoint is what the DCP tutorial does:
``get_state_dict(model, optimizer)`` (sharded DTensors) plus the scheduler and the workload's
progress (step, data position, randomness), written with ``dcp.save`` and read back in place with
``dcp.load`` then ``set_state_dict``. DCP reshards on load, so a restart may use another world size.

Layout: ``<dir>/step_<NNNNNNNN>/`` holding each rank's ``__<rank>_0.distcp`` and the coordinator's
``.metadata``. DCP keeps no pointer to the newest checkpoint; this strategy restores the newest step
directory whose ``.metadata`` exists. DCP writes ``.metadata`` last, on rank 0, after every rank
reported its data files written, through ``.metadata.tmp`` and a rename: a directory with it is
complete, one without it is the remains of a save that never finished.

Options: ``mode: sync`` (``dcp.save``) or ``async`` (``dcp.async_save`` on a process group of its
own, with a background thread writing; ``save`` returns once the state is staged, after waiting for
the previous save to be committed, and the job's last save is committed when training ends;
with ``overlap: true`` it does not wait: every save's future is kept, as a job that calls
``async_save`` each step without awaiting the last one does, so several saves can be in flight,
each on a process group of its own, and training's end waits for all of them), and
``storage: filesystem`` (``FileSystemWriter``/``FileSystemReader``) or ``fsspec``
(``FsspecWriter``/``FsspecReader`` on a ``file://`` URL, or, with ``object_store: s3``, on the
case's ``s3://`` URL through s3fs, whose rename is a server-side copy then a delete), or, with
``object_store: s3`` only, ``s3torchconnector`` (its ``S3StorageWriter``/``S3StorageReader``).
``async_group: own | default``: the group an async save's background thread runs its collectives
on, a gloo group of its own (default, as torchtitan makes one) or the default group that training
and the harness also use (``async_save`` without ``process_group``, as its documentation's
example calls it). ``replicate: R`` trains with hybrid sharding (HSDP): a 2-D mesh of R replica groups, each sharding
over ``world_size / R`` ranks (every world size of the case must be a multiple of R).
"""
from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from ...core.capabilities import Capability
from ...workloads.base import TrainableWorkload, Workload
from ...workloads.options import OPTION_NAMES
from ..base import CheckpointStrategy, StrategyContext
from .dcp_objects import (
    METADATA,
    STEP_DIR,
    committed_steps_at,
    missing_client,
    object_reader,
    object_storage_problem,
    object_writer,
    part_size_problem,
)
from .fsdp_workload import FsdpTrainedWorkload

MODES = ("sync", "async")
ASYNC_GROUPS = ("own", "default")  # the async writer's collectives: a gloo group of its own, or training's
STORAGES = ("filesystem", "fsspec", "s3torchconnector")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def committed_steps(root: Path) -> list[int]:
    """Steps whose directory holds DCP's ``.metadata``, newest first."""
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and (p / METADATA).is_file()]
    return sorted(steps, reverse=True)


def job_timeout() -> timedelta:
    """The timeout the job's default process group was created with (a new group would get torch's
    30-minute default instead)."""
    default = dist.distributed_c10d._get_default_group()
    return default._get_backend(torch.device("cpu")).options._timeout


class DcpCheckpoint(CheckpointStrategy):
    """``dcp.save`` (or ``dcp.async_save``) of the FSDP2-sharded state into ``step_<N>/`` on every
    rank after a checkpoint step; at restart, ``dcp.load`` of the newest step directory whose
    ``.metadata`` exists (rank 0 chooses, every rank loads the same), at any world size.

    Every rank calls every method, together (each is collective): ``prepare`` once per process,
    ``save`` per checkpoint step, ``load`` once at restart, ``finish`` after the last step. In async
    mode ``save(N)`` first waits for the previous save's future (committing it), stages step N and
    returns while a background thread writes it; ``finish`` waits for the last one. With
    ``overlap: true``, ``save(N)`` never waits (several saves in flight) and ``finish`` waits for all.
    """

    warm_restores = True  # keeps nothing between loads: restored in warm ranks
    options = ("mode", "storage", "overlap", "part_size", "replicate", "async_group")
    option_values: ClassVar[Mapping[str, tuple[Any, ...] | type]] = {"mode": MODES, "storage": STORAGES,
                                                                     "overlap": (False, True), "replicate": int,
                                                                     "async_group": ASYNC_GROUPS}
    capabilities = frozenset({Capability.IN_FLIGHT_STEPS})

    @classmethod
    def capabilities_for(cls, options: Mapping[str, Any]) -> frozenset[Capability]:
        """In sync mode no save is ever in flight: nothing to report."""
        if options.get("mode", "sync") == "async":
            return cls.capabilities
        return cls.capabilities - {Capability.IN_FLIGHT_STEPS}

    def __init__(self, context: StrategyContext):
        super().__init__(context)
        self.mode = context.options.get("mode", "sync")  # validated by the loader
        self.storage = context.options.get("storage", "filesystem")
        self.workload: FsdpTrainedWorkload | None = None
        self.async_group = None
        self.pending = None  # the upload future of the last async save, until it is committed
        self.pending_step: int | None = None
        self.overlap = bool(context.options.get("overlap", False))
        self.in_flight: list[tuple[int, Any]] = []  # overlap: (step, future) of every save not yet awaited

    @classmethod
    def workload_options(cls, options: Mapping[str, Any]) -> frozenset[str] | None:
        """The FSDP2 step casts nothing (FSDP2 has a mixed-precision policy of its own): every
        option but ``amp``."""
        return frozenset(OPTION_NAMES) - {"amp"}

    @classmethod
    def trainer(cls, options: Mapping[str, Any]) -> str:
        return "fsdp2"

    def prepare(self, workload: Workload) -> Workload:
        if not isinstance(workload, TrainableWorkload):
            raise TypeError(f"FSDP2 trains a TrainableWorkload; {type(workload).__name__} is not one")
        self.workload = FsdpTrainedWorkload(workload, int(self.context.options.get("replicate", 1)))
        if self.mode == "async" and self.context.options.get("async_group", "own") == "own":
            # a background thread's collectives must not interleave with training's on one group
            self.async_group = dist.new_group(backend="gloo", timeout=job_timeout())
        return self.workload

    check_options = staticmethod(part_size_problem)
    check_object_store = staticmethod(object_storage_problem)

    @classmethod
    def missing_for(cls, options: Mapping[str, Any]) -> str | None:
        return missing_client(options) or cls.missing()

    def _location(self, step: int) -> Path | str:
        if self.context.checkpoint_url:
            return f"{self.context.checkpoint_url}/step_{step:08d}"
        return step_dir(self.context.checkpoint_dir, step)

    def _writer(self, path: Path | str):
        import torch.distributed.checkpoint as dcp

        if isinstance(path, str):
            return object_writer(path, self.storage, self.context.options)
        if self.storage == "fsspec":
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

            return FsspecWriter(f"file://{path}")
        return dcp.FileSystemWriter(str(path))

    def _reader(self, path: Path | str):
        import torch.distributed.checkpoint as dcp

        if isinstance(path, str):
            return object_reader(path, self.storage)
        if self.storage == "fsspec":
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

            return FsspecReader(f"file://{path}")
        return dcp.FileSystemReader(str(path))

    def save(self, workload: Workload, step: int) -> None:
        import torch.distributed.checkpoint as dcp

        path = self._location(step)
        state = self.workload.sharded_state()
        if self.mode == "sync":
            dcp.save(state, storage_writer=self._writer(path))
            return
        if self.overlap:
            # a group per save: async_save starts a new writer thread per call (torch 2.13
            # state_dict_saver.py:343), so saves in flight on one group interleave their collectives
            group = dist.new_group(backend="gloo", timeout=job_timeout())
            future = dcp.async_save(state, storage_writer=self._writer(path), process_group=group)
            self.in_flight.append((step, future))
            return
        self.commit()
        self.pending = dcp.async_save(state, storage_writer=self._writer(path), process_group=self.async_group)
        self.pending_step = step

    def in_flight_steps(self) -> list[int]:
        """Steps whose async save was started and has not finished writing (overlap or not)."""
        pending = list(self.in_flight) + ([(self.pending_step, self.pending)] if self.pending is not None else [])
        return sorted(step for step, future in pending if not future.done())

    def commit(self) -> None:
        """Wait for the last async save to be written, within the job's collective timeout."""
        if self.pending is None:
            return
        pending, step = self.pending, self.pending_step
        self.pending = self.pending_step = None
        try:
            pending.result(timeout=job_timeout().total_seconds())
        except concurrent.futures.TimeoutError as exc:  # not the builtin one before Python 3.11
            raise TimeoutError(f"the async DCP save of step {step} was not written within "
                               f"{job_timeout().total_seconds():g} s") from exc

    def finish(self, workload: Workload) -> None:
        while self.in_flight:  # overlap: every save, oldest first
            self.pending_step, self.pending = self.in_flight.pop(0)
            self.commit()
        self.commit()

    def load(self, workload: Workload) -> None:
        import torch.distributed.checkpoint as dcp

        url = self.context.checkpoint_url
        newest = (committed_steps_at(url) if url else committed_steps(self.context.checkpoint_dir))[:1]
        chosen = [newest if self.context.rank == 0 else None]
        dist.broadcast_object_list(chosen, src=0)  # every rank loads what rank 0 saw
        if not chosen[0]:
            return  # no complete checkpoint: training starts over
        state = self.workload.sharded_state()
        dcp.load(state, storage_reader=self._reader(self._location(chosen[0][0])))
        self.workload.load_sharded_state(state)
