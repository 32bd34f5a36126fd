"""PyTorch-native checkpoints as the seed describes them (section 3.1), weaknesses included.

Layout: ``<dir>/step_<NNNNNNNN>/model_optim.pt`` (rank 0 only) or ``.../ckpt_rank_<r>.pt`` (every
rank). Restore picks the newest step directory by name and loads it without any validation and
without trying an older one: what the seed's code does. A torn newest file therefore fails loudly at
restore, and a step directory that is complete for some ranks only is used anyway.

Every file carries a version stamp (``versions``: format and torch version) that restore ignores,
as the seed's code would; option ``check_version: true`` refuses a file of another format.

Option ``keep_last: N``: retention as it is often written, rank 0 removing every step directory
but the N newest right after its own file is written, without waiting for the other ranks, so a
save that is torn on another rank may already have cost the previous checkpoint.

Option ``save_on_sigterm: true``: an emergency save of the current step when SIGTERM arrives
(`resilience.preemption`), as training scripts on preemptible clusters add; off by default, as in the seed.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import ClassVar

import torch
import torch.distributed as dist

from ..workload import Workload
from .base import CheckpointStrategy

STEP_DIR = re.compile(r"^step_(\d{8})$")
FORMAT_VERSION = 1
STAMP_KEY = "versions"  # in every file: what wrote it (the restore ignores it unless check_version)
CLAIMS = {"older": {"format": 0, "torch": "1.0.0"}, "newer": {"format": 99, "torch": "99.0.0"}}


def version_stamp() -> dict:
    return {"format": FORMAT_VERSION, "torch": str(torch.__version__)}  # TorchVersion is not weights-only


def load_checked(path: Path, check_version: bool) -> dict:
    """The state saved in ``path`` without its stamp; with ``check_version``, refuse a file whose
    format this code does not know (a checkpoint from another release of the training code)."""
    state = torch.load(path, weights_only=True)
    versions = state.pop(STAMP_KEY, None)
    if check_version and (not isinstance(versions, dict) or versions.get("format") != FORMAT_VERSION):
        raise RuntimeError(f"{path.name}: checkpoint stamped {versions}; this reader understands format "
                           f"{FORMAT_VERSION} (torch {torch.__version__})")
    return state


def restamp(path: Path, claim: str) -> None:
    state = torch.load(path, weights_only=True)
    state[STAMP_KEY] = dict(CLAIMS[claim])
    torch.save(state, path)


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def keep_last_problem(options) -> tuple[str, str, object, object] | None:
    keep = options.get("keep_last")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        return ("strategy.options.keep_last", "must be a number of checkpoints", keep, "an integer >= 1")
    return None


def prune_step_dirs(root: Path, keep: int | None) -> None:
    """Remove every step directory but the ``keep`` newest (by step number), complete or not."""
    if keep is None:
        return
    steps = sorted((p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)), key=lambda p: p.name)
    for directory in steps[:-keep]:
        shutil.rmtree(directory, ignore_errors=True)


def step_of(directory: Path) -> int:
    return int(STEP_DIR.match(directory.name).group(1))


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
    options = ("save_on_sigterm", "check_version", "keep_last")
    option_values: ClassVar[dict[str, tuple[bool, ...]]] = {"save_on_sigterm": (True, False),
                                                            "check_version": (True, False)}
    records_version = True
    check_options = staticmethod(keep_last_problem)

    def save(self, workload: Workload, step: int) -> None:
        if self.context.rank == 0:
            directory = step_dir(self.context.checkpoint_dir, step)
            directory.mkdir(parents=True, exist_ok=True)
            torch.save({**workload.state_dict(), STAMP_KEY: version_stamp()}, directory / self.file_name)
            prune_step_dirs(self.context.checkpoint_dir, self.context.options.get("keep_last"))
        dist.barrier()

    def load(self, workload: Workload) -> None:
        directory = newest_step_dir(self.context.checkpoint_dir)
        if directory is not None:
            self.load_step(workload, step_of(directory))
        else:
            dist.barrier()

    def step_location(self, step: int) -> Path:
        return step_dir(self.context.checkpoint_dir, step)

    def load_step(self, workload: Workload, step: int) -> None:
        workload.load_state_dict(load_checked(self.step_location(step) / self.file_name,
                                              bool(self.context.options.get("check_version"))))
        dist.barrier()

    def rewrite_version_stamp(self, step: int, claim: str) -> list[str]:
        if self.context.rank != 0:
            return []
        path = step_dir(self.context.checkpoint_dir, step) / self.file_name
        restamp(path, claim)
        return [path.relative_to(self.context.checkpoint_dir).as_posix()]


class PerRankSave(CheckpointStrategy):
    """Every rank saves ``ckpt_rank_<r>.pt`` and loads its own file back by rank, then a barrier."""

    options = ("save_on_sigterm", "check_version", "keep_last")
    option_values: ClassVar[dict[str, tuple[bool, ...]]] = {"save_on_sigterm": (True, False),
                                                            "check_version": (True, False)}
    records_version = True
    check_options = staticmethod(keep_last_problem)

    def save(self, workload: Workload, step: int) -> None:
        directory = step_dir(self.context.checkpoint_dir, step)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save({**workload.state_dict(), STAMP_KEY: version_stamp()},
                   directory / f"ckpt_rank_{self.context.rank}.pt")
        if self.context.rank == 0:  # without waiting for the others: see keep_last above
            prune_step_dirs(self.context.checkpoint_dir, self.context.options.get("keep_last"))
        dist.barrier()

    def load(self, workload: Workload) -> None:
        directory = newest_step_dir(self.context.checkpoint_dir)
        if directory is not None:
            self.load_step(workload, step_of(directory))
        else:
            dist.barrier()

    def step_location(self, step: int) -> Path:
        return step_dir(self.context.checkpoint_dir, step)

    def load_step(self, workload: Workload, step: int) -> None:
        path = self.step_location(step) / f"ckpt_rank_{self.context.rank}.pt"
        workload.load_state_dict(load_checked(path, bool(self.context.options.get("check_version"))))
        dist.barrier()

    def rewrite_version_stamp(self, step: int, claim: str) -> list[str]:
        path = step_dir(self.context.checkpoint_dir, step) / f"ckpt_rank_{self.context.rank}.pt"
        restamp(path, claim)
        return [path.relative_to(self.context.checkpoint_dir).as_posix()]
