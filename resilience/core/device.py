"""Where a rank computes and how it talks: NCCL and its own GPU (``cuda:LOCAL_RANK``) when CUDA is
available, gloo and the CPU otherwise. The same training and checkpoint code runs on both.

``RESILIENCE_DEVICE=cpu`` keeps a GPU machine's ranks on gloo and the CPU (to compare the two paths).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

FORCE_ENV = "RESILIENCE_DEVICE"
FORCE_VALUES = ("cpu", "auto")


@dataclass(frozen=True)
class Placement:
    backend: str  # torch.distributed backend: "nccl" or "gloo"
    device: str  # "cuda:N" or "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


CPU = Placement(backend="gloo", device="cpu")


def choose(cuda_devices: int, local_rank: int, force: str = "auto") -> Placement:
    """The placement of the rank with ``local_rank`` on a node with ``cuda_devices`` GPUs.

    One GPU per rank, as torchrun lays ranks out: local rank N takes ``cuda:N``. More ranks on a node
    than GPUs is an error rather than two ranks silently sharing one device."""
    if force not in FORCE_VALUES:
        raise ValueError(f"{FORCE_ENV}: unknown value; got {force!r}; allowed: {', '.join(FORCE_VALUES)}")
    if cuda_devices <= 0 or force == "cpu":
        return CPU
    if not 0 <= local_rank < cuda_devices:
        raise ValueError(f"LOCAL_RANK {local_rank} has no GPU of its own: this node has {cuda_devices} "
                         f"(cuda:0..cuda:{cuda_devices - 1}); start at most {cuda_devices} ranks per node")
    return Placement(backend="nccl", device=f"cuda:{local_rank}")


def local_rank(environ: Mapping[str, str], rank: int) -> int:
    """``LOCAL_RANK`` as torchrun sets it; the harness starts every rank on one node, so there the
    global rank is the local one."""
    value = environ.get("LOCAL_RANK")
    if value is None:
        return rank
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"LOCAL_RANK: not an integer; got {value!r}") from None


def for_rank(rank: int) -> Placement:
    """This process's placement as rank ``rank``; makes its GPU the current CUDA device."""
    import torch

    placement = choose(torch.cuda.device_count() if torch.cuda.is_available() else 0,
                       local_rank(os.environ, rank), os.environ.get(FORCE_ENV, "auto"))
    if placement.is_cuda:
        torch.cuda.set_device(placement.device)
    global _chosen
    _chosen = placement  # for the workload this rank builds later
    return placement


_chosen: Placement = CPU


def rank_device() -> str:
    """The device `for_rank` chose in this process (the CPU where no rank was placed: the harness,
    the forkserver's warm-up)."""
    return _chosen.device


def machine_placement() -> str:
    """What ranks started on this machine run on, for cache keys: a reference computed with gloo
    on the CPU is not the oracle of ranks reducing with NCCL on GPUs (other bits)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    placement = choose(count, 0, os.environ.get(FORCE_ENV, "auto"))
    return f"{placement.backend} on {count} GPUs" if placement.is_cuda else f"{placement.backend} on the CPU"
