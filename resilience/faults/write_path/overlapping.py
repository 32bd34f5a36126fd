"""Several background saves in flight at once, then a kill: which one survives, and is it whole?

A job that checkpoints often with a save that finishes in the background (DCP ``async_save``
each step) has more than one save in flight whenever storage is slower than training. The fault
makes that state certain instead of a race: from the step-``step`` save on, the trigger rank's
writes of files matching ``file`` (the saves from that step on) stall (its storage stops
answering), so no save of its from then on finishes; at the start of the first train step at
which ``in_flight`` (default 2) of those stalled saves are in flight, once its earlier saves
finished writing, it is SIGKILLed. A strategy that waits
for the previous save before the next never gets there: it waits in that save instead (its own
timeout, or the phase deadline, decides). The restart shows which checkpoint survived; the oracle
verifies it bitwise.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Any

from ...core.capabilities import Capability
from ...core.events import ClockPhase
from ...core.waiting import wait_until
from ...disk.interception import InterceptedFile
from ..base import Fault, WriteListener

STALL_S = 3600.0  # a stalled write waits for the kill
EARLIER_SAVES_S = 30.0  # at most this long for the saves before the stall to finish


class OverlappingAsync(Fault, WriteListener):
    kind = "overlapping_async"
    points = {"save": ("start",)}
    byte_points = ()
    # ``file`` (a glob) names the files whose writes stall: a background writer may still be writing
    # an older save's files when the trigger's save begins
    params = {"in_flight": (float, 2.0)}
    # a strategy whose saves finish in the background and that reports them (dcp with mode: async)
    requires = frozenset({Capability.IN_FLIGHT_STEPS})

    def __init__(self, spec):
        super().__init__(spec)
        self.strategy: Any = None
        self.stalled = False

    def attach(self, strategy: Any) -> None:
        self.strategy = strategy

    def stalling(self) -> bool:
        return self.on_trigger_rank() and self.env.clock.save_step >= self.trigger.step

    def wants(self, relative: str) -> bool:
        return self.stalling() and self.path_matches(relative)

    def on_write(self, file: InterceptedFile, data: Any, nbytes: int) -> None:
        if self.stalling() and self.file_matches(file):
            if not self.stalled:  # on record before the writer stops: the kill may never come
                self.stalled = True
                self.fired(point="write", file=file.relative, stalls=True)
            time.sleep(STALL_S)

    def at(self, phase: ClockPhase, step: int) -> None:
        if phase != ClockPhase.TRAIN or not self.on_trigger_rank() or step <= self.trigger.step:
            return
        flying = self.strategy.in_flight_steps()
        if len([s for s in flying if s >= self.trigger.step]) >= int(self.spec.params.get("in_flight") or 2):
            # the saves before the stall are not held back: on a loaded machine one may still be
            # writing; they finish first, so which steps were committed at the kill is certain
            wait_until(lambda: not any(s < self.trigger.step for s in self.strategy.in_flight_steps()),
                       EARLIER_SAVES_S, interval_s=0.05)
            flying = self.strategy.in_flight_steps()
            self.fired(point="start", in_flight=flying, ends_process=True)
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)
