"""A power cut during a save, explored: every rank's IO is traced, then crash states are rebuilt.

In the first run's ranks this fault only records: every file operation under the checkpoint
directory during each save up to and including the one at ``step`` (`resilience.disk.io_trace`), then
it ends the first run once that save returned on the rank. The crash itself is not injected into
live processes: `resilience.run.explore` rebuilds the disk states a power cut at any point of that save
could leave (`resilience.disk.crash_states`), restarts real ranks on each and judges them.

Where the strategy keeps node agents that persist in the background (DLRover's saver), every node's
agent of the first run is armed too and traces its persists up to and including that of ``step``
as a stream of its own (number ``world_size + node index``): a power cut takes the agents' memory
with it, so what they had made durable is all a restore finds.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ...core.events import ClockPhase, Event
from ...disk.collective_hooks import CollectiveHooks
from ...disk.interception import InterceptedFile
from ...disk.io_trace import NamespaceHooks, TraceWriter
from ..base import Fault, RankEnvironment, WriteListener

TRACE_DIR = "trace"  # under the case directory
PROFILES = ("ci", "long")


class PowerLoss(Fault, WriteListener):
    """Every rank loses power at once, somewhere inside the save of ``step``.

    Rank side: ``arm`` opens the rank's trace and hooks the namespace operations; the IO hooks record
    opens, writes (with their bytes) and closes of every file during saves up to ``step``;
    ``after_save(step)`` records that the save returned and ends the rank (exit status 0): the
    explorer needs nothing after it. In a node agent the same hooks record during each persist up to
    that of ``step`` (``agent_persisting``), whose return is recorded as the agent's ``returned``.
    Harness side: nothing; the explorer reads the traces.
    """

    kind = "power_loss"
    needs_rank = False  # a power cut hits every rank at once
    points = {"save": ("any",)}
    byte_points = ()
    params = {"profile": (PROFILES, "ci")}

    explores = True  # the harness hands the case to the explorer
    in_every_node_agent = True  # an agent's background persist is part of the save
    after_save_at_exit = True  # it only closes this rank's trace: a script's final save is traced too

    def __init__(self, spec):
        super().__init__(spec)
        self.writer: TraceWriter | None = None
        self.hooks: NamespaceHooks | None = None
        self.collectives: CollectiveHooks | None = None
        self.persisting: int | None = None  # in an agent: the step of the persist under way

    def arm(self, env: RankEnvironment) -> None:
        super().arm(env)
        agent = env.process == "agent"
        self.writer = TraceWriter(env.case_dir / TRACE_DIR, env.world_size + env.node_index if agent else env.rank)
        self.writer.follow_forks()  # megatron-core's writer workers are forked and inherit these hooks
        # shutil.copyfile moves bytes with os.sendfile on Linux, past any file object: make it write
        shutil._USE_CP_SENDFILE = False
        # files staged in $TMPDIR are traced too: what moves them into place needs their bytes
        staging = os.environ.get("TMPDIR")  # every harness rank has its own; a bare test may have none
        self.hooks = NamespaceHooks(env.checkpoint_dir, self._namespace_op, staging=Path(staging) if staging else None)
        self.hooks.install()
        if agent:
            return
        # which collectives the ranks had passed orders their ops the same way in every run
        self.collectives = CollectiveHooks(lambda name: self._record("sync", target=name), self._recording)
        self.collectives.install()

    def _recording(self) -> bool:
        if self.env.process == "agent":
            return self.writer is not None and self.persisting is not None and self.persisting <= self.trigger.step
        clock = self.env.clock
        return clock.phase == ClockPhase.SAVE and clock.save_step <= self.trigger.step

    def _record(self, kind: str, payload: bytes | None = None, **fields: Any) -> None:
        step = self.persisting if self.env.process == "agent" else self.env.clock.save_step
        self.writer.record(step, kind, payload, **fields)

    def _namespace_op(self, kind: str, **fields: Any) -> None:
        if self._recording():
            self._record(kind, **fields)

    def at(self, phase: ClockPhase, step: int) -> None:
        if phase == ClockPhase.SAVE and step == self.trigger.step and self.env.rank == 0:
            self.fired(point="any")

    def wants(self, relative: str) -> bool:
        # staged files ($TMPDIR/...) too: the crash model follows their bytes into the directory
        return self._recording()

    def on_open(self, file: InterceptedFile) -> None:
        mode = getattr(file, "mode", "w")
        self._record("open", path=file.relative, truncate="w" in mode)

    def on_write(self, file: InterceptedFile, data: Any, nbytes: int) -> None:
        payload = data.encode(getattr(file, "encoding", None) or "utf-8") if isinstance(data, str) \
            else bytes(memoryview(data).cast("B"))
        position = file.tell() if file.seekable() else file.offset
        self._record("write", payload, path=file.relative, offset=position)

    def after_close(self, file: InterceptedFile) -> None:
        self._record("close", path=file.relative)

    def after_save(self, strategy: Any, step: int) -> None:
        if step > self.trigger.step:
            return
        self._record("returned")
        self.writer.flush()
        if step == self.trigger.step:
            self.env.emit(Event.TRACE_COMPLETE, step=step)
            self.writer.close()
            os._exit(0)  # the explorer needs nothing after this save; peers finish theirs on their own


    def agent_persisting(self, step: int, returned: bool) -> None:
        if step > self.trigger.step or self.writer is None:
            return
        if not returned:
            self.persisting = step
            return
        self._record("returned")
        self.writer.flush()
        self.persisting = None
        if step == self.trigger.step:
            self.writer.close()
            self.writer = None


def trace_dir(case_dir: Path) -> Path:
    return case_dir / TRACE_DIR
