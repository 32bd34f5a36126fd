"""The no-op strategy: never saves, so a restart always starts from scratch."""
from __future__ import annotations

from ..workloads.base import Workload
from .base import CheckpointStrategy


class NoCheckpoint(CheckpointStrategy):
    """Saves nothing and restores nothing (a baseline: every restart loses all progress)."""

    def save(self, workload: Workload, step: int) -> None:
        return None

    def load(self, workload: Workload) -> None:
        return None
