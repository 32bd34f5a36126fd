"""A rank frozen for a while: a GC pause, a slow node, a network stall seen from its peers.

The rank reports the trigger point, then stops itself with SIGSTOP, so the stall begins exactly
there (in the middle of a collective for its peers: they wait in the save's barrier or the
training all-reduce). The harness sends SIGCONT ``seconds`` later. A stall shorter than the process
group timeout (``timeouts.collective``) only delays the job; a longer one makes the peers' collective
time out: loud, within the timeout plus the time a rank takes to notice.

``scope: node`` freezes the trigger rank's whole node instead (a machine that stops answering):
once the trigger rank has stopped itself, the harness stops every other rank the topology places
on that node (``topology.node_of``) and resumes them all ``seconds`` after the trigger.
"""
from __future__ import annotations

import os
import signal
import time

from ...core.events import ClockPhase, Event
from ..base import Fault


class Stall(Fault):
    kind = "stall"
    leaves_saves_alone = True
    points = {"train": ("start",), "save": ("start",)}
    byte_points = ()
    params = {"seconds": (float, None), "scope": (("rank", "node"), "rank")}
    supervises = True
    supervises_by_signals = True
    #: scope node under torchrun on several nodes: the trigger node's driver drives it for its own ranks
    node_scoped = True

    def __init__(self, spec):
        super().__init__(spec)
        self.resumed: set[int] = set()
        self.placement = None
        self.node_stopped: tuple[int, ...] = ()  # scope node: the trigger's node-mates the harness stopped
        self.seen_stopped: tuple[int, ...] = ()  # those of them still stopped when resumed (/proc says so)

    def setup(self, env) -> None:
        self.placement = env.case.placement if env.case is not None else None  # a script: one node

    def _node_of(self, rank: int) -> int:
        return self.placement.node_of(rank) if self.placement is not None else 0

    # -- rank side ----------------------------------------------------------------------------
    def at(self, phase: ClockPhase, step: int) -> None:
        if self.in_trigger_window():
            self.fired(point="start", seconds=self.spec.params["seconds"])
            os.kill(os.getpid(), signal.SIGSTOP)  # the harness resumes us

    # -- harness side -------------------------------------------------------------------------
    def supervise(self, events: list[dict], ranks: list) -> None:
        for event in events:
            if event["event"] != Event.FAULT_FIRED or event["rank"] in self.resumed:
                continue
            rank = ranks[event["rank"]]
            if self.spec.params.get("scope") == "node" and not self.node_stopped and rank.is_stopped():
                node = self._node_of(event["rank"])
                self.node_stopped = tuple(r for r in range(len(ranks))
                                          if r != event["rank"] and self._node_of(r) == node)
                for mate in self.node_stopped:
                    ranks[mate].signal(signal.SIGSTOP)
            # resume only a rank that has really stopped: a SIGCONT sent first would be lost
            if time.time() >= event["time"] + self.spec.params["seconds"] and rank.is_stopped():
                self.seen_stopped = tuple(mate for mate in self.node_stopped if ranks[mate].is_stopped())
                for mate in self.node_stopped:
                    ranks[mate].signal(signal.SIGCONT)
                rank.signal(signal.SIGCONT)
                self.resumed.add(event["rank"])

    def notes(self, env, phases) -> tuple[str, ...]:
        if not self.node_stopped:
            return ()
        return (f"node {self._node_of(self.trigger.rank)} frozen: rank {self.trigger.rank} stopped "
                f"itself, ranks {list(self.node_stopped)} stopped with it (found stopped when resumed: "
                f"{list(self.seen_stopped)}), all resumed together",)
