"""Storage that misbehaves while the restart restores: reads that fail (EIO), reads that crawl, a
filesystem that went read-only.

The first run saves normally until the ``step`` save returned on every rank; then the trigger
rank dies, so the restart restores that checkpoint (as ``version_mismatch`` does). The restart's
ranks arm the fault:

- ``read_error``: during the restore, every open for reading of a file matching ``file`` fails
  with EIO (``fails_at: open``), or the open succeeds and every read fails (``fails_at: read``), on
  every restarted rank, as a disk with a bad sector or a storage server that lost a target answers. Through the
  read interception layer (`resilience.read_interception`), so ``torch.load``, DeepSpeed's loads
  and its ``latest`` read all see it.
- ``slow_read``: during the restore, reads of matching files on restarted rank ``rank`` are throttled to
  ``bytes_per_s`` (each read sleeps its size / rate before it runs), as a cold object store or an
  overloaded parallel filesystem serves them; the other ranks wait in their next collective.
- ``read_only``: the checkpoint directory is remounted read-only (a bind mount of itself with
  ``ro``, needs root) before the restart, as a filesystem the kernel or an operator turned
  read-only after errors does: the kernel answers EROFS to every write, so the restore works and
  the restart's first save fails. The mount is removed at teardown.
"""
from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from .base import CaseEnvironment, FaultUnavailable
from .corruption import DamageAfterSave

MOUNT_TIMEOUT_S = 30


class _StopThenRestore(DamageAfterSave):
    """Stops the first run right after the ``step`` save (nothing damaged); acts at the restart."""

    arms_at_restart = True

    def pick(self, changed: list[str]) -> list[str]:
        return ["."]  # nothing to damage: fire and stop even if the save wrote no matching file

    def written_during_save(self) -> list[str]:
        return ["."]

    def damage(self, paths: list[Path]) -> dict[str, Any]:
        return {"action": "stop"}

    def restarted(self) -> bool:
        return self.env is not None and self.env.incarnation == "restart"

    def restoring(self) -> bool:
        """In the restart's restore (``strategy.load``): files written later are new, and fine."""
        return self.restarted() and self.env.clock.phase == "load"


class ReadError(_StopThenRestore):
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


class SlowRead(_StopThenRestore):
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
    params = {"via": (("mount",), "mount")}

    def __init__(self, spec):
        super().__init__(spec)
        self.mounted = False

    def setup(self, env: CaseEnvironment) -> None:
        if os.geteuid() != 0:
            raise FaultUnavailable("read_only via mount remounts the checkpoint directory read-only, which needs root")

    def heal(self, env: CaseEnvironment) -> None:
        """Not a repair: the step between the runs where the filesystem turns read-only."""
        target = str(env.checkpoint_dir)
        for command in (["mount", "--bind", target, target], ["mount", "-o", "remount,bind,ro", target]):
            result = subprocess.run(command, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S)
            if result.returncode:
                raise FaultUnavailable(f"{' '.join(command)} failed: {result.stderr.strip()}")
            self.mounted = True

    def teardown(self, env: CaseEnvironment) -> None:
        if not self.mounted:
            return
        result = subprocess.run(["umount", str(env.checkpoint_dir)], capture_output=True, timeout=MOUNT_TIMEOUT_S)
        if result.returncode:  # a straggler still holds a file: detach now, the kernel frees it later
            subprocess.run(["umount", "-l", str(env.checkpoint_dir)], capture_output=True, timeout=MOUNT_TIMEOUT_S)
        self.mounted = False

    def at(self, phase: str, step: int) -> None:
        super().at(phase, step)
        if self.restarted() and phase == "save" and self.on_trigger_rank() and not getattr(self, "_told", False):
            self._told = True  # the kernel, not this code, refuses the write: record where it meets it
            self.fired(point="save", read_only=str(self.env.checkpoint_dir))
