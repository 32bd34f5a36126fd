"""A full disk during a save: ENOSPC after a byte budget.

``via: quota`` (any machine): the interception layer gives the trigger rank ``after_bytes`` more
bytes from the start of the triggering save. At ``point: write`` the write that crosses the budget is
cut short and raises ENOSPC, as a local filesystem does; at ``fsync`` or ``close`` every write seems to
succeed and the error comes later, as on NFS or Lustre, with the file cut back to the budget.
The disk stays full for the rest of the first run; the restart finds it freed. ``on: staging``
counts only the files a rank stages in its $TMPDIR (Lightning's atomic save writes there before
moving the file into place), so the staging directory is full while the checkpoint directory has room.

``via: tmpfs`` (root): the checkpoint directory is a real size-limited tmpfs; when the trigger rank
starts the triggering save, a ballast file fills it up to ``after_bytes`` free bytes, so the kernel
itself answers ENOSPC to whichever rank writes next. The harness removes the ballast before the restart.
"""
from __future__ import annotations

import errno
import os
import subprocess
from fnmatch import fnmatchcase
from typing import Any

from ...core import janitor
from ...core.events import ClockPhase
from ...disk.interception import STAGING_PREFIX, InterceptedFile
from ..base import CaseEnvironment, Fault, FaultUnavailable, WriteListener

BALLAST_NAME = ".resilience-ballast"


def _no_space(file: InterceptedFile) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file.path))


class DiskFull(Fault, WriteListener):
    kind = "disk_full"
    points = {"save": ("write", "fsync", "close", "start")}
    byte_points = ("write", "fsync", "close", "start")
    params = {"via": (("quota", "tmpfs"), "quota"), "on": (("checkpoint", "staging"), "checkpoint")}

    def __init__(self, spec):
        super().__init__(spec)
        self.full = False  # the budget ran out: every later write on this rank fails too
        self.used = 0
        self.mounted = False
        self.cut_at: dict[int, int] = {}  # id(file) -> offset past which bytes never reach the server

    @classmethod
    def check(cls, spec):
        via, point = spec.params.get("via"), spec.trigger.point
        if via == "tmpfs" and point != "start":
            return ("fault.point", "via tmpfs fills the disk when the save starts; the kernel decides the rest",
                    point, "start")
        if spec.params.get("on") == "staging" and via == "tmpfs":
            return ("fault.via", "on: staging counts the bytes written into $TMPDIR; a tmpfs fills the checkpoint "
                    "directory", via, "quota")
        if via == "quota" and point == "start":
            return ("fault.point", "via quota counts bytes per write; say where the error surfaces", point,
                    "write, fsync, close")
        return None

    def needs_interception(self) -> bool:
        return self.spec.params["via"] == "quota"

    def path_matches(self, relative: str) -> bool:
        """``on: staging``: only files staged in the rank's $TMPDIR, ``file`` matched against the
        name under it; ``on: checkpoint`` (default): as every fault."""
        if self.spec.params.get("on") != "staging":
            return super().path_matches(relative)
        return relative.startswith(STAGING_PREFIX) and fnmatchcase(relative[len(STAGING_PREFIX):], self.trigger.file)

    @property
    def budget(self) -> int:
        return self.trigger.after_bytes or 0

    # -- harness side: a real tmpfs ---------------------------------------------------------------
    def setup(self, env: CaseEnvironment) -> None:
        if self.spec.params["via"] != "tmpfs":
            return
        if env.case is None:
            raise FaultUnavailable("disk_full via tmpfs sizes its mount by the case's workload; a user's script "
                                   "has none: use via: quota")
        if os.geteuid() != 0:
            raise FaultUnavailable("disk_full via tmpfs mounts a size-limited tmpfs, which needs root")
        size = _tmpfs_size(env)
        env.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                                 str(env.checkpoint_dir)], capture_output=True, text=True, timeout=30)
        if result.returncode:
            raise FaultUnavailable(f"cannot mount tmpfs on {env.checkpoint_dir}: {result.stderr.strip()}")
        self.mounted = True
        janitor.register("mount", env.checkpoint_dir)

    def heal(self, env: CaseEnvironment) -> None:
        ballast = env.checkpoint_dir / BALLAST_NAME
        if ballast.exists():
            ballast.unlink()

    def teardown(self, env: CaseEnvironment) -> None:
        if not self.mounted:
            return
        result = subprocess.run(["umount", str(env.checkpoint_dir)], capture_output=True, timeout=30)
        if result.returncode:  # a straggler still holds a file: detach now, the kernel frees it later
            subprocess.run(["umount", "-l", str(env.checkpoint_dir)], capture_output=True, timeout=30)
        self.mounted = False
        janitor.release("mount", env.checkpoint_dir)

    # -- rank side --------------------------------------------------------------------------------
    def at(self, phase: ClockPhase, step: int) -> None:
        if self.in_trigger_window() and self.spec.params["via"] == "tmpfs":
            self.fired(point="start", free_bytes=self.budget)
            self._fill(self.env.checkpoint_dir / BALLAST_NAME)

    def _fill(self, ballast: "os.PathLike[str]") -> None:
        """Grow the ballast until ``budget`` bytes are left. Other ranks write meanwhile, so the free
        space can shrink under us: on ENOSPC, measure again and try again."""
        fd = os.open(ballast, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            for _ in range(20):
                stats = os.fstatvfs(fd)
                extra = stats.f_bavail * stats.f_frsize - self.budget
                if extra <= 0:
                    return
                try:
                    os.posix_fallocate(fd, os.fstat(fd).st_size, extra)
                    return
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        finally:
            os.close(fd)

    def wants(self, relative: str) -> bool:
        """Quota mode, on the trigger rank, from the triggering save on, for matching files."""
        if self.spec.params["via"] != "quota" or not self.on_trigger_rank():
            return False
        clock = self.env.clock
        started = clock.step > self.trigger.step or self.in_trigger_window()
        return started and self.path_matches(relative)

    def on_write(self, file: InterceptedFile, data: Any, nbytes: int) -> None:
        if not self.wants(file.relative):
            return
        room = max(0, self.budget - self.used)
        self.used += nbytes
        if nbytes <= room:
            return
        if not self.full:
            self.full = True
            self.fired(point=self.trigger.point, file=file.relative, offset=file.offset + room)
        if self.trigger.point == "write":
            if room:
                file.write_through(data[:room] if isinstance(data, str) else memoryview(data).cast("B")[:room])
                self.used -= nbytes - room
            raise _no_space(file)
        self.cut_at.setdefault(id(file), file.offset + room)

    def on_fsync(self, file: InterceptedFile) -> None:
        if self.trigger.point == "fsync" and self.wants(file.relative):
            self._deferred_error(file)

    def before_close(self, file: InterceptedFile) -> None:
        if self.trigger.point in ("fsync", "close") and self.wants(file.relative):
            self._deferred_error(file)

    def _deferred_error(self, file: InterceptedFile) -> None:
        cut = self.cut_at.pop(id(file), None)
        if cut is not None:
            file.truncate_to(cut)
            raise _no_space(file)


def _tmpfs_size(env: CaseEnvironment) -> int:
    """Room for every checkpoint of the first run plus slack; the ballast decides when it is full."""
    workload = env.case.workload
    state = workload.size_bytes * 3 + (1 << 20)  # parameters + two Adam moments + small state
    per_step = state * max(workload.world_size, env.case.restart.world_size)
    total = per_step * (len(workload.checkpoint_steps) + 1) + (16 << 20)
    return (total + 4095) // 4096 * 4096
