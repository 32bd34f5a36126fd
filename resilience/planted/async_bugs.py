"""Planted bugs of checkpoints written in the background: a writer's failure that never reaches
the job, and a completion marker that names a step whose shards are not all there.

Each is modelled on a failure mode seen in real training code and written against the public
contract only; ``resilience.planted.catalogue`` names the case that must catch each one.
"""
from __future__ import annotations

import sys

from ..strategies.dcp import DcpCheckpoint, job_timeout


class SwallowsWriterError(DcpCheckpoint):
    """DCP ``async_save`` whose future is awaited with ``future.exception()`` and whose failure is
    only logged ("the next save will do"; DCP's ``CheckpointException`` is a ``BaseException``, so
    the usual ``except Exception`` would not even have swallowed it): an exception in the background writer thread leaves the job believing the step
    saved, and the restart silently resumes from an older one."""

    def __init__(self, context):
        super().__init__(context)
        self.mode = "async"

    def commit(self) -> None:
        if self.pending is None:
            return
        pending, step = self.pending, self.pending_step
        self.pending = self.pending_step = None
        failure = pending.exception(timeout=job_timeout().total_seconds())  # waits, never raises what it holds
        if failure is not None:  # the bug: a failed background write is only logged
            print(f"warning: background checkpoint of step {step} failed, continuing: {failure!r}", file=sys.stderr)
