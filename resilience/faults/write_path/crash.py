"""A rank (or the process writing for it) crashing the ways native code and background threads
crash: a real SIGSEGV or SIGABRT from C, ``os._exit`` without cleanup, or an exception raised in the
thread that writes a checkpoint file (DCP ``async_save``'s writer thread).

The question each answers: does the save report the failure, or does the job go on believing its
checkpoint exists?
"""
from __future__ import annotations

import ctypes
import faulthandler
import os
import re
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from ...core.events import ClockPhase
from ...disk.interception import InterceptedFile
from ...errors import InjectedCrash
from ..base import CaseEnvironment, Fault, WriteListener

if TYPE_CHECKING:
    from ...core.records import PhaseResult

HOWS = ("segfault", "abort", "os_exit", "thread_exception")
FILE_POINTS = ("open", "write", "fsync", "close")
# faulthandler's dump: "Fatal Python error: Segmentation fault", then one block per thread. It
# writes a few bytes at a time while the process's other threads may write to stderr too, so a
# block is read from its header to the next one, whatever lines came in between.
FATAL = re.compile(r"Fatal Python error: (?P<what>[^\n]+)")
THREAD_HEAD = re.compile(r"(?:Current thread|Thread) 0x[0-9a-f]+")
FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


class Crash(Fault, WriteListener):
    """Crash ``rank`` at its trigger point (``start`` of a train step or save, or a file point of
    the save, as `Kill` has them), ``how``:

    - ``segfault``: a read of address 0 from C (``ctypes.string_at(0)``): SIGSEGV in native code;
    - ``abort``: libc ``abort()`` through ctypes: SIGABRT, as ``std::terminate`` ends a process;
    - ``os_exit``: ``os._exit(1)``: no ``finally``, no atexit, no flush of Python buffers;
    - ``thread_exception``: `resilience.errors.InjectedCrash` raised in the thread that writes the
      matching file (a file point only): in DCP ``async_save`` that is the background writer, whose
      failure reaches the job only if someone looks at the save's future.

    The first three end the process (its peers' errors are consequences); faulthandler is enabled
    for SIGSEGV and SIGABRT so every thread's Python stack is dumped (Python 3.11 prints no C
    frames), and the dump's threads and their innermost frames go in the case's notes.
    ``process: helper`` crashes, instead of the rank, a process the rank's library started to write
    for it (DeepSpeed's decoupled writer), through that process's files.
    """

    kind = "crash"
    leaves_saves_alone = True
    in_timelines = True
    params = {"how": (HOWS, "segfault"), "process": (("rank", "helper"), "rank")}

    @classmethod
    def check(cls, spec):
        point = spec.trigger.point
        if spec.params.get("how") == "thread_exception" and point not in FILE_POINTS:
            return ("fault.point", "an exception in a writer thread is raised where that thread writes: a file "
                                   "point", point, FILE_POINTS)
        if spec.params.get("process") == "helper" and point not in FILE_POINTS:
            return ("fault.point", "a helper process is reached through its files only", point, FILE_POINTS)
        return None

    def __init__(self, spec):
        super().__init__(spec)
        self.done = False  # fired: a writer that goes on writing other files meets it once

    @property
    def how(self) -> str:
        return self.spec.params.get("how", "segfault")

    def needs_interception(self) -> bool:
        return self.trigger.point in FILE_POINTS and not self.reaches_helpers()

    def reaches_helpers(self) -> bool:
        return self.spec.params.get("process") == "helper"

    def arm(self, env) -> None:
        super().arm(env)
        if self.how in ("segfault", "abort") and self.on_trigger_rank():
            faulthandler.enable(file=sys.stderr, all_threads=True)

    def in_trigger_window(self) -> bool:
        """At the trigger's step and phase; at a file point, for as long as the trigger's save is the
        last one the rank began: a background writer writes it while the rank trains on."""
        if self.done or self.env.process != self.spec.params.get("process", "rank"):
            return False
        if self.trigger.point in FILE_POINTS:
            return self.on_trigger_rank() and self.env.clock.save_step == self.trigger.step
        return super().in_trigger_window()

    def wants(self, relative: str) -> bool:
        return self.trigger.point in FILE_POINTS and self.in_trigger_window() and self.path_matches(relative)

    def at(self, phase: ClockPhase, step: int) -> None:
        if self.trigger.point == "start" and self.in_trigger_window():
            self._crash(None)

    def on_open(self, file: InterceptedFile) -> None:
        self._at_file(file, "open")

    def on_write(self, file: InterceptedFile, data: Any, nbytes: int) -> None:
        if self.trigger.point != "write" or not self._armed(file):
            return
        after = self.trigger.after_bytes or 0
        if file.offset + nbytes <= after:
            return
        keep = after - file.offset
        if keep > 0:
            file.write_through(data[:keep] if isinstance(data, str) else memoryview(data).cast("B")[:keep])
        self._crash(file)

    def on_fsync(self, file: InterceptedFile) -> None:
        self._at_file(file, "fsync")

    def after_close(self, file: InterceptedFile) -> None:
        self._at_file(file, "close")

    def _at_file(self, file: InterceptedFile, point: str) -> None:
        if self.trigger.point == point and self._armed(file):
            self._crash(file)

    def _armed(self, file: InterceptedFile) -> bool:
        return self.in_trigger_window() and self.file_matches(file)

    def _crash(self, file: InterceptedFile | None) -> None:
        if file is not None and self.trigger.point != "close":
            file.flush_to_os()
        self.done = True
        thread = threading.current_thread()
        ends = self.how != "thread_exception" and self.env.process == "rank"
        self.fired(point=self.trigger.point, how=self.how, file=file.relative if file else None,
                   offset=file.offset if file else None, thread=thread.name,
                   main_thread=thread is threading.main_thread(), ends_process=ends,
                   **({"process": "helper"} if self.env.process == "helper" else {}))
        if self.how == "thread_exception":
            raise InjectedCrash(f"crash fault: exception raised in thread {thread.name!r} while it wrote "
                                f"{file.relative if file else '?'} (step {self.env.clock.step})")
        sys.stderr.flush()
        if self.how == "os_exit":
            os._exit(1)
        if self.how == "abort":
            ctypes.CDLL(None).abort()
        ctypes.string_at(0)  # segfault: a read of address 0 from C
        time.sleep(3600)  # neither returns; this only keeps the code honest

    # -- harness side ---------------------------------------------------------------------------
    def notes(self, env: CaseEnvironment, phases: tuple[PhaseResult, ...]) -> tuple[str, ...]:
        """How the crashed rank ended, and from its faulthandler dump each thread's innermost frame."""
        found = []
        for phase in phases:
            fired = {e["rank"]: e for e in phase.fault_events if e.get("how")}
            for record in phase.ranks:
                event = fired.get(record.rank)
                if event is None or event.get("process") == "helper":
                    continue
                code = record.returncode
                ended = (f"exit status {code}" if code is not None and code >= 0
                         else f"killed by {signal.Signals(-code).name}" if code is not None else "torn down")
                line = (f"crash ({event['how']}) of rank {record.rank} in {phase.name} at {event['phase']} of step "
                        f"{event['step']}, in thread {event['thread']}: {ended}")
                fatal = FATAL.search(record.stderr_tail)
                if fatal:
                    threads = [_innermost(head, frames) for head, frames in _thread_blocks(record.stderr_tail)]
                    line += f"; faulthandler: {fatal['what']}; " + "; ".join(threads)
                found.append(line)
        return tuple(found)


def _thread_blocks(text: str) -> list[tuple[str, str]]:
    """Each dumped thread's header and the text up to the next header."""
    heads = list(THREAD_HEAD.finditer(text))
    ends = [h.start() for h in heads[1:]] + [len(text)]
    return [(h.group(), text[h.end():end]) for h, end in zip(heads, ends, strict=True)]


def _innermost(head: str, frames: str) -> str:
    """A dumped thread and its innermost frame outside this module (where the crash was called)."""
    found = [m for m in FRAME.finditer(frames) if not m["path"].endswith("faults/write_path/crash.py")]
    if not found:
        return head
    frame = found[0]
    return f"{head} in {frame['func']} ({'/'.join(frame['path'].split('/')[-2:])}:{frame['line']})"
