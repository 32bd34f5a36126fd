"""A thread of one rank takes the GIL and never gives it back, through a real C call that keeps it.

``ctypes.PyDLL`` calls a C function without releasing the GIL (``ctypes.CDLL`` releases it): the
holder thread calls libc ``sleep(seconds)`` that way, and every other thread of the rank, the one
that trains included, stops at its next attempt to run Python. (A Python busy loop would prove
nothing: the interpreter hands the GIL over every few milliseconds.) The rank stops answering its
peers: their next collective times out (LOUD) when ``timeouts.collective`` is the shorter, or the
phase passes its deadline (HANG) when it is the longer. faulthandler's SIGUSR1 dump, which the
harness asks for at a deadline, runs in C without the GIL, so it still prints every thread, the
holder in ``hold_gil`` included; the verdict's notes name it.
"""
from __future__ import annotations

import ctypes
import re
import threading
from typing import TYPE_CHECKING

from ...core.events import ClockPhase
from ..base import CaseEnvironment, Fault

if TYPE_CHECKING:
    from ...core.records import PhaseResult

HOLDER = "gil-holder"
HOLDER_FRAME = re.compile(r'^(?P<head>Thread 0x[0-9a-f]+)[^\n]*\n(?:\s+File [^\n]*\n)*?\s+File "(?P<path>[^"]*'
                          r'faults/process/gil_hang\.py)", line (?P<line>\d+) in hold_gil', re.M)


def hold_gil(seconds: int, holding: threading.Event) -> None:
    """libc sleep through PyDLL: the GIL stays with this thread for ``seconds``."""
    libc = ctypes.PyDLL(None)
    libc.sleep.argtypes = [ctypes.c_uint]
    holding.set()
    libc.sleep(seconds)


class GilHang(Fault):
    """At ``start`` of the trigger's train step or save, ``rank`` starts a thread that holds the
    GIL inside libc ``sleep`` for ``seconds`` (default 3600: longer than any phase)."""

    kind = "gil_hang"
    leaves_saves_alone = True
    points = {"train": ("start",), "save": ("start",)}
    byte_points = ()
    params = {"seconds": (float, 3600.0)}

    def at(self, phase: ClockPhase, step: int) -> None:
        if not self.in_trigger_window():
            return
        seconds = int(self.spec.params.get("seconds") or 3600)
        self.fired(point="start", seconds=seconds, thread=HOLDER)
        holding = threading.Event()
        threading.Thread(target=hold_gil, args=(seconds, holding), name=HOLDER, daemon=True).start()
        holding.wait()  # returns only once the holder lets go: this thread is stuck from here on

    def notes(self, env: CaseEnvironment, phases: tuple[PhaseResult, ...]) -> tuple[str, ...]:
        """The holder as the SIGUSR1 dump at the deadline shows it (none when the peers timed out
        first: the group was torn down without a dump)."""
        found = []
        for phase in phases:
            for event in phase.fault_events:
                if event["kind"] != self.kind:
                    continue
                tail = phase.ranks[event["rank"]].stderr_tail
                holder = HOLDER_FRAME.search(tail)
                if holder:
                    found.append(f"rank {event['rank']} in {phase.name}: GIL held by {holder['head']} in hold_gil "
                                 f"(faults/process/gil_hang.py:{holder['line']}, libc sleep through ctypes.PyDLL), "
                                 "as its faulthandler dump shows")
                else:
                    found.append(f"rank {event['rank']} in {phase.name}: GIL held by thread {HOLDER} from "
                                 f"{event['phase']} of step {event['step']}; no stack dump (the group was torn down "
                                 f"before a deadline)")
        return tuple(found)
