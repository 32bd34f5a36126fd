"""The stable public path of the workload API, kept for plug-ins: the code lives in `resilience.workloads`."""
from __future__ import annotations

from .core.case import WorkloadSpec
from .core.topology import Topology
from .workloads.base import TrainableWorkload, Workload
from .workloads.data import ShuffledSampler, synthetic_dataset
from .workloads.mlp import MLPWorkload, sum_gradients

__all__ = ["MLPWorkload", "ShuffledSampler", "Topology", "TrainableWorkload", "Workload", "WorkloadSpec",
           "sum_gradients", "synthetic_dataset"]
