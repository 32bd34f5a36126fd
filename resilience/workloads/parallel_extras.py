"""The `tp_mlp` workload's options (``workload.options``): the `mlp` options that a tensor- and
pipeline-parallel split keeps meaningful, built so that the trajectory stays independent of the
topology, as the rest of `tp_mlp` is.

    dropout: 0.1      # after each hidden layer: in the tensor-parallel region (layer 1's slice of
                      # the hidden units) and after the row-parallel sum (replicated on a TP group)
    ema: 0.9          # an exponential moving average of this rank's shard of the weights
    accumulation: 2   # micro-batches per step, each through the whole pipeline, one reduction

Megatron-LM draws the tensor-parallel region's dropout from a per-TP-rank CUDA stream (its
``CudaRNGStatesTracker``) and the rest from the default stream. On the CPU, and to keep the
trajectory free of the split, every rank draws both masks of the whole global micro-batch from the
process's default generator (replicated, as the model is: ``torch_rng`` in the state) and keeps its
rows and, in the tensor-parallel region, its columns; with ``rank_rng: distinct`` each data-parallel
rank draws its own rows' masks from a stream of its own, as ``--data-parallel-random-init`` does.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .options import OPTIONS_KEY, option_problem

PARALLEL_OPTIONS = ("dropout", "ema", "accumulation")


def parallel_option_problem(options: Mapping[str, Any], world_size: int,
                            global_batch: int) -> tuple[str, str, Any, Any] | None:
    """None, or ``(key, problem, value, allowed)`` for the first option `tp_mlp` does not take or
    whose value is bad. The batch split is checked where the world size divides the global batch
    (a model-parallel restart need not: the workload checks its data-parallel share when built)."""
    for key in options:
        if key not in PARALLEL_OPTIONS:
            return (f"{OPTIONS_KEY}.{key}", "is not an option of workload tp_mlp (its data path is Megatron's "
                    "sampler, its precision and layers the tensor-parallel ones)", key, ", ".join(PARALLEL_OPTIONS))
    problem = option_problem(options, 1, global_batch)  # the values, and a count that divides the batch
    if problem or global_batch % world_size:
        return problem
    return option_problem(options, world_size, global_batch)


class DropoutMasks:
    """The two dropout masks of a micro-batch (after layer 1 and after layer 2), drawn by every rank
    from the default generator whether or not its pipeline stage holds the layer, so that the
    generator stays in step on every rank. ``draw`` before each micro-batch's forward; ``apply``
    in it."""

    def __init__(self, p: float, hidden: int, tp_slice: slice, per_rank: bool):
        self.p, self.hidden, self.tp_slice, self.per_rank = p, hidden, tp_slice, per_rank
        self.masks: list[torch.Tensor] = []

    def draw(self, global_rows: int, rows: slice) -> None:
        """This micro-batch's masks for ``rows`` of its ``global_rows`` (a per-rank stream draws
        only its own rows)."""
        count = rows.stop - rows.start if self.per_rank else global_rows
        drawn = [torch.empty(count, self.hidden).bernoulli_(1 - self.p) for _ in range(2)]
        self.masks = drawn if self.per_rank else [mask[rows] for mask in drawn]

    def apply(self, layer: int, hidden: torch.Tensor, sliced: bool) -> torch.Tensor:
        """``hidden`` after layer ``layer`` (0 or 1) dropped out; ``sliced``: it holds this
        tensor-parallel rank's columns only."""
        mask = self.masks[layer][:, self.tp_slice] if sliced else self.masks[layer]
        return hidden * mask.to(hidden.device) / (1 - self.p)
