"""The options of the built-in `mlp` workload (``workload.options``): the state real jobs carry that a
bare model and optimizer lack, each off by default so that a case without options trains as before.

    dropout: 0.1            # dropout after each hidden layer, drawn from the process's torch RNG
    ema: 0.9                # an exponential moving average of the weights, kept in the state
    accumulation: 2         # micro-batches per optimizer step (a fault may fire between them)
    amp: fp16               # autocast in bf16, or fp16 with a GradScaler whose scale must survive
    buffers: true           # running statistics: one buffer updated in place, one out of place
    tied: true              # the hidden layer applied twice: one parameter under two state-dict keys
    data: loader            # a torch DataLoader with a DistributedSampler (default: sampler)
    num_workers: 2          # loader worker processes (data: loader)
    persistent_workers: true
    epoch_steps: 5          # steps per epoch of the loader's dataset (data: loader)
    loader_state: per_rank  # each rank's position under its own key, as torchtitan keeps it
    step_seconds: 0.5       # each optimizer step lasts at least this long, as a real model's does
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPTIONS_KEY = "workload.options"
DATA_SOURCES = ("sampler", "loader")
PRECISIONS = ("bf16", "fp16")
LOADER_ONLY = ("num_workers", "persistent_workers", "epoch_steps", "loader_state")
LOADER_STATES = ("replicated", "per_rank")


@dataclass(frozen=True)
class TrainingExtras:
    """The parsed ``workload.options`` of an `mlp` workload."""

    dropout: float = 0.0
    ema: float | None = None  # the decay; None: no average kept
    accumulation: int = 1
    amp: str | None = None  # "bf16" or "fp16"; None: full precision
    buffers: bool = False
    tied: bool = False
    data: str = "sampler"
    num_workers: int = 0
    persistent_workers: bool = False
    epoch_steps: int = 5
    loader_state: str = "replicated"
    step_seconds: float = 0.0

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> TrainingExtras:
        """The extras of validated options (`option_problem` found nothing)."""
        ema = options.get("ema")
        return cls(dropout=float(options.get("dropout", 0.0)), ema=None if ema is None else float(ema),
                   accumulation=int(options.get("accumulation", 1)), amp=options.get("amp"),
                   buffers=bool(options.get("buffers", False)), tied=bool(options.get("tied", False)),
                   data=str(options.get("data", "sampler")),
                   num_workers=int(options.get("num_workers", 0)),
                   persistent_workers=bool(options.get("persistent_workers", False)),
                   epoch_steps=int(options.get("epoch_steps", 5)),
                   loader_state=str(options.get("loader_state", "replicated")),
                   step_seconds=float(options.get("step_seconds", 0.0)))


def option_problem(options: Mapping[str, Any], world_size: int,
                   global_batch: int) -> tuple[str, str, Any, Any] | None:
    """None, or ``(key, problem, value, allowed)`` for the first bad option."""
    for key, value in options.items():
        problem = _value_problem(key, value)
        if problem:
            return (f"{OPTIONS_KEY}.{key}", *problem)
    if options.get("data", "sampler") != "loader":
        for key in LOADER_ONLY:
            if key in options:
                return (f"{OPTIONS_KEY}.{key}", "applies to data: loader only", options[key],
                        "data: loader, or leave it out")
    if options.get("persistent_workers") and not options.get("num_workers"):
        return (f"{OPTIONS_KEY}.persistent_workers", "keeps worker processes, and num_workers is 0",
                True, "num_workers >= 1, or leave it out")
    problem = batch_problem(options, world_size, global_batch)
    if problem:
        return (f"{OPTIONS_KEY}.accumulation", problem, options.get("accumulation", 1),
                "a count that divides global_batch / world_size")
    return None


def batch_problem(options: Mapping[str, Any], world_size: int, global_batch: int) -> str | None:
    """Why ``global_batch`` cannot be split over ``world_size`` ranks with these options (a restart
    at another world size), or None."""
    accumulation = int(options.get("accumulation", 1))
    if global_batch % (world_size * accumulation):
        return (f"global batch {global_batch} does not split into {accumulation} micro-batch(es) on each of "
                f"{world_size} ranks")
    return None


def _value_problem(key: str, value: Any) -> tuple[str, Any, Any] | None:
    if key == "dropout":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            return "must be a probability", value, "a number in [0, 1)"
    elif key == "ema":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            return "must be a decay", value, "a number in (0, 1), such as 0.9"
    elif key in ("accumulation", "epoch_steps"):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
            return "must be a count", value, "an integer in 1..64"
    elif key == "num_workers":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 8:
            return "must be a count of worker processes", value, "an integer in 0..8"
    elif key in ("persistent_workers", "buffers", "tied"):
        if not isinstance(value, bool):
            return "must be true or false", value, "true, false"
    elif key == "step_seconds":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 60:
            return "must be a duration in seconds", value, "a number in [0, 60]"
    elif key == "amp":
        if value not in PRECISIONS:
            return "is not a mixed precision", value, ", ".join(PRECISIONS)
    elif key == "loader_state":
        if value not in LOADER_STATES:
            return "is not a way to keep the loader's position", value, ", ".join(LOADER_STATES)
    elif key == "data":
        if value not in DATA_SOURCES:
            return "is not a data source", value, ", ".join(DATA_SOURCES)
    else:
        return "is not an option of workload mlp", key, ", ".join(OPTION_NAMES)
    return None


OPTION_NAMES = ("dropout", "ema", "accumulation", "amp", "buffers", "tied", "data", "step_seconds") + LOADER_ONLY
