"""A checkpoint that claims another version of what wrote it: an upgrade or a downgrade of the
framework between save and restore (the seed: "version upgrades may make checkpoints incompatible").

On every rank, right after its save for ``step`` returned, the strategy rewrites the version
stamp its files carry (its format version, DeepSpeed's ``ds_version``, ...) to an ``older`` or
``newer`` one. The scenario states whether the restore refuses (loud) or loads and recovers.
A real cross-version restore runs the restart under other packages instead (``restart.packages``).
"""
from __future__ import annotations

import os
import signal
import time

from .base import Fault

CLAIMS = ("older", "newer")


class VersionMismatch(Fault):
    kind = "version_mismatch"
    points = {"save": ("returned",)}
    byte_points = ()
    params = {"version": (CLAIMS, "older")}

    @classmethod
    def check_strategy(cls, strategy: type):
        if not getattr(strategy, "records_version", False):
            return ("fault.kind", f"strategy {strategy.__name__} records no version stamp to rewrite",
                    cls.kind, "a strategy whose records_version is true")
        return None

    def after_save(self, strategy, step: int) -> None:
        """Every rank restamps its own files of the trigger step's checkpoint; once all have, the
        trigger rank dies (the job stops there, as it does for an upgrade), so the restart
        resumes from exactly that checkpoint."""
        if step != self.trigger.step:
            return
        import torch.distributed as dist

        files = strategy.rewrite_version_stamp(step, self.spec.params["version"])
        stops = self.on_trigger_rank()
        self.fired(point="returned", files=files, claim=self.spec.params["version"], ends_process=stops)
        dist.barrier()
        if stops:
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)  # SIGKILL is not deliverable late; this only keeps the code honest
