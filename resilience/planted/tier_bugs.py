"""A planted bug of a checkpoint with two tiers: the node's memory, saved at every checkpoint step
and outliving the ranks (a flash checkpoint), and storage, written every ``storage_every`` steps.

``TwoTierSave`` is the correct twin: every rank restores the memory tier when every rank's memory
holds the same step, else every rank restores storage. ``LastRankFromStorage`` lets its last rank
read storage whenever storage holds the agreed step too: every rank's state is then a valid
checkpoint of the same step, and only the oracle's tier check (`resilience.oracle.rules.tier_findings`)
can tell. Written against the public contract only; ``resilience.planted.catalogue`` names the case
that must catch it.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import ClassVar

import torch
import torch.distributed as dist

from ..core.capabilities import Capability
from ..core.node_agents import SHARED_MEMORY, agent_dir, agent_name
from ..strategies.base import CheckpointStrategy
from ..workloads.base import Workload
from .durable import write_durably

MEMORY_FILE = re.compile(r"^rank_(\d+)\.step_(\d+)\.pt$")


class TwoTierSave(CheckpointStrategy):
    """Options: ``storage_every`` (a checkpoint step that is a multiple of it also goes to storage;
    default 8). The memory tier lives in the node's shared memory, named after the node's agent
    (`resilience.planted.memory_agent`), so a lost node loses it and a killed rank does not."""

    node_agent = "resilience.planted.memory_agent"
    options = ("storage_every",)
    option_values: ClassVar[dict] = {"storage_every": int}
    capabilities = frozenset({Capability.RESTORE_TIERS})

    def __init__(self, context):
        super().__init__(context)
        self.tier: str | None = None

    @property
    def memory(self) -> Path:
        root = self.context.node_agent_root
        return SHARED_MEMORY / f"{agent_name(agent_dir(root, self.context.node))}-tier"

    def save(self, workload: Workload, step: int) -> None:
        self.memory.mkdir(exist_ok=True)
        staged = self.memory / f".rank_{self.context.rank}.pt"
        torch.save(workload.state_dict(), staged)
        os.replace(staged, self.memory / f"rank_{self.context.rank}.step_{step}.pt")
        for older in self.memory.glob(f"rank_{self.context.rank}.step_*.pt"):
            if (match := MEMORY_FILE.match(older.name)) and int(match[2]) != step:
                older.unlink()
        if step % self.context.options.get("storage_every", 8) == 0:
            self.storage(step).parent.mkdir(parents=True, exist_ok=True)
            write_durably(self.storage(step), lambda file: torch.save(workload.state_dict(), file))
        dist.barrier()

    def storage(self, step: int) -> Path:
        """This rank's file of the step-``step`` checkpoint in storage."""
        return self.context.checkpoint_dir / f"step_{step:08d}" / f"rank_{self.context.rank}.pt"

    def memory_step(self) -> int:
        """The step this rank's memory holds (0: none)."""
        steps = [int(m[2]) for p in (self.memory.iterdir() if self.memory.is_dir() else ())
                 if (m := MEMORY_FILE.match(p.name)) and int(m[1]) == self.context.rank]
        return max(steps, default=0)

    def load(self, workload: Workload) -> None:
        step = self.memory_step()
        extremes = torch.tensor([step, -step])
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
        agreed = step if step and extremes[0] == -extremes[1] else 0
        if agreed and not self.reads_storage(agreed):
            path, self.tier = self.memory / f"rank_{self.context.rank}.step_{agreed}.pt", "memory"
        else:
            stored = sorted(self.context.checkpoint_dir.glob("step_*"))
            path, self.tier = (stored[-1] / f"rank_{self.context.rank}.pt", "storage") if stored else (None, None)
        if path is not None:
            workload.load_state_dict(torch.load(path, weights_only=True))
        dist.barrier()

    def reads_storage(self, agreed: int) -> bool:
        """Whether this rank restores storage although every rank's memory holds step ``agreed``."""
        return False

    def restored_tier(self) -> str | None:
        return self.tier


class LastRankFromStorage(TwoTierSave):
    """The last rank restores storage whenever storage holds the step the memory tier agreed on (a
    "storage is authoritative" shortcut taken on one rank): the same step, from another tier."""

    def reads_storage(self, agreed: int) -> bool:
        return self.context.rank == self.context.world_size - 1 and self.storage(agreed).exists()
