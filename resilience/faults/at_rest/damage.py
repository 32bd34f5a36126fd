"""The base of every damage at rest (`DamageAfterSave`): after the ``step`` save returned on every
rank, the ranks meet at a barrier (every rank's files are complete), the trigger rank damages the
files matching ``file`` that were written during that save, the ranks meet again, and the trigger
rank dies (SIGKILL), so the restart restores from the damaged checkpoint. Its subclasses say what
the damage is: `corruption` (bytes), `misplaced` (names), `hostile` (a payload), `straggler` (late
writes), `storage` (a restore's reads).
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, ClassVar

from ...core.confined import resolve_under
from ...core.events import ClockPhase, Event
from ...disk.trace_targets import is_selector, parse_target
from ..base import Fault, WriteListener
from .traced import SaveTracer


def file_identities(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under ``root``: relative path -> (inode, mtime_ns, size)."""
    found = {}
    for path in root.rglob("*"):
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if path.is_file():
            found[path.relative_to(root).as_posix()] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    return found


PERSIST_WAIT_S = 60.0  # for a save a node agent persists in the background (`CheckpointStrategy.wait_persisted`)


class DamageAfterSave(Fault, WriteListener):
    """The shared trigger: after the ``step`` save returned everywhere, damage, then stop the job.

    Subclasses implement ``damage(paths)`` (on the trigger rank only; returns what it did, for the
    event) and may override ``pick(changed)`` (which files to damage among those written during
    the save that match ``file``). ``file`` may name files by behaviour (``@written_by:R``,
    `resilience.disk.trace_targets`): then every rank traces its saves (`traced.SaveTracer`)."""

    points = {"save": ("returned",)}
    byte_points = ()
    #: whether the trigger rank dies once the damage is done (the restart then restores from it)
    stops_job: ClassVar[bool] = True
    #: False: nothing on disk is touched, the fault only stops the job here (and acts later)
    damages_files: ClassVar[bool] = True

    #: the selectors ``file`` may be (`resilience.disk.trace_targets`)
    trace_targets: ClassVar[tuple[str, ...]] = ("written_by",)

    def __init__(self, spec):
        super().__init__(spec)
        self._before: dict[str, tuple[int, int, int]] | None = None
        self.not_persisted = False
        self.tracer = SaveTracer.for_values((spec.trigger.file, spec.params.get("source")), spec.trigger.step,
                                            1 << 20) if spec.trigger else None

    def needs_interception(self) -> bool:
        return self.tracer is not None  # the ranks' opens for writing are the trace

    def arm(self, env) -> None:
        super().arm(env)
        if self.tracer is not None:
            self.tracer.arm(env)

    def wants(self, relative: str) -> bool:
        return self.tracer is not None and self.tracer.wants(relative)

    def on_open(self, file) -> None:
        if self.tracer is not None:
            self.tracer.record_open(file.relative)

    def identities(self) -> dict[str, tuple]:
        """What is saved now: files under the checkpoint directory, or objects under its URL."""
        if self.env.checkpoint_url:
            from ...objectstore.objects import object_identities

            return object_identities(self.env.checkpoint_url)
        return file_identities(self.env.checkpoint_dir)

    def first_run(self) -> bool:
        return self.env is not None and self.env.incarnation == "first_run"

    def at(self, phase: ClockPhase, step: int) -> None:
        # The train step before the triggering save: the previous save returned on every rank.
        if self.first_run() and phase == ClockPhase.TRAIN and step == self.trigger.step and self.on_trigger_rank():
            self._before = self.identities()

    def written_during_save(self) -> list[str]:
        """Files matching ``file`` created or changed since the triggering step began (or those
        the selector names, from the ranks' traces)."""
        if is_selector(self.trigger.file):  # the trace follows files, not objects
            return [] if self.env.checkpoint_url else self.tracer.resolve(self.trigger.file)
        before = self._before or {}
        return sorted(relative for relative, identity in self.identities().items()
                      if before.get(relative) != identity and self.path_matches(relative))

    def pick(self, changed: list[str]) -> list[str]:
        return changed

    def missed(self) -> str:
        """Why no file was damaged, in one line."""
        if self.not_persisted:
            return f"the step-{self.trigger.step} save was not in storage within {PERSIST_WAIT_S:g} s"
        if is_selector(self.trigger.file):
            target = parse_target(self.trigger.file, self.env.world_size)
            return f"no file fits: {target.describe(self.trigger.step)} (none it can act on)"
        return f"no file matching {self.trigger.file!r} was written during the save"

    def damage(self, paths: list[Path]) -> dict[str, Any]:
        return {}

    def damage_objects(self, relatives: list[str]) -> dict[str, Any]:
        raise NotImplementedError(f"{self.kind} acts on files only")

    def after_save(self, strategy, step: int) -> None:
        if not self.first_run() or step != self.trigger.step:
            return
        import torch.distributed as dist

        if self.tracer is not None:
            self.tracer.flush()  # before the ranks meet: the trigger rank reads every rank's trace
        # an agent may still be writing it; a user's script (no strategy: black-box mode) wrote it itself
        persisted = strategy is None or strategy.wait_persisted(step, PERSIST_WAIT_S)
        dist.barrier()  # every rank's save returned and is in storage: its files are complete
        acted = False
        if self.on_trigger_rank():
            targets = self.pick(self.written_during_save()) if self.damages_files and persisted else []
            if targets or not self.damages_files:
                if self.env.checkpoint_url:
                    detail = self.damage_objects(targets)
                else:
                    detail = self.damage([resolve_under(self.env.checkpoint_dir, r) for r in targets])
                acted = True
                self.fired(point="returned", files=targets, ends_process=self.stops_job, **detail)
            else:
                self.not_persisted = not persisted
                self.env.emit(Event.FAULT_MISSED, kind=self.spec.kind, file=self.trigger.file, reason=self.missed())
        dist.barrier()  # the damage is done before anyone goes on
        if acted and self.stops_job:
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)  # SIGKILL is not deliverable late; this only keeps the code honest
