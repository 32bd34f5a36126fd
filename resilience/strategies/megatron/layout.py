"""Where Megatron-LM's legacy checkpoint puts each model-parallel rank's file (no torch, no IO)."""
from __future__ import annotations

import sys
from pathlib import Path

TRACKER = "latest_checkpointed_iteration.txt"
FILE_NAME = "model_optim_rng.pt"


def checkpoint_path(iteration: int, tp_rank: int, pp_rank: int, pp_size: int) -> str:
    """get_checkpoint_name, relative: iter_XXXXXXX/mp_rank_TT[_PPP]/model_optim_rng.pt."""
    shard = f"mp_rank_{tp_rank:02d}" if pp_size == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    return f"iter_{iteration:07d}/{shard}/{FILE_NAME}"


def checkpoint_file(root: Path, iteration: int, tp_rank: int, pp_rank: int, pp_size: int) -> Path:
    return Path(root) / checkpoint_path(iteration, tp_rank, pp_rank, pp_size)


def read_tracker(text: str) -> int | None:
    """The iteration the tracker names, or None when it is not an integer (Megatron-LM exits)."""
    try:
        return int(text.strip())
    except ValueError:
        return None


def write_tracker(root: Path, iteration: int) -> None:
    """Megatron-LM's tracker update (rank 0, after every rank's save returned)."""
    with open(Path(root) / TRACKER, "w") as tracker:
        tracker.write(str(iteration))


def tracked_iteration(root: Path) -> int | None:
    """Megatron-LM's read_metadata: the iteration the tracker names; None, with its warning, when
    there is no tracker (training starts from random); an invalid tracker exits, as it does."""
    tracker = Path(root) / TRACKER
    if not tracker.is_file():
        print(f"WARNING: could not find the metadata file {tracker}; will not load any checkpoints "
              "and will start from random", file=sys.stderr)
        return None
    iteration = read_tracker(tracker.read_text())
    if iteration is None:  # Megatron-LM: print_rank_0('ERROR: Invalid metadata file ...'); sys.exit()
        print(f"ERROR: Invalid metadata file {tracker}. Exiting", file=sys.stderr)
        sys.exit()
    return iteration


def iteration_dir(root: Path, iteration: int) -> Path:
    """get_checkpoint_name with return_base_dir: the directory of one dist_checkpointing save."""
    return Path(root) / f"iter_{iteration:07d}"
