"""SIGKILL of a rank's own process at an exact point, as a node or process loss does.

Bytes written before the kill stay on disk (the page cache survives a process kill), so a file cut at
``after_bytes`` really is torn there.
"""
from __future__ import annotations

import os
import signal
import time
from fnmatch import fnmatchcase
from typing import Any

from ...core.case import MEMORY_COPY, MICRO_STEP
from ...core.events import ClockPhase, Event
from ...core.waiting import wait_until
from ...disk.interception import InterceptedFile
from ..base import Fault, WriteListener

AWAIT_S = 30.0
FILE_POINTS = ("open", "write", "fsync", "close")  # points reached through a file's IO


class Kill(Fault, WriteListener):
    """Kill ``rank`` at ``point`` of ``phase`` at ``step``:

    - ``start``: entering the train step (before its all-reduce) or the save (before any file);
    - ``micro_step`` (train): after the step's first micro-batch, before its next one, with the
      gradients half accumulated (a strategy whose loop accumulates: ``micro_steps`` >= 2);
    - ``memory_copy`` (save): in the middle of the rank's copy of its state into the node's memory,
      marked in progress with one tensor written (a strategy with an in-memory tier: ``MEMORY_COPY``),
      while the other ranks complete theirs: the rank stops there, and the harness SIGKILLs it once
      every other rank returned from that save (or one of them ended);
    - ``open``: just after the first file matching ``file`` was created (it stays empty);
    - ``write``: once ``after_bytes`` bytes of that file are written (exactly that many stay);
    - ``fsync``: just before fsync of that file;
    - ``close``: just after that file is complete and closed, before the save returns (between files).

    ``once_written`` (a glob under the checkpoint directory) delays the kill at the trigger point
    until some rank has created or changed a matching file during this save, e.g. DeepSpeed's
    ``latest``, which rank 0 writes without waiting for the other ranks' shards: the rank then
    dies with the pointer already naming its torn save. It waits at most ``AWAIT_S``; a file that
    never changes means the fault never fires, and the case fails saying so.

    ``process: helper`` kills, instead of the rank, a process the rank's library started to write
    for it (DeepSpeed's decoupled checkpoint writer, megatron-core's forked writer workers): the
    file trigger applies to that process's writes, and the rank lives on to find out.
    ``process: agent`` kills the node agent of ``rank``'s node (a strategy with node agents,
    `resilience.core.node_agents`: DLRover's saver persisting the node's memory) at its file point
    during the step-``step`` save's persist, which follows that rank's last save begun; the ranks
    live on, and the harness starts the node a new agent when they ended (the node's memory stays,
    as on a machine that did not reboot).
    With ``process: rank``, a file the rank writes through a process it forked (megatron-core's
    writer workers inherit the rank's interception) kills the rank and that writer together, as a
    node loss does: the file is cut at the trigger and the rank is gone.
    """

    on_objects = True  # at start points; file points reach files only
    kind = "kill"
    leaves_saves_alone = True
    in_timelines = True
    params = {"once_written": (str, None), "process": (("rank", "helper", "agent"), "rank")}
    points = {**Fault.points, "save": (*Fault.points["save"], MEMORY_COPY), "train": ("start", MICRO_STEP)}
    strategy_points = (MEMORY_COPY,)

    @classmethod
    def check(cls, spec):
        process = spec.params.get("process")
        if process in ("helper", "agent") and spec.trigger.point not in FILE_POINTS:
            return ("fault.point", f"a{'n' if process == 'agent' else ''} {process} process is reached through its "
                    "files only", spec.trigger.point, FILE_POINTS)
        return None

    def __init__(self, spec):
        super().__init__(spec)
        # in the middle of a memory copy the others complete theirs first: the harness kills
        self.supervises = type(self).supervises or (self.trigger is not None and self.trigger.point == MEMORY_COPY)
        self._stopped_killed = False
        self._before_save: dict[str, tuple[int, int, int]] = {}
        self._awaited: str | None = None  # the awaited file once written; "" if it never was

    def arm(self, env) -> None:
        super().arm(env)
        self._armed_pid = os.getpid()  # the rank (or, armed in a spawned helper, that helper)

    def needs_interception(self) -> bool:
        return self.trigger.point in FILE_POINTS and not self.reaches_helpers()

    def reaches_helpers(self) -> bool:
        return self.spec.params.get("process") in ("helper", "agent")

    def in_trigger_window(self) -> bool:
        return self.env.process == self.spec.params.get("process", "rank") and super().in_trigger_window()

    def wants(self, relative: str) -> bool:
        return (self.trigger.point in FILE_POINTS and self.in_trigger_window()
                and self.path_matches(relative))

    def at(self, phase: ClockPhase, step: int) -> None:
        if self.spec.params.get("once_written") and self.in_trigger_window():
            self._before_save = self._awaited_files()
        if self.trigger.point == "start" and self.in_trigger_window():
            self._kill(None)

    def attach(self, strategy) -> None:
        if self.trigger.point == MEMORY_COPY and self.on_trigger_rank():
            strategy.during_memory_copy(self._in_memory_copy)

    def _in_memory_copy(self) -> None:
        if self.in_trigger_window():
            self.fired(point=MEMORY_COPY, file=None, offset=None, ends_process=True)
            os.kill(os.getpid(), signal.SIGSTOP)  # SIGKILLed while stopped (``supervise``)
            time.sleep(3600)

    def supervise(self, events: list[dict], ranks: list) -> None:
        """``memory_copy``: SIGKILL the stopped trigger rank once every other rank returned from that
        save, or one of them ended."""
        if self._stopped_killed or not any(e["event"] == Event.FAULT_FIRED and e["rank"] == self.trigger.rank
                                           for e in events):
            return
        others = set(range(len(ranks))) - {self.trigger.rank}
        returned = {e["rank"] for e in events if e["event"] == Event.SAVE_RETURNED and e["step"] == self.trigger.step}
        if others <= returned or any(ranks[rank].poll() is not None for rank in others):
            ranks[self.trigger.rank].signal(signal.SIGKILL)
            self._stopped_killed = True

    def between_micro_steps(self, step: int) -> None:
        if self.trigger.point == MICRO_STEP and self.in_trigger_window():
            self._kill(None)

    def on_open(self, file: InterceptedFile) -> None:
        if self._armed_for(file, "open"):
            self._kill(file)

    def on_write(self, file: InterceptedFile, data: Any, nbytes: int) -> None:
        if not self._armed_for(file, "write") or file.offset + nbytes <= self.trigger.after_bytes:
            return
        if not self._ready():
            return
        keep = self.trigger.after_bytes - file.offset
        if keep > 0:
            file.write_through(data[:keep] if isinstance(data, str) else memoryview(data).cast("B")[:keep])
        self._kill(file)

    def on_fsync(self, file: InterceptedFile) -> None:
        if self._armed_for(file, "fsync"):
            self._kill(file)

    def after_close(self, file: InterceptedFile) -> None:
        if self._armed_for(file, "close"):
            self._kill(file, flushed=True)

    def _armed_for(self, file: InterceptedFile, point: str) -> bool:
        return self.trigger.point == point and self.in_trigger_window() and self.file_matches(file)

    def _ready(self) -> bool:
        """Whether the awaited file (if any) was written; decided once, where the kill would be."""
        if self.spec.params.get("once_written") and self._awaited is None:
            self._awaited = self._await_written() or ""
            if not self._awaited:
                self.env.emit(Event.FAULT_WAITING, kind=self.spec.kind, gave_up_after_s=AWAIT_S,
                              once_written=self.spec.params["once_written"])
        return self._awaited != ""

    def _awaited_files(self) -> dict[str, tuple[int, int, int]]:
        root = self.env.checkpoint_dir
        found = {}
        for path in root.rglob("*"):
            relative = path.relative_to(root).as_posix()
            if fnmatchcase(relative, self.spec.params["once_written"]):
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                found[relative] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        return found

    def _await_written(self) -> str | None:
        """The matching file some rank wrote during this save, once there is one; None after AWAIT_S."""
        def rewritten() -> str | None:
            return next((relative for relative, identity in self._awaited_files().items()
                         if self._before_save.get(relative) != identity), None)

        return wait_until(rewritten, AWAIT_S, interval_s=0.01)

    def _kill(self, file: InterceptedFile | None, flushed: bool = False) -> None:
        if file is not None and not flushed:
            file.flush_to_os()
        if not self._ready():
            return
        helper = self.env.process in ("helper", "agent")
        detail = {"awaited": self._awaited} if self._awaited else {}
        if helper:  # a killed helper or agent ends only itself: what the ranks then do is the evidence
            detail["process"] = self.env.process
        forked_writer = not helper and os.getpid() != self._armed_pid
        if forked_writer:
            detail["writer_pid"] = os.getpid()
        self.fired(point=self.trigger.point, file=file.relative if file else None,
                   offset=file.offset if file else None, ends_process=not helper, **detail)
        self.end(forked_writer)

    def end(self, forked_writer: bool) -> None:
        """What dies once the event is on record: this process (and the rank that forked it)."""
        if forked_writer:  # the rank's forked writer reached the trigger: the rank dies with it
            os.kill(self._armed_pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)  # SIGKILL is not deliverable late; this only keeps the code honest
