"""PyTorch-native checkpoints as the seed describes them (section 3.1), weaknesses included.

Layout: ``<dir>/step_<NNNNNNNN>/model_optim.pt`` (rank 0 only) or ``.../ckpt_rank_<r>.pt`` (every
rank). Restore picks the newest step directory by name and loads it without any validation and
without trying an older one: what the seed's code does. A torn newest file therefore fails loudly at
restore, and a step directory that is complete for some ranks only is used anyway.

Option ``save_on_sigterm: true``: an emergency save of the current step when SIGTERM arrives
(`resilience.preemption`), as training scripts on preemptible clusters add; off by default, as in the seed.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

import torch
import torch.distributed as dist

from ..workload import Workload
from .base import CheckpointStrategy

STEP_DIR = re.compile(r"^step_(\d{8})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def newest_step_dir(root: Path) -> Path | None:
    """The step directory with the highest step number, complete or not."""
    steps = [p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)] if root.is_dir() else []
    return max(steps, key=lambda p: p.name, default=None)


class RankZeroSave(CheckpointStrategy):
    """Rank 0 saves the whole state with ``torch.save``, then every rank meets at a barrier.

    Assumes every rank holds the same state (true under pure data parallelism); restore loads rank
    0's file on every rank.
    """

    file_name = "model_optim.pt"
    options = ("save_on_sigterm",)
    option_values: ClassVar[dict[str, tuple[bool, ...]]] = {"save_on_sigterm": (True, False)}

    def save(self, workload: Workload, step: int) -> None:
        if self.context.rank == 0:
            directory = step_dir(self.context.checkpoint_dir, step)
            directory.mkdir(parents=True, exist_ok=True)
            torch.save(workload.state_dict(), directory / self.file_name)
        dist.barrier()

    def load(self, workload: Workload) -> None:
        directory = newest_step_dir(self.context.checkpoint_dir)
        if directory is not None:
            workload.load_state_dict(torch.load(directory / self.file_name, weights_only=True))
        dist.barrier()


class PerRankSave(CheckpointStrategy):
    """Every rank saves ``ckpt_rank_<r>.pt`` and loads its own file back by rank, then a barrier."""

    options = ("save_on_sigterm",)
    option_values: ClassVar[dict[str, tuple[bool, ...]]] = {"save_on_sigterm": (True, False)}

    def save(self, workload: Workload, step: int) -> None:
        directory = step_dir(self.context.checkpoint_dir, step)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(workload.state_dict(), directory / f"ckpt_rank_{self.context.rank}.pt")
        dist.barrier()

    def load(self, workload: Workload) -> None:
        directory = newest_step_dir(self.context.checkpoint_dir)
        if directory is not None:
            path = directory / f"ckpt_rank_{self.context.rank}.pt"
            workload.load_state_dict(torch.load(path, weights_only=True))
        dist.barrier()
