"""Ranks that disagree on where the checkpoint goes: one rank's training script computes another
tag than its peers (a step counter one ahead, a rank-local name), as in a ZeRO-2 save that missed
one rank's optimizer shard because the ranks disagreed on the directory.

At the ``step`` save, rank ``rank`` saves under the tag of step ``step + skew`` while every other
rank uses the step's own tag; the library under test decides what happens (DeepSpeed compares the
tags' hashes across ranks and, under its default ``tag_validation: Warn``, only logs). After the
save returned on every rank, the trigger rank dies, so the restart restores what was written.
Needs a strategy that says which tag it passes (``tag_for(step)``).
"""
from __future__ import annotations

import os
import signal
import time
from typing import Any

from ...core.capabilities import Capability
from ...core.events import ClockPhase
from ..base import Fault


class TagMismatch(Fault):
    kind = "tag_mismatch"
    points = {"save": ("start",)}
    byte_points = ()
    params = {"skew": (object, 1)}
    requires = frozenset({Capability.TAGS})  # a tag per step (tag_for) to disagree on, e.g. deepspeed.zero2

    @classmethod
    def check(cls, spec):
        skew = spec.params.get("skew")
        if isinstance(skew, bool) or not isinstance(skew, int) or skew == 0:
            return ("fault.skew", "must be a non-zero step difference", skew, "an integer other than 0")
        return None

    def attach(self, strategy: Any) -> None:
        while strategy.inner is not None and strategy.inner.offers(Capability.TAGS):
            strategy = strategy.inner  # a wrapper: its inner strategy saves, with its tags
        self.strategy = strategy

    def at(self, phase: ClockPhase, step: int) -> None:
        if not (self.env.incarnation == "first_run" and phase == ClockPhase.SAVE and self.in_trigger_window()):
            return
        agreed = self.strategy.tag_for
        skew, skewed_step = self.spec.params["skew"], step

        def disagreeing(asked: int) -> str:  # only this save, only this rank
            return agreed(asked + skew) if asked == skewed_step else agreed(asked)

        self.strategy.tag_for = disagreeing
        self.fired(point="start", tag=disagreeing(step), others_use=agreed(step))

    def after_save(self, strategy, step: int) -> None:
        """The save returned everywhere (whatever the library made of it): stop the job here."""
        if self.env.incarnation == "first_run" and step == self.trigger.step:
            import torch.distributed as dist

            dist.barrier()
            if self.on_trigger_rank():
                self.fired(point="returned", ends_process=True)
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(3600)  # SIGKILL is not deliverable late; this only keeps the code honest
