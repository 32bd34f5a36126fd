"""Storage that misbehaves while the restart restores: reads that fail (EIO), reads that crawl, a
filesystem that went read-only.

The first run saves normally until the ``step`` save returned on every rank; then the trigger
rank dies, so the restart restores that checkpoint (as ``version_mismatch`` does). The restart's
ranks arm the fault:

- ``read_error``: during the restore, every open for reading of a file matching ``file`` fails
  with EIO (``fails_at: open``), or the open succeeds and every read fails (``fails_at: read``), on
  every restarted rank, as a disk with a bad sector or a storage server that lost a target answers. Through the
  read interception layer (`resilience.disk.read_interception`), so ``torch.load``, DeepSpeed's loads
  and its ``latest`` read all see it.
- ``slow_read``: during the restore, reads of matching files on restarted rank ``rank`` are throttled to
  ``bytes_per_s`` (each read sleeps its size / rate before it runs), as a cold object store or an
  overloaded parallel filesystem serves them; the other ranks wait in their next collective.
- ``read_only``: the checkpoint directory is remounted read-only (a bind mount of itself with
  ``ro``, needs root) before the restart, as a filesystem the kernel or an operator turned
  read-only after errors does: the kernel answers EROFS to every write, so the restore works and
  the restart's first save fails. The mount is removed at teardown. ``via: interception`` is the
  stand-in without root: Python-level writes under the directory raise EROFS in the restarted
  ranks (see ``refuse_writes_under``), C++ writers are not reached.
"""
from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from ...core import janitor
from ...core.events import ClockPhase
from ..base import CaseEnvironment, FaultUnavailable, ReadListener
from .damage import DamageAfterSave

MOUNT_TIMEOUT_S = 30


class _StopThenRestore(DamageAfterSave):
    """Stops the first run right after the ``step`` save (nothing damaged); acts at the restart."""

    arms_at_restart = True
    damages_files = False
    trace_targets = ()  # it acts on the restart's reads, by glob

    def damage(self, paths: list[Path]) -> dict[str, Any]:
        return {"action": "stop"}

    def restarted(self) -> bool:
        return self.env is not None and self.env.incarnation == "restart"

    def restoring(self) -> bool:
        """In the restart's restore (``strategy.load``): files written later are new, and fine."""
        return self.restarted() and self.env.clock.phase == ClockPhase.LOAD


class ReadError(_StopThenRestore, ReadListener):
    kind = "read_error"
    params = {"fails_at": (("read", "open"), "read")}

    def needs_read_interception(self) -> bool:
        return self.restarted()

    def arm(self, env) -> None:
        super().arm(env)
        self._reported: set[str] = set()

    def wants_read(self, relative: str) -> bool:
        return self.restoring() and self.path_matches(relative)

    def on_open_read(self, path: Path, relative: str) -> None:
        if self.spec.params["fails_at"] == "open":
            self._fail(path, relative, "open")

    def on_read(self, file: Any, nbytes: int) -> None:
        self._fail(file.path, file.relative, "read")

    def _fail(self, path: Path, relative: str, point: str) -> None:
        if relative not in self._reported:  # one event per file; every read still fails
            self._reported.add(relative)
            self.fired(point=point, file=relative, errno="EIO")
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))


class SlowRead(_StopThenRestore, ReadListener):
    kind = "slow_read"
    params = {"bytes_per_s": (float, None)}

    def needs_read_interception(self) -> bool:
        return self.restarted() and self.on_trigger_rank()

    def arm(self, env) -> None:
        super().arm(env)
        self._slowed: dict[str, float] = {}

    def wants_read(self, relative: str) -> bool:
        return self.restoring() and self.on_trigger_rank() and self.path_matches(relative)

    def on_read(self, file: Any, nbytes: int) -> None:
        if nbytes < 0:  # to the end of the file
            nbytes = max(0, os.fstat(file.fileno()).st_size - file.tell())
        if file.relative not in self._slowed:
            self._slowed[file.relative] = 0.0
            self.fired(point="read", file=file.relative, bytes_per_s=self.spec.params["bytes_per_s"])
        delay = nbytes / self.spec.params["bytes_per_s"]
        self._slowed[file.relative] += delay
        time.sleep(delay)


class ReadOnly(_StopThenRestore):
    kind = "read_only"
    params = {"via": (("mount", "interception"), "mount")}

    def __init__(self, spec):
        super().__init__(spec)
        self.mounted = False
        self.told = False  # the restart's first save was reached (the kernel refuses it)

    def setup(self, env: CaseEnvironment) -> None:
        if self.spec.params["via"] == "mount" and os.geteuid() != 0:
            raise FaultUnavailable("read_only via mount remounts the checkpoint directory read-only, which needs "
                                   "root (via: interception refuses writes in Python instead)")

    def arm(self, env) -> None:
        super().arm(env)
        if self.restarted() and self.spec.params["via"] == "interception":
            refuse_writes_under(env.checkpoint_dir)

    def heal(self, env: CaseEnvironment) -> None:
        """Not a repair: the step between the runs where the filesystem turns read-only."""
        if self.spec.params["via"] != "mount":
            return
        target = str(env.checkpoint_dir)
        for command in (["mount", "--bind", target, target], ["mount", "-o", "remount,bind,ro", target]):
            result = subprocess.run(command, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S)
            if result.returncode:
                raise FaultUnavailable(f"{' '.join(command)} failed: {result.stderr.strip()}")
            if not self.mounted:  # the bind made the mount; the remount only changes its flags
                janitor.register("mount", target)
            self.mounted = True

    def teardown(self, env: CaseEnvironment) -> None:
        if not self.mounted:
            return
        result = subprocess.run(["umount", str(env.checkpoint_dir)], capture_output=True, timeout=MOUNT_TIMEOUT_S)
        if result.returncode:  # a straggler still holds a file: detach now, the kernel frees it later
            subprocess.run(["umount", "-l", str(env.checkpoint_dir)], capture_output=True, timeout=MOUNT_TIMEOUT_S)
        self.mounted = False
        janitor.release("mount", env.checkpoint_dir)

    def at(self, phase: ClockPhase, step: int) -> None:
        super().at(phase, step)
        if self.restarted() and phase == ClockPhase.SAVE and self.on_trigger_rank() and not self.told:
            self.told = True  # the kernel, not this code, refuses the write: record where it meets it
            self.fired(point="save", read_only=str(self.env.checkpoint_dir))


def refuse_writes_under(root: Path) -> None:
    """``via: interception``: in this process, Python-level writes under ``root`` raise EROFS as a
    read-only filesystem would: ``open`` for writing, ``torch.save`` given a path, ``os.mkdir`` /
    ``os.makedirs`` of a new directory, ``os.rename`` / ``os.replace`` / ``os.remove`` /
    ``os.unlink``. Writes from C++ or from other processes are not reached: the mount is the real
    thing, this is its stand-in where there is no root."""
    import builtins
    import io

    import torch
    import torch.serialization

    from ...disk.interception import WRITE_MODE_CHARS

    base = os.path.abspath(root)

    def under(path: Any) -> bool:
        if not isinstance(path, (str, bytes, os.PathLike)):
            return False
        absolute = os.path.abspath(os.fsdecode(path))
        return absolute == base or absolute.startswith(base + os.sep)

    def refused(path: Any) -> OSError:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    real_open, real_save, real_mkdir = builtins.open, torch.serialization.save, os.mkdir

    def open_(file, mode="r", *args, **kwargs):
        if WRITE_MODE_CHARS & set(mode) and under(file):
            raise refused(file)
        return real_open(file, mode, *args, **kwargs)

    def save(obj, f, *args, **kwargs):
        if under(f):
            raise refused(f)
        return real_save(obj, f, *args, **kwargs)

    def mkdir(path, *args, **kwargs):
        if under(path) and not os.path.exists(path):
            raise refused(path)
        return real_mkdir(path, *args, **kwargs)  # an existing one: FileExistsError, as the kernel says

    def refusing(real):
        def call(path, *args, **kwargs):
            if under(path) or any(under(a) for a in args[:1]):
                raise refused(path)
            return real(path, *args, **kwargs)
        return call

    for owner, name, new in ((builtins, "open", open_), (io, "open", open_), (torch, "save", save),
                             (torch.serialization, "save", save), (os, "mkdir", mkdir)):
        setattr(owner, name, new)
    for name in ("rename", "replace", "remove", "unlink"):
        setattr(os, name, refusing(getattr(os, name)))
