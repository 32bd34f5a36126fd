"""Damage to a checkpoint that was saved completely: what bad disks, bad copies and bad operators
do to files at rest (a flipped bit, a cut file, a zeroed block, a lost or misplaced shard, a stale
or dangling ``latest`` pointer).

On every rank, right after the ``step`` save returned, the ranks meet at a barrier (every rank's
files are complete), the trigger rank damages every file matching ``file`` that was written
during that save, the ranks meet again, and the trigger rank dies (SIGKILL), so the restart
restores from the damaged checkpoint, as ``version_mismatch`` does. The files are changed on disk
with plain file operations: the restart reads what a real damaged file holds.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, ClassVar

from ...core.confined import resolve_under
from ...disk.trace_targets import is_selector, parse_target
from ..base import Fault
from .traced import SaveTracer

MIDDLE = "middle"


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


def _offset_problem(key: str, value: Any) -> tuple[str, str, Any, Any] | None:
    if value == MIDDLE or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    return (f"fault.{key}", "must be a byte offset or middle", value, "an integer >= 0, or middle (of the file)")


def _resolve_offset(offset: Any, size: int, name: Any) -> int:
    at = size // 2 if offset == MIDDLE else offset
    if at >= size:
        raise ValueError(f"fault offset {at} is past the end of {name} ({size} bytes)")
    return at


class DamageAfterSave(Fault):
    """The shared trigger: after the ``step`` save returned everywhere, damage, then stop the job.

    Subclasses implement ``damage(paths)`` (on the trigger rank only; returns what it did, for the
    event) and may override ``pick(changed)`` (which files to damage among those written during
    the save that match ``file``). ``file`` may name files by behaviour (``@written_by:R``,
    `resilience.disk.trace_targets`): then every rank traces its saves (`traced.SaveTracer`)."""

    points = {"save": ("returned",)}
    byte_points = ()
    stops_job: ClassVar[bool] = True
    #: False: nothing on disk is touched, the fault only stops the job here (and acts later)
    damages_files: ClassVar[bool] = True

    #: the selectors ``file`` may be (`resilience.disk.trace_targets`)
    trace_targets: ClassVar[tuple[str, ...]] = ("written_by",)

    def __init__(self, spec):
        super().__init__(spec)
        self._before: dict[str, tuple[int, int, int]] | None = None
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

    def at(self, phase: str, step: int) -> None:
        # The train step before the triggering save: the previous save returned on every rank.
        if self.first_run() and phase == "train" and step == self.trigger.step and self.on_trigger_rank():
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
        dist.barrier()  # every rank's save returned: its files are complete
        acted = False
        if self.on_trigger_rank():
            targets = self.pick(self.written_during_save()) if self.damages_files else []
            if targets or not self.damages_files:
                if self.env.checkpoint_url:
                    detail = self.damage_objects(targets)
                else:
                    detail = self.damage([resolve_under(self.env.checkpoint_dir, r) for r in targets])
                acted = True
                self.fired(point="returned", files=targets, ends_process=self.stops_job, **detail)
            else:
                self.env.emit("fault_missed", kind=self.spec.kind, file=self.trigger.file, reason=self.missed())
        dist.barrier()  # the damage is done before anyone goes on
        if acted and self.stops_job:
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)  # SIGKILL is not deliverable late; this only keeps the code honest


class RewritesBytes(DamageAfterSave):
    """A damage that is a function of a file's bytes (``damaged``: new bytes or None to delete,
    and what it did), applied in place to files and as a whole new object to objects."""

    on_objects = True
    detail_key: ClassVar[str] = ""

    def damaged(self, data: bytes, name: Any) -> tuple[bytes | None, Any]:
        raise NotImplementedError

    def damage(self, paths: list[Path]) -> dict[str, Any]:
        done = []
        for path in paths:
            new, detail = self.damaged(path.read_bytes(), path)
            if new is None:
                path.unlink()
            else:
                with open(path, "r+b") as file:  # the same inode, as a bad disk leaves it
                    file.write(new)
                    file.truncate(len(new))
            done.append(detail)
        return self.summary(done)

    def damage_objects(self, relatives: list[str]) -> dict[str, Any]:
        from ...objectstore.objects import rewrite_object

        return self.summary([rewrite_object(self.env.checkpoint_url, r, self.damaged) for r in relatives])

    def summary(self, done: list[Any]) -> dict[str, Any]:
        return {self.detail_key: done} if self.detail_key else {}


class BitFlip(RewritesBytes):
    """One bit (``bit``, 0 = least significant) of the byte at ``offset`` (or the middle of the
    file) flipped in every matching file, as a bad disk or DRAM on a storage server does."""

    kind = "bit_flip"
    params = {"offset": (object, MIDDLE), "bit": (object, 0)}
    detail_key = "offsets"

    @classmethod
    def check(cls, spec):
        bit = spec.params.get("bit")
        if isinstance(bit, bool) or not isinstance(bit, int) or not 0 <= bit <= 7:
            return ("fault.bit", "must be a bit number", bit, "0..7")
        return _offset_problem("offset", spec.params.get("offset"))

    def damaged(self, data: bytes, name: Any) -> tuple[bytes, int]:
        at = _resolve_offset(self.spec.params["offset"], len(data), name)
        changed = bytearray(data)
        changed[at] ^= 1 << self.spec.params["bit"]
        return bytes(changed), at

    def summary(self, done: list[Any]) -> dict[str, Any]:
        return {"offsets": done, "bit": self.spec.params["bit"]}


class Truncate(RewritesBytes):
    """Every matching file cut to ``keep`` bytes (an integer) or to that fraction of its size (a
    number between 0 and 1), as an interrupted copy or a lost tail of a write leaves it."""

    kind = "truncate"
    params = {"keep": (object, 0.5)}
    detail_key = "sizes"

    @classmethod
    def check(cls, spec):
        keep = spec.params.get("keep")
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or keep < 0 or (
                isinstance(keep, float) and keep >= 1):
            return ("fault.keep", "must be a byte count or a fraction of the file", keep,
                    "an integer >= 0 (bytes) or a number in (0, 1) (fraction)")
        return None

    def damaged(self, data: bytes, name: Any) -> tuple[bytes, list[int]]:
        keep, size = self.spec.params["keep"], len(data)
        new = int(size * keep) if isinstance(keep, float) else min(keep, size)
        return data[:new], [size, new]


class ZeroBlock(RewritesBytes):
    """``length`` bytes from ``offset`` (or the middle) overwritten with zeros in every matching
    file, as a lost block on a filesystem that zero-fills it does."""

    kind = "zero_block"
    params = {"offset": (object, MIDDLE), "length": (object, 4096)}
    detail_key = "ranges"

    @classmethod
    def check(cls, spec):
        length = spec.params.get("length")
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            return ("fault.length", "must be a byte count", length, "an integer >= 1")
        return _offset_problem("offset", spec.params.get("offset"))

    def damaged(self, data: bytes, name: Any) -> tuple[bytes, list[int]]:
        at = _resolve_offset(self.spec.params["offset"], len(data), name)
        length = min(self.spec.params["length"], len(data) - at)
        return data[:at] + bytes(length) + data[at + length:], [at, at + length]


class MissingFile(RewritesBytes):
    """Every matching file deleted: a shard lost by a failed upload or an over-eager cleanup."""

    kind = "missing_file"

    def damaged(self, data: bytes, name: Any) -> tuple[None, None]:
        return None, None
