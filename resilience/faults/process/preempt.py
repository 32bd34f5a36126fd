"""Preemption as SLURM and Kubernetes do it: SIGTERM, a grace period, then SIGKILL.

The trigger rank reports the trigger point and waits there for the SIGTERM (so it always arrives at
that point, while the other ranks wait for it in the step's all-reduce or the save's barrier). The
harness sends SIGTERM to ``ranks`` (``all``: the whole job is preempted; ``trigger``: only the trigger
rank's node is), and ``grace`` seconds later SIGKILL to every one of them still alive.

What happens in between is the job's business (`resilience.core.preemption`): a rank without an
emergency-save handler dies at once; with one, every rank saves the step it is at and exits.
``after_bytes`` makes that emergency save slower than any grace period, deterministically: once a
rank's emergency save has written ``after_bytes`` bytes of a file matching ``file``, its writes stall
(storage too slow for the grace period), so the SIGKILL always cuts that file at exactly that offset.
"""
from __future__ import annotations

import signal
import time
from typing import Any, ClassVar

from ...core.events import ClockPhase, Event
from ...core.preemption import sigterm_received
from ...core.waiting import wait_until
from ...disk.interception import InterceptedFile
from ..base import Fault, WriteListener

SIGTERM_TIMEOUT_S = 60.0  # how long the trigger rank waits for the harness's SIGTERM


class Preempt(Fault, WriteListener):
    kind = "preempt"
    leaves_saves_alone = True
    in_timelines = True
    points: ClassVar[dict[str, tuple[str, ...]]] = {"train": ("start",), "save": ("start",)}
    byte_points = ("start",)
    params: ClassVar[dict] = {"ranks": (("all", "trigger"), "all"), "grace": (float, 30.0)}
    supervises = True
    supervises_by_signals = True

    def __init__(self, spec):
        super().__init__(spec)
        self.terminated_at: float | None = None
        self.signalled: list[int] = []
        self.killed: list[int] = []

    # -- harness side -------------------------------------------------------------------------
    def supervise(self, events: list[dict], ranks: list) -> None:
        if self.terminated_at is None:
            if any(e["event"] == Event.FAULT_FIRED and e["rank"] == self.trigger.rank for e in events):
                self.signalled = (list(range(len(ranks))) if self.spec.params["ranks"] == "all"
                                  else [self.trigger.rank])
                self.terminated_at = time.time()
                for rank in self.signalled:
                    ranks[rank].signal(signal.SIGTERM)
        elif time.time() >= self.terminated_at + self.spec.params["grace"]:
            for rank in self.signalled:
                if rank not in self.killed and ranks[rank].poll() is None:
                    ranks[rank].signal(signal.SIGKILL)
                    self.killed.append(rank)

    # -- rank side ----------------------------------------------------------------------------
    def at(self, phase: ClockPhase, step: int) -> None:
        if not self.in_trigger_window():
            return
        self.fired(point="start", ranks=self.spec.params["ranks"], grace=self.spec.params["grace"],
                   ends_process=True)
        # without a handler, SIGTERM ends the process in this wait
        if not wait_until(sigterm_received, SIGTERM_TIMEOUT_S, interval_s=0.01):
            raise RuntimeError(f"preempt: no SIGTERM from the harness within {SIGTERM_TIMEOUT_S:g} s")

    def needs_interception(self) -> bool:
        return self.trigger.after_bytes is not None

    def wants(self, relative: str) -> bool:
        return (self.trigger.after_bytes is not None and self.env.clock.phase == ClockPhase.EMERGENCY
                and self.path_matches(relative))

    def on_write(self, file: InterceptedFile, data: Any, nbytes: int) -> None:
        if not self.wants(file.relative) or file.offset + nbytes <= self.trigger.after_bytes:
            return
        keep = self.trigger.after_bytes - file.offset
        if keep > 0:
            file.write_through(data[:keep] if isinstance(data, str) else memoryview(data).cast("B")[:keep])
        file.flush_to_os()
        self.env.emit(Event.WRITE_STALLED, file=file.relative, offset=file.offset)
        while True:  # the grace period ends first: the harness's SIGKILL
            time.sleep(1)
