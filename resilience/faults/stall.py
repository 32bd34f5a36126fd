"""A rank frozen for a while: a GC pause, a slow node, a network stall seen from its peers.

The rank reports the trigger point, then stops itself with SIGSTOP, so the stall begins exactly
there (in the middle of a collective for its peers: they wait in the save's barrier or the
training all-reduce). The harness sends SIGCONT ``seconds`` later. A stall shorter than the process
group timeout (``timeouts.collective``) only delays the job; a longer one makes the peers' collective
time out: loud, within the timeout plus the time a rank takes to notice.
"""
from __future__ import annotations

import os
import signal
import time

from .base import Fault


class Stall(Fault):
    kind = "stall"
    points = {"train": ("start",), "save": ("start",)}
    byte_points = ()
    params = {"seconds": (float, None)}
    supervises = True

    def __init__(self, spec):
        super().__init__(spec)
        self.resumed: set[int] = set()

    # -- rank side ----------------------------------------------------------------------------
    def at(self, phase: str, step: int) -> None:
        if self.in_trigger_window():
            self.fired(point="start", seconds=self.spec.params["seconds"])
            os.kill(os.getpid(), signal.SIGSTOP)  # the harness resumes us

    # -- harness side -------------------------------------------------------------------------
    def supervise(self, events: list[dict], ranks: list) -> None:
        for event in events:
            if event["event"] != "fault_fired" or event["rank"] in self.resumed:
                continue
            rank = ranks[event["rank"]]
            # resume only a rank that has really stopped: a SIGCONT sent first would be lost
            if time.time() >= event["time"] + self.spec.params["seconds"] and rank.is_stopped():
                rank.signal(signal.SIGCONT)
                self.resumed.add(event["rank"])
