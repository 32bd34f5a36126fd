"""SIGKILL of a rank's own process at an exact point, as a node or process loss does.

Bytes written before the kill stay on disk (the page cache survives a process kill), so a file cut at
``after_bytes`` really is torn there.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Any

from ..interception import InterceptedFile
from .base import Fault


class Kill(Fault):
    """Kill ``rank`` at ``point`` of ``phase`` at ``step``:

    - ``start``: entering the train step (before its all-reduce) or the save (before any file);
    - ``open``: just after the first file matching ``file`` was created (it stays empty);
    - ``write``: once ``after_bytes`` bytes of that file are written (exactly that many stay);
    - ``fsync``: just before fsync of that file;
    - ``close``: just after that file is complete and closed, before the save returns (between files).
    """

    kind = "kill"

    def needs_interception(self) -> bool:
        return self.trigger.point in ("open", "write", "fsync", "close")

    def wants(self, relative: str) -> bool:
        return self.needs_interception() and self.in_trigger_window() and self.path_matches(relative)

    def at(self, phase: str, step: int) -> None:
        if self.trigger.point == "start" and self.in_trigger_window():
            self._kill(None)

    def on_open(self, file: InterceptedFile) -> None:
        if self._armed_for(file, "open"):
            self._kill(file)

    def on_write(self, file: InterceptedFile, data: Any, nbytes: int) -> None:
        if not self._armed_for(file, "write") or file.offset + nbytes <= self.trigger.after_bytes:
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

    def _kill(self, file: InterceptedFile | None, flushed: bool = False) -> None:
        if file is not None and not flushed:
            file.flush_to_os()
        self.fired(point=self.trigger.point, file=file.relative if file else None,
                   offset=file.offset if file else None, ends_process=True)
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)  # SIGKILL is not deliverable late; this only keeps the code honest
