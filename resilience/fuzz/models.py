"""Restore models: what each rank of a restart would read, computed without processes or files.

A model replays a strategy's placement decisions (which rank writes which file where, which file
a restarted rank opens, what it refuses) over a dictionary standing in for the disks, using the
same layout functions as the strategy itself (`Topology.storage_dir`, `megatron_layout`). The
fast fuzzing tier evaluates thousands of save/restore topology pairs per second with it; the
process tier runs the real strategy on the cases it picks and checks the model predicted the
verdict the real run gives.

What a rank holds is a `Holding`: its model shard (tensor and pipeline rank, out of how many) and
the noise stream it draws from. A restored rank is right when it holds what the restart topology
needs at its place; a shard of another split fails the strict shape check loudly.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..core.case import VerdictKind
from ..core.topology import Topology
from ..strategies.megatron.layout import TRACKER, checkpoint_path

ROOT = "/checkpoints"
STEP = 4  # the step of the checkpoint the model saves and restores


@dataclass(frozen=True)
class Holding:
    tp: int
    pp: int
    tp_size: int
    pp_size: int
    stream: int  # 0: the job's one noise stream; d + 1: data-parallel rank d's own (rank_rng distinct)

    @property
    def shard(self) -> tuple[int, int, int, int]:
        return self.tp, self.pp, self.tp_size, self.pp_size


def holding(topology: Topology, rank: int, distinct_streams: bool) -> Holding:
    c = topology.coords(rank)
    return Holding(tp=c.tp, pp=c.pp, tp_size=topology.tp, pp_size=topology.pp,
                   stream=c.dp + 1 if distinct_streams else 0)


@dataclass(frozen=True)
class RankRestore:
    """One rank's restore: ``loud`` (it raises, with why), ``fresh`` (starts from scratch), or the
    state it loads."""

    loud: str | None = None
    fresh: bool = False
    state: Holding | None = None


Disks = dict[str, object]  # absolute path -> what the file holds


class RestoreModel(ABC):
    """The placement logic of one strategy. Call order: ``writes`` for every rank of the save
    topology (the fuzzer fills `Disks`), then ``restore`` for every rank of the restart topology
    with the files its storage shows it."""

    def __init__(self, distinct_streams: bool = False, options: dict | None = None):
        self.distinct_streams, self.options = distinct_streams, dict(options or {})

    @abstractmethod
    def writes(self, save: Topology, rank: int) -> list[tuple[str, object]]:
        """The files ``rank`` writes (absolute paths under its storage) and what each holds."""

    @abstractmethod
    def restore(self, restart: Topology, rank: int, disks: Disks) -> RankRestore:
        """What ``rank`` of the restart does, seeing ``disks``."""

    def collective_mismatch(self, outcomes: list[RankRestore]) -> bool:
        """Whether the ranks' restores take different collective paths (some read a pointer and
        all-reduce, others do not): the job then fails at a collective."""
        return False


def storage(topology: Topology, rank: int) -> str:
    sub = topology.storage_subdir(rank)
    return f"{ROOT}/{sub}" if sub else ROOT


def under(path: str, directory: str) -> bool:
    return path.startswith(directory + "/")


def visible(disks: Disks, directory: str) -> Disks:
    return {p: v for p, v in disks.items() if under(p, directory)}


def saved(save: Topology, model: RestoreModel) -> Disks:
    """Every file the ranks of ``save`` write, on the disks each writes to."""
    disks: Disks = {}
    for rank in range(save.world_size):
        disks.update(model.writes(save, rank))
    return disks


def verdict(save: Topology, restart: Topology, model: RestoreModel,
            disks: Disks | None = None) -> tuple[VerdictKind, str]:
    """Save a checkpoint at ``save`` (or take ``disks``, what it saved), restore it at ``restart``,
    and judge as the harness does."""
    disks = saved(save, model) if disks is None else disks
    outcomes = [model.restore(restart, rank, visible(disks, storage(restart, rank)))
                for rank in range(restart.world_size)]
    loud = next(((r, o.loud) for r, o in enumerate(outcomes) if o.loud), None)
    if loud:
        return VerdictKind.LOUD, f"rank {loud[0]}: {loud[1]}"
    if model.collective_mismatch(outcomes):
        return VerdictKind.LOUD, "ranks took different collective paths at restore"
    fresh = [r for r, o in enumerate(outcomes) if o.fresh]
    if fresh:
        return VerdictKind.SILENT, (f"ranks {fresh} found no checkpoint and started from scratch"
                                    if len(fresh) < len(outcomes) else "no rank found the saved checkpoint")
    for rank, outcome in enumerate(outcomes):
        needed = holding(restart, rank, model.distinct_streams)
        got = outcome.state
        if (got.pp, got.tp_size, got.pp_size) != (needed.pp, needed.tp_size, needed.pp_size):
            # another stage holds other layers, another split other shapes: the strict load raises
            return VerdictKind.LOUD, f"rank {rank}: shard {got.shard} fails the strict load of {needed.shard}"
        if got.shard != needed.shard:
            return VerdictKind.SILENT, f"rank {rank} restored shard {got.shard}, needs {needed.shard}"
        if got.stream != needed.stream:
            return VerdictKind.SILENT, f"rank {rank} restored noise stream {got.stream}, needs {needed.stream}"
    return VerdictKind.RECOVERED, "every rank holds its own state"


def _step_dir(directory: str) -> str:
    return f"{directory}/step_{STEP:08d}"


class StepDirectoryModel(RestoreModel):
    """The torch schemes: files in ``step_N/``; at restore the newest step directory the rank's
    storage shows (none: start from scratch), then ``file_for`` in it (missing: loud)."""

    def file_for(self, restart: Topology, rank: int) -> str:
        raise NotImplementedError

    def restore(self, restart, rank, disks):
        step_dir = _step_dir(storage(restart, rank))
        if not any(under(p, step_dir) for p in disks):
            return RankRestore(fresh=True)
        path = f"{step_dir}/{self.file_for(restart, rank)}"
        if path not in disks:
            return RankRestore(loud=f"FileNotFoundError: {path}")
        return RankRestore(state=disks[path])


class PerRankModel(StepDirectoryModel):
    """torch.per_rank: ``step_N/ckpt_rank_<global rank>.pt`` from every rank, read back by rank."""

    def writes(self, save, rank):
        return [(f"{_step_dir(storage(save, rank))}/ckpt_rank_{rank}.pt", holding(save, rank, self.distinct_streams))]

    def file_for(self, restart, rank):
        return f"ckpt_rank_{rank}.pt"


class RankZeroModel(StepDirectoryModel):
    """torch.rank0: rank 0 writes ``step_N/model_optim.pt``; every rank loads it (rank 0's shard and
    noise stream, everywhere)."""

    def writes(self, save, rank):
        if rank:
            return []
        return [(f"{_step_dir(storage(save, 0))}/model_optim.pt", holding(save, 0, self.distinct_streams))]

    def file_for(self, restart, rank):
        return "model_optim.pt"


class MegatronModel(RestoreModel):
    """megatron: data-parallel rank 0 of each model-parallel group writes its ``mp_rank`` file,
    rank 0 the tracker; a rank without a tracker starts from random, one with it all-reduces the
    iteration (a collective the others skip), checks tp and pp, and takes RNG entry 0 or its own."""

    @property
    def random_init(self) -> bool:
        return bool(self.options.get("data_parallel_random_init", False))

    def writes(self, save, rank):
        directory = storage(save, rank)
        c = save.coords(rank)
        files: list[tuple[str, object]] = []
        if c.dp == 0:
            streams = ([holding(save, save.rank_of(type(c)(c.tp, c.pp, d)), self.distinct_streams).stream
                        for d in range(save.dp)] if self.random_init else
                       [holding(save, rank, self.distinct_streams).stream])
            files.append((f"{directory}/{checkpoint_path(STEP, c.tp, c.pp, save.pp)}",
                          (holding(save, rank, self.distinct_streams), tuple(streams))))
        if rank == 0:
            files.append((f"{directory}/{TRACKER}", STEP))
        return files

    def restore(self, restart, rank, disks):
        directory = storage(restart, rank)
        if f"{directory}/{TRACKER}" not in disks:
            return RankRestore(fresh=True)
        c = restart.coords(rank)
        path = f"{directory}/{checkpoint_path(STEP, c.tp, c.pp, restart.pp)}"
        if path not in disks:
            return RankRestore(loud=f"FileNotFoundError: {path}")
        saved, streams = disks[path]
        if (saved.tp_size, saved.pp_size) != (restart.tp, restart.pp):
            return RankRestore(loud="AssertionError: tensor/pipeline_model_parallel_size value from checkpoint")
        index = c.dp if self.random_init else 0
        if index >= len(streams):
            return RankRestore(loud="IndexError: list index out of range")
        return RankRestore(state=Holding(saved.tp, saved.pp, saved.tp_size, saved.pp_size, streams[index]))

    def collective_mismatch(self, outcomes):
        return len({o.fresh for o in outcomes}) > 1


MODELS: dict[str, type[RestoreModel]] = {
    "torch.per_rank": PerRankModel,
    "torch.rank0": RankZeroModel,
    "megatron": MegatronModel,
}


def model_for(strategy: str, distinct_streams: bool = False, options: dict | None = None) -> RestoreModel:
    """The restore model of a built-in strategy, or the ``restore_model`` class a strategy plug-in
    names; raises PluginError for a strategy without one (only the process tier can fuzz it)."""
    from ..core import registry
    from ..errors import PluginError

    cls = MODELS.get(strategy) or registry.resolve("strategy", strategy).restore_model
    if cls is None:
        raise PluginError(f"strategy {strategy!r} has no restore model; allowed for the fast tier: "
                          f"{', '.join(MODELS)} or a strategy class with a restore_model attribute")
    return cls(distinct_streams=distinct_streams, options=options)
