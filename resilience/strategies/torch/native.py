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
(`resilience.core.preemption`), as training scripts on preemptible clusters add; off by default, as in the seed.

Option ``stagger: K`` (per-rank scheme): the seed's advice against filesystem pressure at scale, ranks
write in waves of K (ranks 0..K-1, then K..2K-1, ...) with a barrier between waves. Rank 0's scheme
has a single writer, so there is nothing to stagger.

With ``object_store: s3`` the files are objects under the case's ``s3://`` URL (s3fs,
`resilience.strategies.torch.targets`): ``torch.save`` streams into an upload that appears only once
complete, a step "directory" is the prefix of its objects; option ``part_size`` (at least 5 MiB)
is s3fs's block size, above which a file goes up as a multipart upload.

Each file also records ``check_loss``, the workload's loss on a fixed evaluation batch at save time
(when the workload has one: ``evaluation_loss()`` is not None): `resilience verify --step-check` recomputes it
after loading and compares bitwise. Restore reads it into ``recorded_check_loss`` and ignores it.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import ClassVar

import torch
import torch.distributed as dist

from ...core.capabilities import Capability
from ...workloads.base import Workload
from ..base import CheckpointStrategy
from .dcp_objects import part_size_problem
from .targets import CheckpointTarget, target_of

STEP_DIR = re.compile(r"^step_(\d{8})$")
FORMAT_VERSION = 1
STAMP_KEY = "versions"  # in every file: what wrote it (the restore ignores it unless check_version)
CHECK_LOSS_KEY = "check_loss"  # in every file: the evaluation loss at save time, for verify --step-check
CLAIMS = {"older": {"format": 0, "torch": "1.0.0"}, "newer": {"format": 99, "torch": "99.0.0"}}


def version_stamp() -> dict:
    return {"format": FORMAT_VERSION, "torch": str(torch.__version__)}  # TorchVersion is not weights-only


def check_loss(workload: Workload) -> dict:
    """``{check_loss: float}`` for the file, when the workload can compute an evaluation loss."""
    loss = workload.evaluation_loss()
    return {CHECK_LOSS_KEY: float(loss)} if loss is not None else {}


def load_checked(path: Path | str, check_version: bool, target: CheckpointTarget | None = None) -> dict:
    """The state saved in ``path`` (a file, or an object of ``target``) without its stamp (its check
    loss, if any, stays: the caller pops it); with ``check_version``, refuse a file whose format this
    code does not know (a checkpoint from another release of the training code)."""
    state = target.load(path) if target is not None else torch.load(path, weights_only=True)
    versions = state.pop(STAMP_KEY, None)
    if check_version and (not isinstance(versions, dict) or versions.get("format") != FORMAT_VERSION):
        raise RuntimeError(f"{str(path).rsplit('/', 1)[-1]}: checkpoint stamped {versions}; "
                           f"this reader understands format {FORMAT_VERSION} (torch {torch.__version__})")
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
    return part_size_problem(options)


def object_store_problem(options, store: str | None) -> tuple[str, str, object, object] | None:
    """Both schemes write to a directory or, through fsspec, to the case's object store."""
    if store is None and "part_size" in options:
        return ("strategy.options.part_size", "has no meaning without an object store", options["part_size"],
                "object_store: s3 beside it, or leave part_size out")
    return None


def prune_step_dirs(root: Path, keep: int | None) -> None:
    """Remove every step directory but the ``keep`` newest (by step number), complete or not."""
    if keep is None:
        return
    steps = sorted((p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)), key=lambda p: p.name)
    for directory in steps[:-keep]:
        shutil.rmtree(directory, ignore_errors=True)


def prune_steps(target: CheckpointTarget, keep: int | None) -> None:
    """``prune_step_dirs`` on ``target``: a directory, or the step prefixes of an object store."""
    if keep is None or isinstance(target.root, Path):
        prune_step_dirs(target.root, keep)
        return
    for name in sorted(n for n in target.entries(target.root) if STEP_DIR.match(n))[:-keep]:
        target.remove_tree(target.join(target.root, name))


def step_of(directory: Path) -> int:
    return int(STEP_DIR.match(directory.name).group(1))


def newest_step(target: CheckpointTarget) -> int | None:
    """The highest step with a step directory (or, on objects, a step prefix), complete or not."""
    if isinstance(target.root, Path):
        directory = newest_step_dir(target.root)
        return step_of(directory) if directory is not None else None
    return max((int(m.group(1)) for n in target.entries(target.root) if (m := STEP_DIR.match(n))), default=None)


def newest_step_dir(root: Path) -> Path | None:
    """The step directory with the highest step number, complete or not."""
    steps = [p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)] if root.is_dir() else []
    return max(steps, key=lambda p: p.name, default=None)


class TorchSave(CheckpointStrategy):
    """What both torch schemes share: the stamped file content and the check loss read back."""

    warm_restores = True  # keeps nothing between loads: restored in warm ranks
    capabilities = frozenset({Capability.VERSION_STAMP, Capability.CHOSEN_STEP})
    _target: CheckpointTarget | None = None  # made on first use: the options name its part size

    def file_content(self, workload: Workload) -> dict:
        return {**workload.state_dict(), STAMP_KEY: version_stamp(), **check_loss(workload)}

    check_options = staticmethod(keep_last_problem)
    check_object_store = staticmethod(object_store_problem)

    @property
    def target(self) -> CheckpointTarget:
        """The checkpoint directory, or the case's object store (``context.checkpoint_url``)."""
        if self._target is None:
            from ...core.sizes import parse_size

            part = self.context.options.get("part_size")
            self._target = target_of(self.context.checkpoint_dir, self.context.checkpoint_url,
                                     parse_size(part) if part else None)
        return self._target

    def restore_from(self, path: Path | str, workload: Workload) -> None:
        state = load_checked(path, bool(self.context.options.get("check_version")), self.target)
        self.recorded_check_loss = state.pop(CHECK_LOSS_KEY, None)
        workload.load_state_dict(state)

    def file_path(self, step: int) -> Path | str:
        """This rank's file of the step-``step`` checkpoint."""
        raise NotImplementedError

    def step_location(self, step: int) -> Path | str:
        return self.target.join(self.target.root, f"step_{step:08d}")

    def load(self, workload: Workload) -> None:
        """The newest step directory, complete or not, without validation or fallback (the seed's
        code); none: start from scratch."""
        step = newest_step(self.target)
        if step is not None:
            self.load_step(workload, step)
        else:
            dist.barrier()

    def load_step(self, workload: Workload, step: int) -> None:
        self.restore_from(self.file_path(step), workload)
        dist.barrier()

    def rewrite_version_stamp(self, step: int, claim: str) -> list[str]:
        path = self.file_path(step)
        restamp(path, claim)
        return [self.target.relative(path)]


class RankZeroSave(TorchSave):
    """Rank 0 saves the whole state with ``torch.save``, then every rank meets at a barrier.

    Assumes every rank holds the same state (true under pure data parallelism); restore loads rank
    0's file on every rank.
    """

    file_name = "model_optim.pt"
    options = ("save_on_sigterm", "check_version", "keep_last", "part_size")
    option_values: ClassVar[dict[str, tuple[bool, ...]]] = {"save_on_sigterm": (True, False),
                                                            "check_version": (True, False)}

    def save(self, workload: Workload, step: int) -> None:
        if self.context.rank == 0:
            self.target.make_directory(self.step_location(step))
            self.target.save(self.file_content(workload), self.file_path(step))
            prune_steps(self.target, self.context.options.get("keep_last"))
        dist.barrier()

    def file_path(self, step: int) -> Path | str:
        return self.target.join(self.step_location(step), self.file_name)

    def rewrite_version_stamp(self, step: int, claim: str) -> list[str]:
        return super().rewrite_version_stamp(step, claim) if self.context.rank == 0 else []


class PerRankSave(TorchSave):
    """Every rank saves ``ckpt_rank_<r>.pt`` and loads its own file back by rank, then a barrier.

    With ``stagger: K`` the ranks write in waves of K, a barrier after each wave."""

    options = ("save_on_sigterm", "check_version", "stagger", "keep_last", "part_size")
    option_values: ClassVar[dict[str, tuple[bool, ...] | type]] = {"save_on_sigterm": (True, False),
                                                                   "check_version": (True, False),
                                                                   "stagger": int}

    def save(self, workload: Workload, step: int) -> None:
        self.target.make_directory(self.step_location(step))
        path = self.file_path(step)
        wave_size = self.context.options.get("stagger")
        if not wave_size or wave_size >= self.context.world_size:  # one wave: every rank at once
            self.target.save(self.file_content(workload), path)
        else:
            waves = -(-self.context.world_size // wave_size)
            for wave in range(waves):
                if self.context.rank // wave_size == wave:
                    self.target.save(self.file_content(workload), path)
                if wave < waves - 1:  # the next wave starts once this one has written
                    dist.barrier()
        if self.context.rank == 0:  # without waiting for the others: see keep_last above
            prune_steps(self.target, self.context.options.get("keep_last"))
        dist.barrier()

    def file_path(self, step: int) -> Path | str:
        return self.target.join(self.step_location(step), f"ckpt_rank_{self.context.rank}.pt")
