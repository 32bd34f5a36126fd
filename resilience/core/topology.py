"""Where each rank sits: world = TP x PP x DP, ranks placed on nodes, storage shared or node-local.

Pure data and arithmetic (no torch, no IO), so the fast fuzzing tier can evaluate thousands of
rank maps per second with exactly the code the rank processes run.

Ranks are numbered as Megatron-LM numbers them (order tp-dp-pp): the tensor-parallel rank varies
fastest, then the data-parallel rank, then the pipeline stage. Ranks fill nodes in blocks of
``ranks_per_node`` as torchrun and SLURM place them; ``node_ids`` names the physical node that
holds each block, so a restart on a permuted or partly replaced set of nodes is a different
``node_ids`` with the same arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SHARED, NODE_LOCAL = "shared", "node_local"
STORAGE_KINDS = (SHARED, NODE_LOCAL)


@dataclass(frozen=True)
class RankCoords:
    tp: int
    pp: int
    dp: int


@dataclass(frozen=True)
class Topology:
    tp: int
    pp: int
    dp: int
    node_ids: tuple[int, ...]  # node_ids[block] = the physical node running ranks of that block
    storage: str = SHARED  # "node_local": each physical node sees only its own checkpoint directory

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    @classmethod
    def single_node(cls, world_size: int) -> "Topology":
        """Pure data parallelism on one node with shared storage: what a case without `topology` runs."""
        return cls(tp=1, pp=1, dp=world_size, node_ids=(0,))

    def problem(self) -> str | None:
        if min(self.tp, self.pp, self.dp) < 1:
            return f"parallel degrees must be >= 1 (tp={self.tp}, pp={self.pp}, dp={self.dp})"
        if not self.node_ids or self.world_size % len(self.node_ids):
            return f"{len(self.node_ids)} nodes cannot hold {self.world_size} ranks in equal blocks"
        if len(set(self.node_ids)) != len(self.node_ids) or min(self.node_ids) < 0:
            return f"node ids must be distinct non-negative integers, not {list(self.node_ids)}"
        if self.storage not in STORAGE_KINDS:
            return f"storage must be one of {', '.join(STORAGE_KINDS)}, not {self.storage!r}"
        return None

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def nodes(self) -> int:
        return len(self.node_ids)

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nodes

    @property
    def parallel(self) -> tuple[int, int, int]:
        """What the numerics depend on; placement and storage change only who sees which files."""
        return self.tp, self.pp, self.dp

    def coords(self, rank: int) -> RankCoords:
        return RankCoords(tp=rank % self.tp, dp=(rank // self.tp) % self.dp, pp=rank // (self.tp * self.dp))

    def rank_of(self, coords: RankCoords) -> int:
        return coords.tp + self.tp * (coords.dp + self.dp * coords.pp)

    def node_of(self, rank: int) -> int:
        """The physical node that runs ``rank``."""
        return self.node_ids[rank // self.ranks_per_node]

    def local_rank(self, rank: int) -> int:
        return rank % self.ranks_per_node

    def tensor_groups(self) -> list[tuple[int, ...]]:
        """Ranks that split the same layers (same pp and dp), in the order every rank creates them."""
        return [tuple(self.rank_of(RankCoords(t, p, d)) for t in range(self.tp))
                for p in range(self.pp) for d in range(self.dp)]

    def data_groups(self) -> list[tuple[int, ...]]:
        """Ranks that hold the same shard and average their gradients (same tp and pp)."""
        return [tuple(self.rank_of(RankCoords(t, p, d)) for d in range(self.dp))
                for p in range(self.pp) for t in range(self.tp)]

    def pipeline_groups(self) -> list[tuple[int, ...]]:
        """Ranks that hold consecutive stages of one model replica shard (same tp and dp)."""
        return [tuple(self.rank_of(RankCoords(t, p, d)) for p in range(self.pp))
                for d in range(self.dp) for t in range(self.tp)]

    def storage_subdir(self, rank: int) -> str:
        """Where ``rank``'s checkpoint directory is under the root: "" (shared) or its node's own."""
        return "" if self.storage == SHARED else f"node{self.node_of(rank)}"

    def storage_dir(self, root: Path, rank: int) -> Path:
        """The checkpoint directory ``rank`` sees: the shared one, or its physical node's own."""
        return Path(root) / self.storage_subdir(rank)

    def describe(self) -> str:
        return (f"tp={self.tp} pp={self.pp} dp={self.dp} on nodes {list(self.node_ids)} "
                f"({self.ranks_per_node} ranks each, {self.storage} storage)")

    def as_dict(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "node_ids": list(self.node_ids),
                "storage": self.storage}

    @classmethod
    def from_dict(cls, data: dict) -> "Topology":
        return cls(tp=data["tp"], pp=data["pp"], dp=data["dp"], node_ids=tuple(data["node_ids"]),
                   storage=data["storage"])
